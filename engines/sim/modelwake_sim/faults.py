"""Fault injection (`--fault KIND:PHASE`, `--fault-after S`) and the exceptions each phase raises."""

KINDS = ("crash1", "crash0", "hang", "spin", "rankdeath", "rankkill")
# Faults where only the last rank dies and the others wait for it in a collective.
RANK_DEATHS = ("rankdeath", "rankkill")
PHASES = ("starting", "loading", "initializing", "warmup", "ready")


class FaultError(Exception):
    """Bad --fault value; the message says how to write it."""


class Fault:
    """A fault to inject: `kind` in KINDS, `phase` in PHASES, `after` seconds into that phase."""

    def __init__(self, kind, phase, after=0.0):
        self.kind = kind
        self.phase = phase
        self.after = after

    @classmethod
    def parse(cls, text, after=0.0):
        """`crash1:loading` -> Fault; None for an empty value."""
        if not text:
            return None
        kind, sep, phase = text.partition(":")
        if not sep or kind not in KINDS or phase not in PHASES:
            raise FaultError("--fault must be KIND:PHASE with KIND one of %s and PHASE one of %s (got %r)"
                             % ("|".join(KINDS), "|".join(PHASES), text))
        if after < 0:
            raise FaultError("--fault-after must be 0 or more seconds (got %s)" % after)
        return cls(kind, phase, after)

    def due(self, phase, elapsed, phase_over=False):
        """True when the fault fires now: in its phase, `after` seconds in (or when the phase ends first)."""
        return phase == self.phase and (elapsed >= self.after or phase_over)


# The root cause each phase dies of with crash1: (frames, exception line). The starting one is the
# K2.6 story's broken environment (compressed-tensors too old for the checkpoint's format).
CRASH_CAUSES = {
    "starting": (
        [("/opt/modelwake/venv/lib/python3.11/site-packages/compressed_tensors/quantization/quant_scheme.py",
          118, "validate_model_after", "format = CompressionFormat.nvfp4_pack_quantized")],
        "AttributeError: type object 'CompressionFormat' has no attribute 'nvfp4_pack_quantized'"),
    "loading": (
        [("/opt/modelwake/venv/lib/python3.11/site-packages/torch/nn/parameter.py",
          46, "__new__", "return torch.Tensor._make_subclass(cls, data, requires_grad)")],
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.50 GiB. GPU 0 has a total capacity "
        "of 95.59 GiB of which 1.02 GiB is free. Including non-PyTorch memory, this process has 94.56 GiB memory in use."),
    "initializing": (
        [("/opt/modelwake/venv/lib/python3.11/site-packages/torch/cuda/__init__.py",
          1001, "synchronize", "return torch._C._cuda_synchronize()")],
        "RuntimeError: CUDA error: an illegal memory access was encountered"),
    "warmup": (
        [("/opt/modelwake/venv/lib/python3.11/site-packages/torch/_inductor/codecache.py",
          2087, "compile_file", "raise exc.CppCompileError(cmd, output) from e")],
        "torch._inductor.exc.InductorError: CppCompileError: C++ compile error"),
    "ready": (
        [("/opt/modelwake/venv/lib/python3.11/site-packages/torch/cuda/__init__.py",
          1001, "synchronize", "return torch._C._cuda_synchronize()")],
        "RuntimeError: CUDA error: an illegal memory access was encountered"),
}
