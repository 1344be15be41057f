"""What the storage under a model can do: its cold sequential read rate, how much of the model the
page cache already holds, and whether the host's memory could hold all of it.

The read rate is measured on the model's own files, where they live, the way a fast loader reads
them: several readers in parallel, each reading large blocks of a different shard (or a different
range of one shard). The page cache must not flatter it, so before reading, the sampled ranges are
dropped from the cache (`posix_fadvise(DONTNEED)`: discards clean pages only, never writes, needs no
root) and then checked with `mincore(2)`: pages that stay resident after the drop are dirty (the
files were written moments ago and are not on disk yet) or held by a running process's mapping. A
sample that is still mostly resident is reported as warm, with that reason, and its rate is the
page cache's, not the disk's. After the read the sample is dropped again, so the measurement does
not leave a GiB of cache behind at the engine's expense.

O_DIRECT would bypass the cache altogether, but not every filesystem takes it (tmpfs, some network
and FUSE filesystems refuse it) and it needs aligned buffers and offsets; DONTNEED plus a mincore
check works everywhere and says honestly when it did not work.

Standard library only (ctypes for mmap/mincore): it runs on the managed host.
"""
import ctypes
import ctypes.util
import os
import threading
import time

from ..common.units import GIB, MIB

# The fast loaders' block size (fastsafetensors and the Run:ai streamer read in MiB-sized chunks).
BLOCK = 16 * MIB
SAMPLE_BYTES = 2 * GIB
SAMPLE_SECONDS = 10.0
READERS = 4
# A sample with more than this fraction resident after the drop is a warm one.
WARM_FRACTION = 0.10
# mincore is asked about this much of a file at a time (a vector of one byte per page: 256 KiB).
MINCORE_WINDOW = 1 * GIB
MEMINFO = "/proc/meminfo"

_PROT_READ = 0x1
_MAP_SHARED = 0x01
_MAP_FAILED = ctypes.c_void_p(-1).value


class _Libc(object):
    """libc's mmap, mincore and munmap, bound once; `error` says why not where they are missing."""

    def __init__(self):
        self.error = None
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
            self.mmap = libc.mmap
            self.mmap.restype = ctypes.c_void_p
            self.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                                  ctypes.c_int, ctypes.c_long]
            self.munmap = libc.munmap
            self.munmap.restype = ctypes.c_int
            self.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
            self.mincore = libc.mincore
            self.mincore.restype = ctypes.c_int
            self.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte)]
        except (OSError, AttributeError) as exc:
            self.error = "mincore unavailable (%s)" % exc


_LIBC = None


def _libc():
    global _LIBC
    if _LIBC is None:
        _LIBC = _Libc()
    return _LIBC


def resident_bytes(path, offset=0, length=None):
    """Bytes of path[offset:offset+length] that the page cache holds now (mincore on a mapping).

    Mapping a file and asking mincore reads nothing and faults nothing in. Raises OSError when the
    file cannot be opened or mapped (or mincore is missing: ENOSYS).
    """
    libc = _libc()
    if libc.error:
        raise OSError(38, libc.error)
    page = os.sysconf("SC_PAGE_SIZE")
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        end = size if length is None else min(size, offset + length)
        start = offset - offset % page  # mmap's offset must be page-aligned
        resident = 0
        while start < end:
            span = min(MINCORE_WINDOW, end - start)
            address = libc.mmap(None, span, _PROT_READ, _MAP_SHARED, fd, start)
            if address in (None, _MAP_FAILED):
                errno = ctypes.get_errno()
                raise OSError(errno, "mmap of %s failed: %s" % (path, os.strerror(errno)))
            try:
                pages = (span + page - 1) // page
                vector = (ctypes.c_ubyte * pages)()
                if libc.mincore(address, span, vector) != 0:
                    errno = ctypes.get_errno()
                    raise OSError(errno, "mincore on %s failed: %s" % (path, os.strerror(errno)))
                in_core = sum(1 for flag in vector if flag & 1)
            finally:
                libc.munmap(address, span)
            # The last page may be partial: never count past the range's end.
            resident += min(in_core * page, span)
            start += span
        return resident
    finally:
        os.close(fd)


def page_cache_share(paths, time_limit=5.0, clock=time.monotonic):
    """How much of these files the page cache holds: {resident_bytes, checked_bytes, total_bytes,
    fraction (of the checked bytes), complete, error}.

    Bounded in time: after time_limit seconds the files not yet checked are left out (`complete`
    false), and the fraction is that of the checked ones. A file that cannot be checked is named
    in `error` and left out; without mincore at all, fraction is None.
    """
    sizes = []
    for path in paths:
        try:
            sizes.append((path, os.path.getsize(path)))
        except OSError as exc:
            return {"resident_bytes": 0, "checked_bytes": 0, "total_bytes": 0, "fraction": None,
                    "complete": False, "error": "%s: %s" % (os.path.basename(path), exc.strerror or exc)}
    total = sum(size for _path, size in sizes)
    deadline = clock() + time_limit
    resident = checked = 0
    error = None
    complete = True
    for path, size in sizes:
        if clock() > deadline:
            complete = False
            break
        try:
            resident += resident_bytes(path)
            checked += size
        except OSError as exc:
            error = "%s: %s" % (os.path.basename(path), exc.strerror or exc)
            complete = False
            if exc.errno == 38:  # no mincore: nothing else will work either
                break
    return {"resident_bytes": resident, "checked_bytes": checked, "total_bytes": total,
            "fraction": (resident / float(checked)) if checked else None,
            "complete": complete, "error": error}


def read_meminfo(path=MEMINFO):
    """{MemTotal, MemAvailable, Cached, ...} of /proc/meminfo in bytes."""
    values = {}
    with open(path) as handle:
        for line in handle:
            name, _colon, rest = line.partition(":")
            fields = rest.split()
            if fields and fields[0].isdigit():
                values[name.strip()] = int(fields[0]) * (1024 if fields[1:2] == ["kB"] else 1)
    return values


def memory_for_model(model_bytes, meminfo_path=MEMINFO):
    """{mem_available_bytes, mem_total_bytes, model_bytes, holds_model_fraction}: could the page
    cache hold the whole model next to what the host already uses? (MemAvailable: what can be had
    without swapping, the page cache it would evict counted in.)"""
    info = read_meminfo(meminfo_path)
    available = info.get("MemAvailable", 0)
    return {"mem_available_bytes": available, "mem_total_bytes": info.get("MemTotal", 0),
            "model_bytes": model_bytes,
            "holds_model_fraction": (available / float(model_bytes)) if model_bytes else None}


def plan_sample(files, sample_bytes, readers, block=BLOCK):
    """The ranges to read: [(path, offset, length)], each reader taking the next one free.

    files: [(path, size)]. With at least as many shards as readers, each range is a shard of its own
    (as loaders that read shards in parallel do), up to a reader's share of the sample, and the
    shards follow one another until the sample is taken: many small shards make a sample of many
    ranges. With fewer shards than readers, each reader gets its own range of the largest ones.
    Lengths are whole blocks where the file is that large; the total stays within sample_bytes.
    """
    files = sorted((f for f in files if f[1] > 0), key=lambda f: (-f[1], f[0]))
    if not files or sample_bytes <= 0 or readers <= 0:
        return []
    budget = min(sample_bytes, sum(f[1] for f in files))
    share = max(block, (budget // readers) // block * block)
    ranges = []
    left = budget
    split = len(files) < readers
    # Enough shards: one range of each (a reader per shard); else several ranges of each.
    ranges_per_file = readers if split else 1
    for path, size in files:
        offset = 0
        taken = 0
        while offset < size and left > 0 and taken < ranges_per_file and not (split and len(ranges) >= readers):
            taken += 1
            length = min(share, size - offset, left)
            ranges.append((path, offset, length))
            offset += length
            left -= length
        if left <= 0 or (split and len(ranges) >= readers):
            break
    return ranges


def _drop(path, offset, length):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, offset, length, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _read_ranges(ranges, next_range, deadline, block, clock, counts):
    """Read the ranges next_range() hands out, in blocks into one reused buffer, until none is
    left or the deadline; counts[i] is what was read of ranges[i]."""
    buffer = bytearray(block)
    while clock() < deadline:
        index = next_range()
        if index is None:
            return
        path, offset, length = ranges[index]
        done = 0
        fd = os.open(path, os.O_RDONLY)
        try:
            while done < length and clock() < deadline:
                want = min(block, length - done)
                got = os.preadv(fd, [memoryview(buffer)[:want]], offset + done)
                if got <= 0:
                    break
                done += got
        finally:
            os.close(fd)
        counts[index] = done


def measure_read_rate(files, sample_bytes=SAMPLE_BYTES, max_seconds=SAMPLE_SECONDS, readers=READERS,
                      block=BLOCK, drop_first=True, clock=time.monotonic):
    """The sequential read rate of these files with `readers` parallel readers.

    files: [(path, size)] (the model's shards). Returns {rate_bytes_per_s, sampled_bytes, seconds,
    readers, cold, how, resident_before_bytes}: `cold` is true only when the sample was out of the
    page cache before the read (checked with mincore), and `how` says how it was made cold or why it
    was not. drop_first=False measures the cache as it is (a warm read when the files are cached).
    Raises OSError when a sampled file cannot be opened or read.
    """
    ranges = plan_sample(files, sample_bytes, readers, block)
    if not ranges:
        return {"rate_bytes_per_s": None, "sampled_bytes": 0, "seconds": 0.0, "readers": 0,
                "cold": False, "how": "nothing to sample (no shard with data)", "resident_before_bytes": 0}
    if drop_first:
        for path, offset, length in ranges:
            _drop(path, offset, length)
    planned = sum(r[2] for r in ranges)
    try:
        resident = sum(resident_bytes(path, offset, length) for path, offset, length in ranges)
        resident_note = None
    except OSError as exc:
        resident = None
        resident_note = exc.strerror or str(exc)
    counts = [0] * len(ranges)
    handed = [0]
    lock = threading.Lock()

    def next_range():
        with lock:
            if handed[0] >= len(ranges):
                return None
            handed[0] += 1
            return handed[0] - 1

    workers = min(readers, len(ranges))
    start = clock()
    deadline = start + max_seconds
    threads = [threading.Thread(target=_read_ranges, args=(ranges, next_range, deadline, block, clock, counts))
               for _worker in range(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    seconds = max(clock() - start, 1e-6)
    sampled = sum(counts)
    if drop_first:
        # Give the memory back: the sample was out of the cache before, it leaves it again.
        for path, offset, length in ranges:
            _drop(path, offset, length)
    if resident is None:
        cold = drop_first
        how = ("page cache dropped for the sample (posix_fadvise DONTNEED), not verified: %s" % resident_note
               if drop_first else "page cache left as it was, not checked: %s" % resident_note)
    elif resident > WARM_FRACTION * planned:
        cold = False
        share = 100.0 * resident / planned
        if drop_first:
            how = ("warm: %.0f%% of the sample stayed in the page cache after posix_fadvise(DONTNEED): "
                   "dirty pages (files written moments ago, not yet on disk) or mapped by a running process; "
                   "the rate is the cache's, not the disk's" % share)
        else:
            how = "warm: %.0f%% of the sample was in the page cache (not dropped)" % share
    else:
        cold = True
        how = ("cold: sample dropped from the page cache (posix_fadvise DONTNEED) and checked with mincore"
               if drop_first else "cold: sample was not in the page cache (checked with mincore)")
    return {"rate_bytes_per_s": sampled / seconds, "sampled_bytes": sampled, "seconds": seconds,
            "readers": workers, "cold": cold, "how": how,
            "resident_before_bytes": resident}


def model_files(model_dir):
    """[(path, size)] of the *.safetensors files in model_dir, sorted by name."""
    out = []
    for name in sorted(os.listdir(model_dir)):
        if name.endswith(".safetensors"):
            path = os.path.join(model_dir, name)
            if os.path.isfile(path):
                out.append((path, os.path.getsize(path)))
    return out
