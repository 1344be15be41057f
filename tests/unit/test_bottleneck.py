"""The slow-load line: on a load far below the disk for a sustained window, with the cause the
counters show and the engine's option; never on a fast load, a brief dip or a cached load. The
evidence is checked on a real load: a file faulted in through mmap page by page moves read_bytes
and not rchar; a file read with read() moves both."""
import mmap
import os

import pytest

from ansible_collections.modelwake.serving.plugins.module_utils.readiness import bottleneck

MIB = 1024 * 1024
DISK = 7.0e9  # a PCIe Gen4 NVMe's sequential rate


def test_the_issue_line_for_vllm_faulting_through_mmap():
    line = bottleneck.diagnose(575 * MIB, DISK, "vllm", read_bytes_rate=575 * MIB, rchar_rate=0.2 * MIB,
                               slow_for=60)
    assert line.startswith("loading at 575 MiB/s, 12x below this disk's 7.0 GB/s: page faults through mmap; "
                           "vLLM: --safetensors-load-strategy eager")
    assert line.endswith("or model_service_prefetch: on")


def test_sglang_explicit_reads_and_tensor_parallel_ranks():
    reads = bottleneck.diagnose(300 * MIB, DISK, "sglang", read_bytes_rate=300 * MIB, rchar_rate=300 * MIB,
                                slow_for=60)
    assert "reads too few or too small" in reads and "enable_multithread_load" in reads
    ranks = bottleneck.diagnose(575 * MIB, DISK, "sglang", read_bytes_rate=575 * MIB, rchar_rate=0,
                                slow_for=60, tensor_parallel=8)
    assert "page faults through mmap (each of the 8 ranks faults the same files)" in ranks


@pytest.mark.parametrize("load_rate, slow_for, read_bytes_rate, why", [
    (3000 * MIB, 600, 3000 * MIB, "above a third of the disk: a fast load"),
    (575 * MIB, 10, 575 * MIB, "slow for 10 s only: a pause between shards"),
    (575 * MIB, 600, 1 * MIB, "the bytes do not come from this disk (page cache or network)"),
])
def test_no_line_when_the_disk_is_not_the_bottleneck(load_rate, slow_for, read_bytes_rate, why):
    assert bottleneck.diagnose(load_rate, DISK, "vllm", read_bytes_rate=read_bytes_rate, rchar_rate=0,
                               slow_for=slow_for) is None, why


def test_no_line_without_a_measured_disk_rate():
    assert bottleneck.diagnose(575 * MIB, None, "vllm", slow_for=600) is None


def test_the_window_counts_only_a_sustained_slow_load():
    window = bottleneck.SlowLoadWindow()
    assert window.observe(0.0, 575 * MIB, DISK) == 0.0
    assert window.observe(20.0, 575 * MIB, DISK) == 20.0
    assert window.observe(25.0, 5000 * MIB, DISK) == 0.0  # a fast look resets it
    assert window.observe(30.0, 575 * MIB, DISK) == 0.0
    assert window.observe(65.0, 575 * MIB, DISK) == 35.0
    assert window.observe(70.0, 575 * MIB, None) == 0.0


def io_counters():
    with open("/proc/self/io") as handle:
        return {k: int(v) for k, v in (line.split(":") for line in handle)}


@pytest.fixture
def cold_file(tmp_path):
    path = str(tmp_path / "shard.safetensors")
    with open(path, "wb") as handle:
        handle.write(os.urandom(32 * MIB))
        handle.flush()
        os.fsync(handle.fileno())
        os.posix_fadvise(handle.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    return path


def test_a_real_mmap_load_shows_as_page_faults(cold_file):
    before = io_counters()
    with open(cold_file, "rb") as handle:
        mapped = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
        page = mmap.PAGESIZE
        touched = sum(mapped[offset] for offset in range(0, len(mapped), page))  # one byte per page
        mapped.close()
    after = io_counters()
    read_bytes = after["read_bytes"] - before["read_bytes"]
    rchar = after["rchar"] - before["rchar"]
    if read_bytes == 0:
        pytest.skip("block reads are not accounted here (no task I/O accounting)")
    assert touched >= 0 and read_bytes >= 16 * MIB
    assert bottleneck.cause(read_bytes, rchar) == "mmap"


def test_a_real_read_load_shows_as_reads(cold_file):
    before = io_counters()
    with open(cold_file, "rb") as handle:
        while handle.read(4 * MIB):
            pass
    after = io_counters()
    read_bytes = after["read_bytes"] - before["read_bytes"]
    rchar = after["rchar"] - before["rchar"]
    if read_bytes == 0:
        pytest.skip("block reads are not accounted here (no task I/O accounting)")
    assert rchar >= 32 * MIB
    assert bottleneck.cause(read_bytes, rchar) == "reads"
