"""The prefetch on a real model directory: every byte read into the page cache, progress with rate
and ETA, a read error naming the shard, nothing written; and the `auto` rule's two refusals."""
import errno
import hashlib
import os

import pytest

from ansible_collections.modelwake.serving.plugins.module_utils.host import prefetch, storage

MIB = 1024 * 1024
GIB = 1024 * MIB


@pytest.fixture
def model(tmp_path):
    files = []
    for i in range(3):
        path = str(tmp_path / ("model-%05d-of-00003.safetensors" % (i + 1)))
        with open(path, "wb") as handle:
            handle.write(os.urandom((40 + 8 * i) * MIB + 123))  # not a whole number of blocks
            handle.flush()
            os.fsync(handle.fileno())
            os.posix_fadvise(handle.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        files.append((path, os.path.getsize(path)))
    return files


def digest(path):
    with open(path, "rb") as handle:
        return hashlib.sha256(handle.read()).hexdigest(), os.stat(path).st_mtime_ns


def test_every_byte_is_read_into_the_cache_with_progress(model):
    before = [digest(path) for path, _ in model]
    reports = []
    for path, _ in model:  # the hash read them: start from a cold cache again
        fd = os.open(path, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
    total = sum(size for _, size in model)
    result = prefetch.prefetch(model, readers=3, piece=16 * MIB, progress=reports.append, progress_interval=0.001)
    assert result["bytes"] == total and result["files"] == 3
    assert result["rate_bytes_per_s"] > 0
    assert reports[-1]["bytes"] == total and reports[-1]["fraction"] == 1.0 and reports[-1]["eta_seconds"] == 0
    assert [r["bytes"] for r in reports] == sorted(r["bytes"] for r in reports)  # never goes back
    assert "prefetch" in prefetch.progress_line(reports[-1]) and "100%" in prefetch.progress_line(reports[-1])
    share = storage.page_cache_share([path for path, _ in model])
    if share["fraction"] is not None:
        assert share["resident_bytes"] == total
    assert [digest(path) for path, _ in model] == before  # nothing written


def test_a_shard_that_is_a_directory_is_named(model, tmp_path):
    broken = str(tmp_path / "model-00004-of-00004.safetensors")
    os.mkdir(broken)
    with pytest.raises(prefetch.PrefetchError) as caught:
        prefetch.prefetch(model + [(broken, 64 * MIB)], readers=2, piece=16 * MIB)
    assert str(caught.value).startswith("model-00004-of-00004.safetensors: read error")


def test_an_unreadable_shard_is_named(model):
    path, size = model[1]
    if os.geteuid() == 0:
        pytest.skip("root reads a mode-000 file")
    os.chmod(path, 0)
    with pytest.raises(prefetch.PrefetchError) as caught:
        prefetch.prefetch(model, readers=2, piece=16 * MIB)
    assert "model-00002-of-00003.safetensors: cannot open" in str(caught.value)


def test_an_io_error_names_the_shard_and_the_byte(model):
    victim = model[0][0]

    def failing_disk(fd, buffers, offset):
        if os.readlink("/proc/self/fd/%d" % fd) == victim and offset == 4 * MIB:
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        return os.preadv(fd, buffers, offset)

    with pytest.raises(prefetch.PrefetchError) as caught:
        prefetch.prefetch(model, readers=2, piece=16 * MIB, block=4 * MIB, preadv=failing_disk)
    assert str(caught.value) == ("model-00001-of-00003.safetensors: read error at byte %d (%s)"
                                 % (4 * MIB, os.strerror(errno.EIO)))


def test_a_shard_cut_short_while_read_is_named(model):
    victim = model[2][0]

    def short_reader(fd, buffers, offset):
        # The shard's first piece meets its end at 8 MiB: a copy cut short under the reader.
        if os.readlink("/proc/self/fd/%d" % fd) == victim and 8 * MIB <= offset < 16 * MIB:
            return 0
        return os.preadv(fd, buffers, offset)

    with pytest.raises(prefetch.PrefetchError) as caught:
        prefetch.prefetch(model, readers=2, piece=16 * MIB, block=4 * MIB, preadv=short_reader)
    assert str(caught.value) == ("model-00003-of-00003.safetensors: ended at byte %d, expected %d: "
                                 "truncated while reading" % (8 * MIB, 16 * MIB))


def test_auto_declines_when_memory_is_short():
    go, why = prefetch.auto_decision(548 * GIB, 600 * GIB, 0)
    assert go is False and "does not hold the 548.0 GiB model with a 1.2x margin" in why
    go, why = prefetch.auto_decision(548 * GIB, 600 * GIB, 0, margin=1.05)
    assert go is True and why.startswith("prefetching: 600.0 GiB available memory holds")


def test_auto_declines_when_the_cache_holds_the_model_already():
    go, why = prefetch.auto_decision(100 * GIB, 2000 * GIB, 95 * GIB)
    assert go is False and "already holds 95% of the model" in why
    go, why = prefetch.auto_decision(100 * GIB, 2000 * GIB, 50 * GIB)
    assert go is True and "50% of it cached" in why
    assert prefetch.auto_decision(100 * GIB, None, 0)[0] is False


def test_pieces_cover_every_byte_once():
    pieces = prefetch.plan_pieces([("a", 2 * GIB + 5), ("b", 0), ("c", 7)])
    assert pieces == [("a", 0, GIB), ("a", GIB, GIB), ("a", 2 * GIB, 5), ("c", 0, 7)]


def test_the_sampled_cache_share_sees_a_cold_and_a_warm_model(model):
    for path, _size in model:
        drop = os.open(path, os.O_RDONLY)
        os.posix_fadvise(drop, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(drop)
    fraction, why = prefetch.sampled_cache_fraction(model, probes=64)
    if why and "not supported" in why.lower():
        pytest.skip(why)
    assert why is None and fraction < 0.1  # a refused page may be read in, one page, never its neighbours
    for path, _size in model:
        with open(path, "rb") as handle:
            handle.read()
    assert prefetch.sampled_cache_fraction(model, probes=64) == (1.0, None)
