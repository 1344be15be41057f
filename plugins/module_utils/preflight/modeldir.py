"""Is a model directory whole, and how fast can this host read it? (the GPU preflight).

Whole: config.json and the index parse, every shard the index names is there, each shard's
header is valid and describes the file exactly, with data in its last MiB (shards.py), and
holds every tensor the index maps to it. Headers and samples only: seconds for 548 GB.

Only reads. The read-rate sample first asks the kernel to drop the sampled file's clean pages
(posix_fadvise DONTNEED, which never writes anything), so the number is the disk's, not the page
cache's, and then reads a bounded amount with the clock injected for tests.
"""
import json
import os
import time

from ..common.errors import InputError
from ..common.units import MIB
from . import shards

INDEX_NAME = "model.safetensors.index.json"
# Problems listed one by one before "and N more".
LISTED = 8


def _read_json(path, field_hint):
    try:
        with open(path) as handle:
            return json.load(handle)
    except (OSError, ValueError) as exc:
        raise InputError("model_path", "%s is unreadable or not valid JSON (%s): %s" % (path, exc, field_hint))


def inspect(path):
    """{shards: [{name, size}], shard_count, missing, damaged, total_bytes, index_total_size, has_index}.

    Every shard is checked by its header and a sample of its data (shards.check_shard) and against
    the tensors the index maps to it: `damaged` lists {name, reason}. Raises InputError when the
    directory, config.json or the index is missing or unreadable.
    """
    if not os.path.isdir(path):
        raise InputError("model_path", "%s is not a directory on this host: download the model "
                                       "there or fix the path" % path)
    config_path = os.path.join(path, "config.json")
    if not os.path.isfile(config_path):
        raise InputError("model_path", "%s has no config.json: not a Hugging Face model directory" % path)
    if not isinstance(_read_json(config_path, "download it again"), dict):
        raise InputError("model_path", "%s is JSON but not an object: download it again" % config_path)
    index_path = os.path.join(path, INDEX_NAME)
    index_total = None
    expected = {}
    if os.path.isfile(index_path):
        index = _read_json(index_path, "download it again")
        try:
            for tensor, shard in index["weight_map"].items():
                expected.setdefault(shard, set()).add(tensor)
        except (KeyError, AttributeError, TypeError) as exc:
            raise InputError("model_path", "%s has no weight_map (%s): download it again" % (index_path, exc))
        index_total = (index.get("metadata") or {}).get("total_size")
        names = sorted(expected)
    else:
        names = sorted(n for n in os.listdir(path) if n.endswith(".safetensors"))
        if not names:
            raise InputError("model_path", "%s has neither %s nor *.safetensors files" % (path, INDEX_NAME))
    present, missing, damaged = [], [], []
    for name in names:
        shard_path = os.path.join(path, name)
        try:
            present.append({"name": name, "size": os.path.getsize(shard_path)})
        except OSError:
            missing.append(name)
            continue
        try:
            tensors = shards.check_shard(shard_path)
        except OSError as exc:
            damaged.append({"name": name, "reason": "unreadable (%s)" % (exc.strerror or exc)})
            continue
        except shards.ShardDamaged as exc:
            damaged.append({"name": name, "reason": str(exc)})
            continue
        absent = sorted(expected.get(name, set()) - tensors)
        if absent:
            damaged.append({"name": name, "reason": "the index maps %d tensors to it that its header lacks (%s): "
                                                    "a file of another model or revision" % (len(absent), absent[0])})
    return {
        "shards": present,
        "shard_count": len(names),
        "missing": missing,
        "damaged": damaged,
        "total_bytes": sum(s["size"] for s in present),
        "index_total_size": index_total,
        "has_index": os.path.isfile(index_path),
    }


def problems(found):
    """Human-readable problems of an inspect() result ([] when the directory is whole)."""
    out = []
    if found["missing"]:
        out.append("%d of %d shards named in the index are missing: %s" % (
            len(found["missing"]), found["shard_count"], ", ".join(found["missing"][:LISTED])
            + (" ..." if len(found["missing"]) > LISTED else "")))
    for shard in found["damaged"][:LISTED]:
        out.append("%s: %s" % (shard["name"], shard["reason"]))
    if len(found["damaged"]) > LISTED:
        out.append("and %d more damaged shards" % (len(found["damaged"]) - LISTED))
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
