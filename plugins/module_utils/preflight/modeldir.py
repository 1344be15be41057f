"""Is a model directory complete, and how fast can this host read it? (the GPU preflight).

Only reads. The read-rate sample first asks the kernel to drop the sampled file's clean pages
(posix_fadvise DONTNEED, which never writes anything), so the number is the disk's, not the page
cache's, and then reads a bounded amount with the clock injected for tests.
"""
import json
import os
import time

from ..common.errors import InputError

MIB = 1024 * 1024
INDEX_NAME = "model.safetensors.index.json"
# A shard's header (8-byte length + JSON) and alignment are tiny next to its tensors: a shard
# below this share of the even split of total_size is truncated or a placeholder (a failed
# download, a git-lfs pointer).
PLAUSIBLE_SHARE = 0.5


def inspect(path):
    """{config, index, shards: [{name, size}], missing, implausible, total_bytes, index_total_size}.

    Raises InputError when the directory or config.json is missing or the index is unreadable.
    """
    if not os.path.isdir(path):
        raise InputError("model_path", "%s is not a directory on this host: download the model "
                                       "there or fix the path" % path)
    if not os.path.isfile(os.path.join(path, "config.json")):
        raise InputError("model_path", "%s has no config.json: not a Hugging Face model directory" % path)
    index_path = os.path.join(path, INDEX_NAME)
    index_total = None
    if os.path.isfile(index_path):
        try:
            with open(index_path) as handle:
                index = json.load(handle)
            names = sorted(set(index["weight_map"].values()))
        except (OSError, ValueError, KeyError, AttributeError) as exc:
            raise InputError("model_path", "%s is unreadable or has no weight_map (%s)" % (index_path, exc))
        index_total = (index.get("metadata") or {}).get("total_size")
    else:
        names = sorted(n for n in os.listdir(path) if n.endswith(".safetensors"))
        if not names:
            raise InputError("model_path", "%s has neither %s nor *.safetensors files" % (path, INDEX_NAME))
    shards, missing = [], []
    for name in names:
        try:
            shards.append({"name": name, "size": os.path.getsize(os.path.join(path, name))})
        except OSError:
            missing.append(name)
    implausible = []
    if index_total and names:
        floor = int(index_total / len(names) * PLAUSIBLE_SHARE)
        implausible = [s for s in shards if s["size"] < floor]
    else:
        implausible = [s for s in shards if s["size"] == 0]
    total = sum(s["size"] for s in shards)
    return {
        "shards": shards,
        "shard_count": len(names),
        "missing": missing,
        "implausible": implausible,
        "total_bytes": total,
        "index_total_size": index_total,
        "has_index": os.path.isfile(index_path),
    }


def problems(found):
    """Human-readable problems of an inspect() result ([] when the directory is complete)."""
    out = []
    if found["missing"]:
        out.append("%d of %d shards named in the index are missing: %s" % (
            len(found["missing"]), found["shard_count"], ", ".join(found["missing"][:8])
            + (" ..." if len(found["missing"]) > 8 else "")))
    for shard in found["implausible"][:8]:
        out.append("%s is only %d bytes: truncated or a placeholder" % (shard["name"], shard["size"]))
    if found["index_total_size"] and not found["missing"] and found["total_bytes"] < found["index_total_size"]:
        out.append("the shards hold %d bytes, less than the index's total_size %d" % (
            found["total_bytes"], found["index_total_size"]))
    return out


def measure_read_rate(file_path, sample_bytes, clock=time.monotonic, chunk=4 * MIB):
    """(bytes read, seconds, MiB/s) reading up to sample_bytes of file_path from its start.

    Drops the file's cached pages first (DONTNEED only discards clean pages: nothing is written)
    and again afterwards, so the sample does not stay in memory at the engine's expense.
    """
    fd = os.open(file_path, os.O_RDONLY)
    try:
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        done = 0
        start = clock()
        while done < sample_bytes:
            data = os.read(fd, min(chunk, sample_bytes - done))
            if not data:
                break
            done += len(data)
        seconds = max(clock() - start, 1e-6)
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    return done, seconds, done / float(MIB) / seconds
