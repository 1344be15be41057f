"""The slow-load line in the classifier's verdicts, on the K2.6 trace (575 MiB/s for 15 minutes): said
while loading runs far below the disk's measured rate for long enough, with the cause the counters
show, and gone once loading ends; never without a measured rate or on a load near the disk's speed."""
import pytest

from ansible_collections.modelwake.serving.plugins.module_utils.common.errors import InputError
from ansible_collections.modelwake.serving.plugins.module_utils.readiness.config import build_config

from tests.helpers.traces import K26_EXPECTED_BYTES, MIB, config, k26_start, replay

NVME = 7.0e9  # a PCIe Gen4 NVMe's sequential rate, as the preflight would measure it


def with_rchar(snapshots, rate=None):
    """The trace's looks with the tree's rchar: flat (rate None: an mmap load, no read() calls) or
    growing at `rate` bytes/s (explicit reads)."""
    start = None
    for snap in snapshots:
        start = snap.t if start is None else start
        snap.process.rchar = 4 * MIB + int((rate or 0) * (snap.t - start))
        yield snap


def test_a_k26_load_through_mmap_is_named_after_30_s_and_only_while_loading():
    cfg = config(engine="sglang", stall_timeout=300, poll_interval=10, expected_bytes=K26_EXPECTED_BYTES,
                 disk_rate=NVME, tensor_parallel=8)
    by_t = dict(replay(cfg, with_rchar(k26_start())))
    assert by_t[20].phase == "loading" and by_t[20].bottleneck == ""
    assert by_t[40].bottleneck == ""  # slow for 20 s: could be a pause between shards
    line = by_t[500].bottleneck
    assert line == ("loading at 575 MiB/s, 12x below this disk's 7.0 GB/s: page faults through mmap (each of the 8 "
                    "ranks faults the same files); SGLang: --model-loader-extra-config "
                    "'{\"enable_multithread_load\": true}'; or model_service_prefetch: on")
    assert by_t[500].msg.endswith("; " + line)
    assert by_t[1100].phase == "initializing" and by_t[1100].bottleneck == ""
    assert "below this disk" not in by_t[1100].msg


def test_explicit_reads_name_another_cause():
    cfg = config(engine="vllm", poll_interval=10, disk_rate=NVME)
    by_t = dict(replay(cfg, with_rchar(k26_start(), rate=575 * MIB)))
    assert "reads too few or too small to fill the device; vLLM: --model-loader-extra-config" in by_t[500].bottleneck


@pytest.mark.parametrize("disk_rate, why", [
    (None, "no measured rate: nothing to compare with"),
    (1.5e9, "575 MiB/s is more than a third of a 1.5 GB/s disk: the disk is near its limit"),
])
def test_no_line(disk_rate, why):
    cfg = config(engine="sglang", poll_interval=10, expected_bytes=K26_EXPECTED_BYTES, disk_rate=disk_rate)
    assert all(verdict.bottleneck == "" for _t, verdict in replay(cfg, with_rchar(k26_start()))), why


def test_reads_from_the_page_cache_are_not_the_disk_s_slowness():
    """rchar at the disk's full speed, read_bytes at 575 MiB/s: most bytes come from the cache."""
    cfg = config(engine="vllm", poll_interval=10, disk_rate=NVME)
    verdicts = replay(cfg, with_rchar(k26_start(), rate=6000 * MIB))
    assert all(verdict.bottleneck == "" for _t, verdict in verdicts)


@pytest.mark.parametrize("params, field", [
    ({"disk_read_rate": -1}, "disk_read_rate"),
    ({"tensor_parallel": 0}, "tensor_parallel"),
])
def test_bad_rates_and_sizes_are_refused(params, field):
    with pytest.raises(InputError) as caught:
        build_config(dict({"url": "http://127.0.0.1:30001", "pid": 1}, **params))
    assert caught.value.field == field


def test_a_rate_of_0_is_not_measured():
    base = {"url": "http://127.0.0.1:30001", "pid": 1}
    assert build_config(dict(base, disk_read_rate=0)).disk_rate is None
    measured = build_config(dict(base, disk_read_rate=3400000000, tensor_parallel=8))
    assert (measured.disk_rate, measured.tensor_parallel) == (3400000000, 8)
