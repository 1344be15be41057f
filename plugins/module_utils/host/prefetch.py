"""Read a model into the page cache at the disk's speed, before the engine starts.

The engines' default loaders fault the safetensors in through mmap, page by page, far below what
the device can do, and with tensor parallelism every rank faults the same files. Read once, in
parallel large blocks, the files sit in the page cache, which every rank's mapping shares: the
engine's faults are then served from memory. The files are opened O_RDONLY and only read
(`posix_fadvise(WILLNEED)` starts the kernel's readahead on each range; the reads make sure it is
done): nothing is ever written to the model directory.

`auto_decision` is the pure rule of `model_service_prefetch: auto`: prefetch only when the host's
available memory holds the model with a margin (else the prefetch would evict its own first
shards, or squeeze the engine) and the page cache does not already hold most of it.

Standard library only: it runs on the managed host.
"""
import os
import threading
import time

from ..common.errors import ModelWakeError
from ..common.formatting import duration, size
from ..common.units import GIB, MIB

BLOCK = 16 * MIB
# Work is handed to the readers in pieces of this size, so one large shard is read by several.
PIECE = 1 * GIB
READERS = 4
PROGRESS_INTERVAL = 1.0
# auto: MemAvailable must hold the model times this margin...
MEMORY_MARGIN = 1.2
# ...and the cache must hold less than this fraction of it already.
CACHED_ENOUGH = 0.9
# Pages probed by sampled_cache_fraction: one page each, spread evenly over the model.
PROBES = 512
PAGE = 4096


class PrefetchError(ModelWakeError):
    """A shard could not be read; str() names the shard and why."""


def plan_pieces(files, piece=PIECE):
    """[(path, offset, length)] covering every byte of files ([(path, size)]), in file order."""
    pieces = []
    for path, size in files:
        offset = 0
        while offset < size:
            length = min(piece, size - offset)
            pieces.append((path, offset, length))
            offset += length
    return pieces


def _read_piece(path, offset, length, block, buffer, preadv, count, stopping):
    """Read one piece in blocks; count(n) after each block, stopping() before each (True: leave the
    piece unfinished). Raises PrefetchError naming the shard."""
    name = os.path.basename(path)
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as exc:
        raise PrefetchError("%s: cannot open (%s)" % (name, exc.strerror or exc))
    try:
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(fd, offset, length, os.POSIX_FADV_WILLNEED)
        done = 0
        while done < length and not stopping():
            want = min(block, length - done)
            try:
                got = preadv(fd, [memoryview(buffer)[:want]], offset + done)
            except OSError as exc:
                raise PrefetchError("%s: read error at byte %d (%s)" % (name, offset + done, exc.strerror or exc))
            if got <= 0:
                raise PrefetchError("%s: ended at byte %d, expected %d: truncated while reading" % (
                    name, offset + done, offset + length))
            done += got
            count(got)
    finally:
        os.close(fd)


def prefetch(files, readers=READERS, block=BLOCK, piece=PIECE, progress=None,
             progress_interval=PROGRESS_INTERVAL, clock=time.monotonic, preadv=os.preadv, stopping=None):
    """Read every byte of files ([(path, size)]) with `readers` threads; {bytes, seconds,
    rate_bytes_per_s, files, stopped}.

    stopping() (a stop asked for: SIGTERM to the launcher) is asked before each block: when it says
    True the readers end after their current block and the result has `stopped` True.

    progress(report) is called from the calling thread about every progress_interval seconds and
    once at the end, with {bytes, total_bytes, rate_bytes_per_s, eta_seconds, fraction}. The first
    read error stops every reader and raises PrefetchError naming the shard. preadv is injectable
    (a fake reader in tests: a file cut short while it is read).
    """
    stopping = stopping or (lambda: False)
    total = sum(size for _path, size in files)
    pieces = plan_pieces(files, piece)
    lock = threading.Lock()
    state = {"bytes": 0, "next": 0}
    errors = []  # the first read error stops every reader

    def count(n):
        with lock:
            state["bytes"] += n

    def worker():
        buffer = bytearray(block)
        while True:
            with lock:
                if errors or state["next"] >= len(pieces) or stopping():
                    return
                path, offset, length = pieces[state["next"]]
                state["next"] += 1
            try:
                _read_piece(path, offset, length, block, buffer, preadv, count, stopping)
            except PrefetchError as exc:
                with lock:
                    errors.append(exc)
                return

    start = clock()

    def report():
        seconds = max(clock() - start, 1e-6)
        done = state["bytes"]
        rate = done / seconds
        return {"bytes": done, "total_bytes": total, "rate_bytes_per_s": rate,
                "fraction": (done / float(total)) if total else 1.0,
                "eta_seconds": ((total - done) / rate) if rate > 0 else None}

    threads = [threading.Thread(target=worker) for _reader in range(max(1, min(readers, len(pieces) or 1)))]
    for thread in threads:
        thread.daemon = True
        thread.start()
    while True:
        alive = [thread for thread in threads if thread.is_alive()]
        if not alive:
            break
        # Wait for a reader at most one interval: the report comes between the readers' blocks.
        alive[0].join(progress_interval)
        if progress is not None and any(thread.is_alive() for thread in threads):
            progress(report())
    if errors:
        raise errors[0]
    final = report()
    if progress is not None:
        progress(final)
    return {"bytes": final["bytes"], "seconds": max(clock() - start, 1e-6),
            "rate_bytes_per_s": final["rate_bytes_per_s"], "files": len(files),
            "stopped": final["bytes"] < total}


def mincore_is_truthful(path):
    """Whether mincore(2) tells this process the truth about path's page cache.

    Since Linux 5.2 mincore reports the cache of a file mapping only to a process that owns the file
    or may write it (else it says every page is resident: no side channel on shared libraries). A
    service user that reads a root-owned model gets "all cached" from it, whatever the cache holds.
    """
    euid = os.geteuid()
    if euid == 0:
        return True  # CAP_FOWNER (a root without it is not a case the launcher meets)
    try:
        return os.stat(path).st_uid == euid or os.access(path, os.W_OK)
    except OSError:
        return False


def sampled_cache_fraction(files, probes=PROBES):
    """(fraction of PROBES pages the page cache holds, None) or (None, why): read one page at each of
    `probes` offsets spread over files ([(path, size)]) with preadv2(RWF_NOWAIT), which answers from
    the cache or refuses (EAGAIN) instead of reading the disk.

    For a reader mincore lies to (mincore_is_truthful). A refused page may still be read in by the
    kernel (one page: POSIX_FADV_RANDOM turns its readahead off), never more; on fast storage that read
    can end before the probe returns, so a cold model reads a few percent cached. Filesystems without
    RWF_NOWAIT for buffered reads (overlayfs, some network ones) say EOPNOTSUPP: (None, why).
    """
    total = sum(length for _path, length in files)
    if not total or not hasattr(os, "RWF_NOWAIT"):
        return None, "preadv2 RWF_NOWAIT is not available here"
    points = sorted(set(min(total - 1, total * i // probes) for i in range(probes)))
    buffer = bytearray(PAGE)
    hits = asked = 0
    start = 0
    for path, length in files:
        mine = [point - start for point in points if start <= point < start + length]
        start += length
        if not mine:
            continue
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError as exc:
            return None, "%s: cannot open (%s)" % (os.path.basename(path), exc.strerror or exc)
        try:
            if hasattr(os, "posix_fadvise"):
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
            for offset in mine:
                asked += 1
                try:
                    hits += os.preadv(fd, [buffer], offset - offset % PAGE, os.RWF_NOWAIT) > 0
                except BlockingIOError:
                    pass  # not in the cache
                except OSError as exc:
                    return None, "preadv2 RWF_NOWAIT on %s: %s" % (os.path.basename(path), exc.strerror or exc)
        finally:
            os.close(fd)
    return (hits / float(asked)) if asked else None, None


def auto_decision(model_bytes, mem_available, resident_bytes, margin=MEMORY_MARGIN,
                  cached_enough=CACHED_ENOUGH):
    """(prefetch: bool, reason in words) for `model_service_prefetch: auto`.

    model_bytes: the model's size; mem_available: /proc/meminfo MemAvailable in bytes (None when
    unknown); resident_bytes: how much of the model the page cache holds (None when unknown).
    """
    if not model_bytes:
        return False, "no model files to prefetch"
    if mem_available is None:
        return False, "not prefetched: the host's available memory is unknown"
    if resident_bytes is not None and resident_bytes >= cached_enough * model_bytes:
        return False, "not prefetched: the page cache already holds %.0f%% of the model (%s of %s)" % (
            100.0 * resident_bytes / model_bytes, size(resident_bytes), size(model_bytes))
    need = margin * model_bytes
    if mem_available < need:
        return False, ("not prefetched: %s available memory does not hold the %s model with a %.1fx margin "
                       "(%s needed); the prefetch would evict its own first shards" % (
                           size(mem_available), size(model_bytes), margin, size(need)))
    cached = "" if resident_bytes is None else ", %.0f%% of it cached" % (100.0 * resident_bytes / model_bytes)
    return True, "prefetching: %s available memory holds the %s model with a %.1fx margin%s" % (
        size(mem_available), size(model_bytes), margin, cached)


def progress_line(report):
    """`prefetching 12.0 GiB of 548.0 GiB (2%), 6.8 GB/s, ETA 1m18s` for the live lines."""
    eta = report.get("eta_seconds")
    return "prefetching %s of %s (%.0f%%), %.1f GB/s, ETA %s" % (
        size(report["bytes"]), size(report["total_bytes"]), 100.0 * report["fraction"],
        report["rate_bytes_per_s"] / 1e9, duration(eta) if eta is not None else "unknown")
