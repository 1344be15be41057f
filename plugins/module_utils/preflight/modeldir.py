"""Is a model directory whole, and how fast can this host read it? (the GPU preflight).

Whole: config.json and the index parse, every shard the index names is there, each shard's
header is valid and describes the file exactly, with data in its last MiB (shards.py), and
holds every tensor the index maps to it. Headers and samples only: seconds for 548 GB.

Only reads. The storage's figures (storage_figures) come from host/storage.py: a bounded sample of
the shards read cold with parallel readers (dropped from the page cache first, verified by
mincore), the page cache's share of the model and MemAvailable against its size.
"""
import hashlib
import json
import os

from ..common.errors import InputError
from ..common.formatting import duration, size
from ..common.json_record import read_record, replace_record
from ..common.units import GIB, MIB
from ..host import storage
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


def rate_record_path(state_dir, model_dir):
    """The record of one model directory's last cold read rate (named by its path, outside it)."""
    key = hashlib.sha256(os.path.abspath(model_dir).encode("utf-8")).hexdigest()[:16]
    return os.path.join(state_dir, "read-rate-%s.json" % key)


def _shards_identity(path, found):
    """The shards' names, sizes and mtimes, as one digest: another copy of the model is another identity."""
    digest = hashlib.sha256()
    for shard in sorted(found["shards"], key=lambda shard: shard["name"]):
        stat = os.stat(os.path.join(path, shard["name"]))
        digest.update(("%s\0%d\0%d\n" % (shard["name"], stat.st_size, stat.st_mtime_ns)).encode("utf-8"))
    return digest.hexdigest()


def remembered_rate(state_dir, path, found, max_age_seconds, now):
    """The cold read {rate_bytes_per_s, sampled_bytes, seconds, readers, age_seconds} recorded for these
    very shards less than `max_age_seconds` ago, or None (measure again)."""
    if max_age_seconds <= 0:
        return None
    record = read_record(rate_record_path(state_dir, path))
    try:
        age = now - float(record["measured_at"])
        fresh = record["shards"] == _shards_identity(path, found) and 0 <= age < max_age_seconds
        remembered = {"rate_bytes_per_s": float(record["rate_bytes_per_s"]), "sampled_bytes": int(record["sampled_bytes"]),
                      "seconds": float(record["seconds"]), "readers": int(record["readers"]), "age_seconds": age}
    except (KeyError, TypeError, ValueError, OSError):
        return None
    return remembered if fresh and remembered["rate_bytes_per_s"] > 0 else None


def remember_rate(state_dir, path, found, figures, now):
    """Record a cold read's figures (storage_figures') for the next run; a warm or failed read is not worth it."""
    if not figures.get("read_cold") or not figures.get("disk_rate_bytes_per_s"):
        return
    replace_record(rate_record_path(state_dir, path), {
        "measured_at": now, "shards": _shards_identity(path, found),
        "rate_bytes_per_s": figures["disk_rate_bytes_per_s"], "sampled_bytes": figures["read_bytes"],
        "seconds": figures["read_seconds"], "readers": figures["read_readers"]})


def storage_figures(path, found, sample_bytes, readers=storage.READERS, max_seconds=storage.SAMPLE_SECONDS,
                    remembered=None):
    """What the storage under the model can do, as the module's result fields (storage.py measures).

    The cold sequential read rate of a bounded sample of the model's own shards with parallel
    readers, the page cache's share of the model (checked first: the measurement drops its sample)
    and MemAvailable against the model's size. The expected load time and `disk_rate_bytes_per_s`
    come from the rate only when the sample was read cold: a warm read is the page cache's speed,
    and an estimate from it is too low (the demo's 1 s for a 45 s load). `remembered`
    (remembered_rate's) stands for the measurement: nothing is read or dropped from the page cache.
    """
    files = [(os.path.join(path, shard["name"]), shard["size"]) for shard in found["shards"]]
    total = found["total_bytes"]
    figures = {"read_bytes": 0, "read_seconds": None, "read_rate_mib": None, "read_readers": 0,
               "read_cold": None, "read_how": "not measured", "disk_rate_bytes_per_s": None,
               "expected_load_seconds": None, "expected_load": "unknown"}
    memory = storage.memory_for_model(total)
    figures.update(mem_available_bytes=memory["mem_available_bytes"],
                   mem_holds_model=(round(memory["holds_model_fraction"], 2)
                                    if memory["holds_model_fraction"] is not None else None))
    cache = storage.page_cache_share([name for name, _size in files])
    figures["page_cache_fraction"] = round(cache["fraction"], 3) if cache["fraction"] is not None else None
    if not sample_bytes or not files:
        return figures
    if remembered is not None:
        measured = dict(remembered, cold=True,
                        how="remembered: read cold %s ago" % duration(remembered["age_seconds"]))
    else:
        measured = storage.measure_read_rate(files, sample_bytes=sample_bytes, readers=readers,
                                             max_seconds=max_seconds)
    rate = measured["rate_bytes_per_s"]
    figures.update(read_bytes=measured["sampled_bytes"], read_seconds=round(measured["seconds"], 3),
                   read_readers=measured["readers"], read_cold=measured["cold"], read_how=measured["how"])
    if not rate:
        return figures
    figures["read_rate_mib"] = round(rate / MIB, 1)
    if measured["cold"]:
        figures.update(disk_rate_bytes_per_s=int(rate), expected_load_seconds=round(total / rate, 1),
                       expected_load=duration(total / rate))
    return figures


def storage_summary(path, result):
    """The preflight's one line: size, the disk's rate and how it was read, the expected load time,
    memory against the model and the page cache's share."""
    line = "%s: %d shards, %.1f GiB" % (path, result["shard_count"], result["total_bytes"] / float(GIB))
    if result.get("read_rate_mib") is None:
        line += "; read rate not measured"
    else:
        line += "; disk read %s/s" % size(result["read_rate_mib"] * MIB, mib_digits=0)
        sampled = "%d reader%s (%s sampled" % (result["read_readers"], "" if result["read_readers"] == 1 else "s",
                                               size(result["read_bytes"], mib_digits=0))
        if result["read_how"].startswith("remembered: "):
            remembered = result["read_how"].replace(": read cold", "")
            line += " cold, %s) %s, expected load time %s" % (sampled, remembered, result["expected_load"])
        elif result["read_cold"]:
            line += " cold, %s), expected load time %s" % (sampled, result["expected_load"])
        else:
            why = result["read_how"]
            why = why[len("warm: "):] if why.startswith("warm: ") else why
            line += ", %s), warm: estimate too low (%s), expected load time unknown" % (sampled, why)
    if result.get("mem_holds_model") is not None:
        line += "; memory available %s, %.1fx the model" % (size(result["mem_available_bytes"]),
                                                            result["mem_holds_model"])
    if result.get("page_cache_fraction") is not None:
        line += "; page cache holds %d%% of it" % round(100 * result["page_cache_fraction"])
    return line
