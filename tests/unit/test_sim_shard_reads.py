"""The simulator's `--shard-reads`, on real files: the ranks' load_weights runs in forked rank
processes (one each, at once, as the engine starts them) and each reports its own /proc/self/io.

slice (the default): each rank reads its 1/tp of every shard after dropping it from the page cache
(DONTNEED; pages a prefetch read moments before were seen to survive it in part here, so how much
of a prefetch it undoes varies). every-rank: each rank reads every shard whole through the page
cache, as a real engine's TP ranks do: the ranks share the cache and a prefetch's pages are used.
--read-mode mmap faults the pages in through a mapping instead of pread.
"""
import json
import os

import pytest

from modelwake_sim import __main__ as cli  # engines/sim: on sys.path by pytest.ini
from modelwake_sim import model, ranks
from ansible_collections.modelwake.serving.plugins.module_utils.host import storage

MIB = 1024 * 1024
TP = 4
MODEL_MIB = 32


def io_counters():
    with open("/proc/self/io") as handle:
        return {k: int(v) for k, v in (line.split(":") for line in handle)}


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("model"))
    model.make_model(directory, MODEL_MIB, 4, "none")
    paths = ranks.shard_paths(directory)
    for path in paths:  # written pages are dirty until synced, and DONTNEED keeps dirty pages
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    return paths


def tensor_bytes(paths):
    """The shards' data sections: what a rank reads after each header."""
    total = 0
    for path in paths:
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            total += size - ranks.safetensors.read_header(handle, size)[1]
    return total


def drop(paths):
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    return sum(storage.resident_bytes(path) for path in paths)


def prefetch(paths):
    for path in paths:
        with open(path, "rb") as handle:
            while handle.read(4 * MIB):
                pass
    return sum(storage.resident_bytes(path) for path in paths)


def serve_options(*extra):
    return cli.build_parser().parse_args(["serve", "--engine", "vllm", "--model-path", "/unused", "--tp", str(TP),
                                          "--load-rate-mib", "1000000"] + list(extra))


def load_in_ranks(opts, paths):
    """Every rank's load_weights at once, each in its own forked process: [{rchar, read_bytes}]."""
    children = []
    for rank in range(opts.tp):
        reader, writer = os.pipe()
        pid = os.fork()
        if pid == 0:  # the rank: no Rank.__init__ (it would retitle and re-signal this test's process)
            code = 1
            try:
                os.close(reader)
                worker = ranks.Rank.__new__(ranks.Rank)
                worker.opts, worker.rank, worker.parent, worker.holder = opts, rank, os.getppid(), None
                worker.memory, worker.util, worker.last_holder, worker.children = 0.0, 0, 0.0, []
                before = io_counters()
                worker.load_weights(paths, "Loading safetensors checkpoint shards", show_bar=False)
                after = io_counters()
                os.write(writer, json.dumps({k: after[k] - before[k] for k in ("rchar", "read_bytes")}).encode())
                code = 0
            finally:
                os._exit(code)
        os.close(writer)
        children.append((pid, reader))
    results = []
    for pid, reader in children:
        with os.fdopen(reader, "rb") as handle:
            data = handle.read()
        assert os.waitpid(pid, 0)[1] == 0, "a rank failed"
        results.append(json.loads(data.decode()))
    return results


def test_slice_is_the_default_and_each_rank_reads_its_share_from_the_disk(shards):
    opts = serve_options()
    assert opts.shard_reads == "slice"
    data = tensor_bytes(shards)
    assert drop(shards) < data / 10  # cold
    got = load_in_ranks(opts, shards)
    for rank in got:
        assert data / TP - MIB <= rank["rchar"] <= data / TP + MIB, got
    reads = [rank["read_bytes"] for rank in got]
    if sum(reads):  # with task I/O accounting (readahead past a slice's end can add to it)
        assert sum(reads) >= 0.9 * data, got


def test_every_rank_reads_the_whole_model_and_the_cache_keeps_it(shards):
    opts = serve_options("--shard-reads", "every-rank")
    data = tensor_bytes(shards)
    total = sum(os.path.getsize(path) for path in shards)
    assert drop(shards) < total / 10  # cold
    got = load_in_ranks(opts, shards)
    for rank in got:
        assert data <= rank["rchar"] <= total + MIB, got
    # Nothing dropped: the page cache holds the model, shared by the ranks, so the disk was read
    # about once, not once per rank (read_bytes is charged to whichever rank faulted a page in).
    assert sum(storage.resident_bytes(path) for path in shards) >= 0.95 * total
    assert sum(rank["read_bytes"] for rank in got) <= 1.5 * total, got


def test_every_rank_after_a_prefetch_reads_the_cache_not_the_disk(shards):
    opts = serve_options("--shard-reads", "every-rank")
    data = tensor_bytes(shards)
    total = sum(os.path.getsize(path) for path in shards)
    assert drop(shards) < total / 10
    assert prefetch(shards) >= 0.95 * total
    got = load_in_ranks(opts, shards)
    for rank in got:
        assert data <= rank["rchar"] <= total + MIB, got
        assert rank["read_bytes"] < MIB, got  # the prefetch's pages were used, none dropped


def test_mmap_reads_fault_the_pages_in_without_read_calls(shards):
    """--read-mode mmap, as the engines' default loader: the pages come in through the mapping,
    so rchar stays at the headers' reads while the cache fills (and read_bytes grows)."""
    opts = serve_options("--shard-reads", "every-rank", "--read-mode", "mmap")
    assert serve_options().read_mode == "pread"
    total = sum(os.path.getsize(path) for path in shards)
    assert drop(shards) < total / 10
    got = load_in_ranks(opts, shards)
    for rank in got:
        assert rank["rchar"] < MIB, got
    assert sum(storage.resident_bytes(path) for path in shards) >= 0.95 * total
    reads = sum(rank["read_bytes"] for rank in got)
    if reads:  # with task I/O accounting
        assert 0.9 * tensor_bytes(shards) <= reads <= 1.5 * total, got


def test_every_rank_is_paced_at_the_whole_rate_per_rank(shards):
    """--load-rate-mib stays the load's rate: each rank reads the whole model at it, so a load
    takes model / rate in both modes (here 32 MiB at 32 MiB/s: about a second; paced at rate/tp,
    every-rank would take tp times as long)."""
    import time
    seconds = {}
    for mode in ("slice", "every-rank"):
        opts = serve_options("--load-rate-mib", "32", "--shard-reads", mode)
        prefetch(shards)
        began = time.monotonic()
        load_in_ranks(opts, shards)
        seconds[mode] = time.monotonic() - began
    assert min(seconds.values()) >= 0.9, seconds
    assert seconds["every-rank"] < 2 * seconds["slice"], seconds
