"""The storage measurement on real files: a cold read recognised as cold, a warm one as warm (with
its reason), the page cache's share by mincore, and MemAvailable against the model's size."""
import os

import pytest

from ansible_collections.modelwake.serving.plugins.module_utils.host import storage

MIB = 1024 * 1024


def write_file(path, size, sync=True):
    """A file of random bytes; synced (clean pages, which DONTNEED can drop) unless sync is False."""
    with open(path, "wb") as handle:
        for _ in range(size // MIB):
            handle.write(os.urandom(MIB))
        handle.flush()
        if sync:
            os.fsync(handle.fileno())
    return str(path)


def drop(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def read_all(path):
    with open(path, "rb") as handle:
        while handle.read(16 * MIB):
            pass


@pytest.fixture
def shards(tmp_path):
    paths = [write_file(tmp_path / ("model-%05d-of-00002.safetensors" % (i + 1)), 64 * MIB) for i in range(2)]
    for path in paths:
        drop(path)
    if any(storage.resident_bytes(path) for path in paths):
        pytest.skip("this filesystem keeps clean pages after DONTNEED (tmpfs?): no cold read possible here")
    return [(path, os.path.getsize(path)) for path in paths]


def test_a_dropped_sample_is_read_cold_and_left_out_of_the_cache(shards):
    for path, _ in shards:
        read_all(path)  # warm it first: the measurement must drop it itself
    assert all(storage.resident_bytes(path) == size for path, size in shards)
    result = storage.measure_read_rate(shards, sample_bytes=128 * MIB, readers=4)
    assert result["cold"] is True, result["how"]
    assert result["how"].startswith("cold:")
    assert result["resident_before_bytes"] == 0
    assert result["sampled_bytes"] == 128 * MIB
    assert result["readers"] == 4  # two ranges of each shard
    assert result["rate_bytes_per_s"] == result["sampled_bytes"] / result["seconds"]
    # The sample does not stay in memory at the engine's expense.
    assert sum(storage.resident_bytes(path) for path, _ in shards) == 0


def test_a_cached_sample_is_reported_warm_by_mincore(shards):
    for path, _ in shards:
        read_all(path)
    share = storage.page_cache_share([path for path, _ in shards])
    assert share["fraction"] == 1.0 and share["complete"] and share["resident_bytes"] == 128 * MIB
    result = storage.measure_read_rate(shards, sample_bytes=128 * MIB, readers=2, drop_first=False)
    assert result["cold"] is False
    assert "warm: 100% of the sample was in the page cache" in result["how"]


def test_dirty_pages_that_survive_the_drop_make_the_result_warm_with_the_reason(tmp_path, shards):
    # Written and not synced: DONTNEED cannot drop dirty pages, exactly the demo's freshly made model.
    path = write_file(tmp_path / "fresh.safetensors", 64 * MIB, sync=False)
    result = storage.measure_read_rate([(path, 64 * MIB)], sample_bytes=64 * MIB, readers=1)
    if result["cold"]:
        pytest.skip("the kernel wrote the pages back before the drop (dirty_expire): nothing dirty to see")
    assert "stayed in the page cache after posix_fadvise(DONTNEED)" in result["how"]
    assert "dirty pages" in result["how"]


def test_the_share_of_a_half_cached_file_and_a_time_limit(shards):
    (first, size), (second, _) = shards
    with open(first, "rb") as handle:
        handle.read(32 * MIB)
    one = storage.page_cache_share([first])
    # Readahead may take a little more than was read, never less.
    assert 32 * MIB <= one["resident_bytes"] < size
    ticks = iter([0.0, 0.0, 100.0, 100.0])
    bounded = storage.page_cache_share([first, second], time_limit=1.0, clock=lambda: next(ticks))
    assert bounded["complete"] is False and bounded["checked_bytes"] == size
    assert bounded["total_bytes"] == 2 * size


def test_a_missing_shard_is_named():
    share = storage.page_cache_share(["/nonexistent/model-00001.safetensors"])
    assert share["fraction"] is None and "model-00001.safetensors" in share["error"]


def test_plan_sample_gives_each_reader_its_own_shard_or_range():
    files = [("a", 4 * MIB * 16), ("b", 4 * MIB * 16), ("c", 1 * MIB)]
    ranges = storage.plan_sample(files, 64 * MIB, 2, block=16 * MIB)
    assert ranges == [("a", 0, 32 * MIB), ("b", 0, 32 * MIB)]
    one = storage.plan_sample([("a", 64 * MIB)], 1024 * MIB, 4, block=16 * MIB)
    assert one == [("a", i * 16 * MIB, 16 * MIB) for i in range(4)]
    assert storage.plan_sample([("empty", 0)], 64 * MIB, 4) == []


def test_memory_against_the_model_from_meminfo(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       2113929216 kB\nMemFree:        1000 kB\n"
                       "MemAvailable:   1000000000 kB\nCached:         5 kB\nHugePages_Total:       0\n")
    found = storage.memory_for_model(548 * 10**9, str(meminfo))
    assert found["mem_available_bytes"] == 1000000000 * 1024
    assert found["mem_total_bytes"] == 2113929216 * 1024
    assert found["holds_model_fraction"] == pytest.approx(1000000000 * 1024 / 548e9)
    assert storage.read_meminfo(str(meminfo))["HugePages_Total"] == 0


def test_model_files_lists_the_shards_only(tmp_path):
    write_file(tmp_path / "b.safetensors", MIB)
    write_file(tmp_path / "a.safetensors", 2 * MIB)
    (tmp_path / "config.json").write_text("{}")
    assert storage.model_files(str(tmp_path)) == [
        (str(tmp_path / "a.safetensors"), 2 * MIB), (str(tmp_path / "b.safetensors"), MIB)]


def test_many_small_shards_make_a_sample_of_many_ranges():
    """64 shards of 32 MiB (the demo's model) and 4 readers: the 2 GiB sample is every shard, not
    the first four (a 128 MiB sample, mostly the threads' start-up)."""
    files = [("model-%05d" % i, 32 * MIB) for i in range(64)]
    ranges = storage.plan_sample(files, 2048 * MIB, 4, block=16 * MIB)
    assert len(ranges) == 64 and sum(r[2] for r in ranges) == 2048 * MIB
    assert sorted(r[0] for r in ranges) == sorted(f[0] for f in files)
    capped = storage.plan_sample(files, 100 * MIB, 4, block=16 * MIB)
    assert [r[2] for r in capped] == [16 * MIB] * 6 + [4 * MIB]  # a reader's share of each shard at most


def test_a_sample_of_many_shards_is_read_whole_by_a_few_readers(tmp_path):
    paths = [write_file(tmp_path / ("model-%05d-of-00012.safetensors" % (i + 1)), 4 * MIB) for i in range(12)]
    result = storage.measure_read_rate([(p, 4 * MIB) for p in paths], sample_bytes=64 * MIB, readers=4, block=MIB)
    assert result["sampled_bytes"] == 48 * MIB and result["readers"] == 4
