"""Fault injection (`--fault KIND:PHASE`, `--fault-after S`), the exceptions each phase raises, and
the record of what the simulator did on purpose (`--churn-record`: churn.py's children, a fault's kill)."""
import json
import os
import signal
import time

KINDS = ("crash1", "crash0", "hang", "spin", "rankdeath", "rankkill", "rankreap")
# Faults where only the last rank dies and the others wait for it in a collective.
RANK_DEATHS = ("rankdeath", "rankkill", "rankreap")
# The rank is SIGKILLed (no word in the log): rankkill leaves it a zombie, rankreap's launcher reaps
# it at once, so that no exit status is left to read.
RANK_KILLS = ("rankkill", "rankreap")
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


def record(path, **fields):
    """One JSON line in the --churn-record file (nothing without one): the ground truth a test or the
    bench checks a start against. `t` is the wall clock (time.time()), the bench's clock for true
    events. One write with O_APPEND, so the lines of several processes never interleave."""
    if not path:
        return
    fields.setdefault("t", round(time.time(), 3))
    line = (json.dumps(fields, sort_keys=True) + "\n").encode("utf-8")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def ended(status):
    """How a child ended, from waitpid's status: `exit 0`, `signal 15 (SIGTERM)`."""
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        return "signal %d (%s)" % (number, signal.Signals(number).name)
    return "exit %d" % os.WEXITSTATUS(status)


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
