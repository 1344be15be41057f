"""The full proof that a model's shards are the published bytes: their SHA-256, paid once per copy.

Header checks (shards.py) catch a shard that is cut, corrupt in its header or never filled; a flipped
bit inside the tensor data needs the checksum. The expected sums come from the model directory
itself: a `SHA256SUMS` file (`sha256sum` format), or the metadata a Hugging Face download leaves
beside the files (`.cache/huggingface/download/<file>.metadata`: commit, etag, timestamp; a
large file's etag is its SHA-256). Hashing 548 GB takes as long as reading it, so a verified shard
is remembered by (size, mtime) in a record outside the model directory, and an unchanged copy is
not read again. Only the record is ever written; model files are only read.
"""
import hashlib
import os
import re

from ..common.errors import InputError
from ..common.json_record import read_record, replace_record
from ..common.units import MIB

SUMS_FILE = "SHA256SUMS"
HF_METADATA_DIR = os.path.join(".cache", "huggingface", "download")
HEX64 = re.compile(r"^[0-9a-f]{64}$")
CHUNK = 8 * MIB


def expected_sums(model_dir, names):
    """({shard name: sha256 hex}, where they came from) for the shards that have one.

    SHA256SUMS wins over the Hugging Face metadata; shards without a sum are simply absent.
    """
    sums_path = os.path.join(model_dir, SUMS_FILE)
    if os.path.isfile(sums_path):
        sums = {}
        with open(sums_path) as handle:
            for number, line in enumerate(handle, 1):
                if not line.strip():
                    continue
                parts = line.split(None, 1)
                if len(parts) != 2 or not HEX64.match(parts[0].lower()):
                    raise InputError("model_path", "%s line %d is not '<sha256>  <file>': %r" % (
                        sums_path, number, line.strip()[:120]))
                name = parts[1].strip().lstrip("*")
                sums[name[2:] if name.startswith("./") else name] = parts[0].lower()
        return dict((n, sums[n]) for n in names if n in sums), SUMS_FILE
    sums = {}
    for name in names:
        meta = os.path.join(model_dir, HF_METADATA_DIR, name + ".metadata")
        try:
            with open(meta) as handle:
                lines = handle.read().splitlines()
        except OSError:
            continue
        if len(lines) >= 2 and HEX64.match(lines[1].strip().strip('"').lower()):
            sums[name] = lines[1].strip().strip('"').lower()
    return sums, (HF_METADATA_DIR if sums else None)


def sha256_of(path):
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while True:
            block = handle.read(CHUNK)
            if not block:
                break
            digest.update(block)
    return digest.hexdigest()


def record_path(state_dir, model_dir):
    """The record of one model directory's verified shards (named by its path, outside it)."""
    key = hashlib.sha256(os.path.abspath(model_dir).encode("utf-8")).hexdigest()[:16]
    return os.path.join(state_dir, "verified-%s.json" % key)


def verify(model_dir, names, state_dir, hasher=sha256_of):
    """{source, checked, remembered, unverified, mismatched: [{name, reason}], recorded} for the shards.

    A shard whose (size, mtime, expected sum) equals the record's is remembered, not read. The
    record keeps only shards that matched, and is replaced atomically.
    """
    sums, source = expected_sums(model_dir, names)
    record_file = record_path(state_dir, model_dir)
    record = read_record(record_file)
    kept, checked, remembered, mismatched = {}, [], [], []
    for name in names:
        if name not in sums:
            continue
        stat = os.stat(os.path.join(model_dir, name))
        identity = [stat.st_size, stat.st_mtime_ns, sums[name]]
        if record.get(name) == identity:
            remembered.append(name)
            kept[name] = identity
            continue
        actual = hasher(os.path.join(model_dir, name))
        checked.append(name)
        if actual == sums[name]:
            kept[name] = identity
        else:
            mismatched.append({"name": name, "reason": "its SHA-256 is %s, %s says %s: the bytes differ from "
                                                       "the published file" % (actual, source, sums[name])})
    recorded = kept != record
    if recorded:
        replace_record(record_file, kept)
    return {"source": source, "checked": checked, "remembered": remembered,
            "unverified": [n for n in names if n not in sums], "mismatched": mismatched, "recorded": recorded}
