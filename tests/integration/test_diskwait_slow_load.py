"""The slow-load line on real loads, on this machine's own disk (no guest).

The disk's cold rate is measured as the preflight measures it (host/storage.py, parallel readers,
verified cold). A real reader process then loads a cold file the way the engines' default loaders
do: through mmap, touching it page by page, paced far below the disk. The wait's real probe and
classifier watch that process by its pid, as wait_for_model_ready does: after 30 s of such a load
its verdicts name it ("loading at 4 MiB/s, ...x below this disk's ...: page faults through mmap;
vLLM: ..."), in the message and in the launcher's STATUS= text. A reader that loads at the disk's
speed, with parallel large reads, never gets the line.
"""
import os
import subprocess
import sys
import textwrap

import pytest

from ansible_collections.modelwake.serving.plugins.module_utils.host import storage
from ansible_collections.modelwake.serving.plugins.module_utils.readiness.config import build_config
from ansible_collections.modelwake.serving.plugins.module_utils.readiness.probe import HostProbe
from ansible_collections.modelwake.serving.plugins.module_utils.readiness.status import format_status
from ansible_collections.modelwake.serving.plugins.module_utils.readiness.waiter import wait_for_ready

pytestmark = pytest.mark.slow

MIB = 1024 * 1024
# Nothing listens there: the wait's HTTP probes are refused, as a loading engine's are.
URL = "http://127.0.0.1:9"

# Faults the file in page by page through a shared read-only mapping, paced to RATE bytes/s: no read()
# of the data at all (rchar stays flat while read_bytes grows), as safetensors' mmap loader does.
MMAP_READER = textwrap.dedent("""
    import mmap, sys, time
    path, rate = sys.argv[1], float(sys.argv[2])
    with open(path, "rb") as handle:
        mapped = mmap.mmap(handle.fileno(), 0, prot=mmap.PROT_READ)
    sys.stdout.write("mapped\\n")
    sys.stdout.flush()
    start = time.monotonic()
    total = 0
    for offset in range(0, len(mapped), mmap.PAGESIZE):
        total += mapped[offset]
        ahead = start + (offset + mmap.PAGESIZE) / rate - time.monotonic()
        if ahead > 0:
            time.sleep(ahead)
    time.sleep(3600)  # loaded: stay, as an engine does, until the test ends it
""")

# Reads the files with four threads of 16 MiB preadv (two ranges of each file, as the preflight's
# measurement does), as a fast loader does, pass after pass for SECONDS; each pass is dropped from
# the page cache first, so every pass reaches the disk.
FAST_READER = textwrap.dedent("""
    import os, sys, threading, time
    seconds, paths = float(sys.argv[1]), sys.argv[2:]
    sys.stdout.write("started\\n")
    sys.stdout.flush()
    end = time.monotonic() + seconds
    def read(path, lo, hi):
        buffer = bytearray(16 * 1024 * 1024)
        fd = os.open(path, os.O_RDONLY)
        offset = lo
        while offset < hi:
            offset += os.preadv(fd, [memoryview(buffer)[:min(len(buffer), hi - offset)]], offset)
        os.close(fd)
    ranges = []
    for path in paths:
        half = os.path.getsize(path) // 2
        ranges += [(path, 0, half), (path, half, 2 * half)]
    while time.monotonic() < end:
        for path in paths:
            fd = os.open(path, os.O_RDONLY)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)
        threads = [threading.Thread(target=read, args=one) for one in ranges]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    time.sleep(3600)
""")


def cold_file(path, size):
    """A file of random bytes on disk (synced: clean pages, which DONTNEED drops) and out of the cache."""
    with open(path, "wb") as handle:
        for _ in range(size // MIB):
            handle.write(os.urandom(MIB))
        handle.flush()
        os.fsync(handle.fileno())
        os.posix_fadvise(handle.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    if storage.resident_bytes(str(path)) > size // 10:
        pytest.skip("this filesystem keeps clean pages after DONTNEED (tmpfs?): no cold load possible here")
    return str(path)


@pytest.fixture(scope="module")
def disk(tmp_path_factory):
    """Two cold 256 MiB files and the disk's cold rate measured on them as the preflight does."""
    root = tmp_path_factory.mktemp("disk")
    files = [cold_file(root / ("model-%05d-of-00002.safetensors" % (i + 1)), 256 * MIB) for i in range(2)]
    measured = storage.measure_read_rate([(f, os.path.getsize(f)) for f in files], sample_bytes=512 * MIB)
    assert measured["cold"], measured["how"]
    return files, measured["rate_bytes_per_s"]


def watch(command, disk_rate, seconds, poll):
    """Start the reader, wait until it is about to read, watch it `seconds` with the real probe and
    classifier (pid mode, no log: reads alone say loading); return [(t, verdict)] and the process."""
    proc = subprocess.Popen([sys.executable, "-c"] + command, stdout=subprocess.PIPE, universal_newlines=True)
    try:
        proc.stdout.readline()  # its interpreter has started: what it reads from now on is the load
        config = build_config({"url": URL, "pid": proc.pid, "engine": "vllm", "timeout": seconds,
                               "stall_timeout": 600, "poll_interval": poll, "py_spy": "off",
                               "completion_timeout": 1, "disk_read_rate": int(disk_rate)})
        verdicts = []
        wait_for_ready(config, HostProbe(config), on_snapshot=lambda snap, verdict: verdicts.append((snap.t, verdict)))
        return verdicts
    finally:
        proc.kill()
        proc.wait()


def test_a_load_faulting_pages_through_mmap_is_named_with_its_cause(disk):
    files, disk_rate = disk
    verdicts = watch([MMAP_READER, files[0], str(4 * MIB)], disk_rate, seconds=48, poll=2)
    loading = [(t, v) for t, v in verdicts if v.phase == "loading"]
    assert loading, [(t, v.phase, v.msg) for t, v in verdicts]
    began = loading[0][0]
    # Not before the load has been slow for 30 s: a pause between shards never earns the line.
    assert all(v.bottleneck == "" for t, v in loading if t - began < 29), [(t, v.bottleneck) for t, v in loading]
    named = [(t, v) for t, v in loading if v.bottleneck]
    assert named, "never named: %s" % [(t, v.read_rate) for t, v in loading]
    t, verdict = named[-1]
    line = verdict.bottleneck
    assert line.startswith("loading at ") and " below this disk's " in line, line
    assert ": page faults through mmap; vLLM: --safetensors-load-strategy eager" in line, line
    assert line.endswith("or model_service_prefetch: on"), line
    # The rate it names is the reader's pace, far below the disk's measured one.
    named_rate = float(line.split("loading at ")[1].split(" MiB/s")[0])
    assert 2 <= named_rate <= 6, line
    assert disk_rate > 3 * named_rate * MIB
    assert verdict.msg.endswith("; " + line)
    status = format_status(verdict, t)
    assert status.startswith("loading") and " below this disk's " in status and "page faults through mmap" in status


def test_a_load_at_the_disk_s_speed_is_never_named(disk):
    files, disk_rate = disk
    verdicts = watch([FAST_READER, "8"] + files, disk_rate, seconds=6, poll=0.5)
    loading = [v for _t, v in verdicts if v.phase == "loading"]
    assert len(loading) >= 3, [(t, v.phase, v.msg) for t, v in verdicts]
    assert all(v.bottleneck == "" and " below this disk" not in v.msg for _t, v in verdicts)
    # Not slow at all, rather than not slow for long enough: its rate is that of the disk.
    rates = [v.read_rate for v in loading if v.read_rate]
    assert max(rates) > disk_rate / 3, (rates, disk_rate)
