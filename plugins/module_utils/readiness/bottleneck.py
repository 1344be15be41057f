"""Is the load far slower than the disk under it, and why? One line for the operator, or None.

Pure: no I/O, no clock. The wait gives it the live load rate (the classifier's read rate), the
disk's measured cold rate (storage.measure_read_rate, kept by the preflight), the engine and the
counters' evidence; `SlowLoadWindow` remembers since when the load has been slow, from the looks'
own times, so one slow look (a pause between shards) never earns the message.

The cause comes from the counters (field-notes section 4):
- block reads (`read_bytes`) grow while the read() calls (`rchar`) barely move: the engine's
  loader faults the safetensors in through mmap, page by page (safetensors' default, and vLLM's
  and SGLang's default loaders); every tensor-parallel rank faults the same files.
- both grow together: explicit reads, but too few or too small to fill the device.

What to try, per engine (vLLM's checked against the vLLM CPU build the project tests with, 0.32.0:
vllm/config/load.py and vllm/model_executor/model_loader/):
- vLLM `LoadConfig` (docs.vllm.ai/en/latest/api/vllm/config/load/): `--safetensors-load-strategy`
  (unset or `lazy`: the mmap path; `eager` reads each file whole into memory first; `prefetch`
  reads the files into the page cache before the workers load them; `torchao`),
  `--load-format fastsafetensors` (pip package fastsafetensors; parallel reads, no mmap:
  pypi.org/project/fastsafetensors) and `--load-format runai_streamer` (Run:ai Model Streamer),
  `--model-loader-extra-config '{"enable_multithread_load": true, "num_threads": 8}'` (the default
  loader's thread pool; vllm/model_executor/model_loader/default_loader.py reads that key).
- SGLang (docs.sglang.io/docs/advanced_features/model_loading): `--load-format` (auto, safetensors,
  ..., runai_streamer for object storage) and `--model-loader-extra-config` with
  `enable_multithread_load` for the multithreaded safetensors loader.
Whichever the engine: `model_service_prefetch: on` reads the model into the page cache at the
disk's speed before the engine starts, so every rank's faults are served from memory.
"""
import re

from ..common.units import MIB

# The load is "far below" the disk under this fraction of the disk's rate...
SLOW_FRACTION = 1.0 / 3.0
# ...for at least this long (seconds of the looks' own clock).
SUSTAINED_SECONDS = 30.0
# rchar growing by less than this fraction of read_bytes: the bytes came in by page faults.
MMAP_RCHAR_FRACTION = 0.10
# Block reads under this fraction of the load rate: the bytes come from the page cache or the
# network, not from this disk, so the disk's rate is not the yardstick.
FROM_DISK_FRACTION = 0.5


ADVICE = {
    ("vllm", "mmap"): "vLLM: --safetensors-load-strategy eager (or --load-format fastsafetensors)",
    ("vllm", "reads"): "vLLM: --model-loader-extra-config '{\"enable_multithread_load\": true, \"num_threads\": 8}'",
    ("sglang", "mmap"): "SGLang: --model-loader-extra-config '{\"enable_multithread_load\": true}'",
    ("sglang", "reads"): "SGLang: --model-loader-extra-config '{\"enable_multithread_load\": true, \"num_threads\": 8}'",
}
CAUSES = {
    "mmap": "page faults through mmap",
    "reads": "reads too few or too small to fill the device",
}
PREFETCH_ADVICE = "or model_service_prefetch: on"


def _disk_rate_words(rate):
    """Disk rates the way drives are sold: decimal GB/s from 1 GB/s, else MB/s."""
    if rate >= 1e9:
        return "%.1f GB/s" % (rate / 1e9)
    return "%.0f MB/s" % (rate / 1e6)


def cause(read_bytes_rate, rchar_rate):
    """'mmap', 'reads' or None (no evidence either way) from the counters' rates in bytes/s."""
    if read_bytes_rate is None or rchar_rate is None or read_bytes_rate <= 0:
        return None
    if rchar_rate < MMAP_RCHAR_FRACTION * read_bytes_rate:
        return "mmap"
    return "reads"


def diagnose(load_rate, disk_rate, engine, read_bytes_rate=None, rchar_rate=None, slow_for=0.0,
             tensor_parallel=1):
    """The bottleneck line, or None when the load is not far below the disk for long enough.

    load_rate, disk_rate, read_bytes_rate, rchar_rate: bytes/s; slow_for: seconds the load has been
    slow (SlowLoadWindow). No message without a measured disk rate or a load rate, nor when the
    block reads are almost nil (the bytes come from the cache or the network: the disk is not the
    bottleneck).
    """
    if not disk_rate or load_rate is None or load_rate < 0:
        return None
    if load_rate >= SLOW_FRACTION * disk_rate or slow_for < SUSTAINED_SECONDS:
        return None
    if read_bytes_rate is not None and read_bytes_rate < FROM_DISK_FRACTION * load_rate:
        return None
    times = disk_rate / load_rate if load_rate > 0 else None
    line = "loading at %.0f MiB/s, %s below this disk's %s" % (
        load_rate / MIB, ("%.0fx" % times) if times else "far", _disk_rate_words(disk_rate))
    why = cause(read_bytes_rate, rchar_rate)
    if why:
        line += ": " + CAUSES[why]
        if why == "mmap" and tensor_parallel > 1:
            line += " (each of the %d ranks faults the same files)" % tensor_parallel
    advice = ADVICE.get((engine, why or "mmap"))
    line += "; " + (advice + "; " + PREFETCH_ADVICE if advice else "try model_service_prefetch: on")
    return line


class SlowLoadWindow(object):
    """Since when the load has run below SLOW_FRACTION of the disk, from the looks' times."""

    def __init__(self):
        self.since = None

    def observe(self, t, load_rate, disk_rate):
        """Seconds the load has been slow as of this look at time t (0.0 when it is not)."""
        if not disk_rate or load_rate is None or load_rate >= SLOW_FRACTION * disk_rate:
            self.since = None
            return 0.0
        if self.since is None:
            self.since = t
        return t - self.since


# What for_status() leaves out: the lead that repeats the rate, and the notes in parentheses.
_STATUS_LEAD = re.compile(r"^loading at [^,]*, ")
_STATUS_NOTE = re.compile(r" \([^()]*\)")


def for_status(line):
    """The line as the launcher's one-line STATUS= can hold it, beside the rate it already shows:
    `12x below this disk's 7.0 GB/s: page faults through mmap; vLLM: --safetensors-load-strategy
    eager; or model_service_prefetch: on`."""
    if not line:
        return ""
    return _STATUS_NOTE.sub("", _STATUS_LEAD.sub("", line))
