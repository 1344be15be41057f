"""Is a safetensors shard whole? Its header and a sample of its data, read in milliseconds.

A shard is an 8-byte little-endian header length N, N bytes of JSON naming each tensor's dtype,
shape and `data_offsets` (relative to the data area), then the data area, which the tensors must
cover exactly, back to back (what safetensors itself validates when it opens a file). Damage that
keeps every size — a corrupt header, a download a downloader preallocated to its final size and
never filled — shows in the header or in the data's last MiB; the full proof is a checksum
(checksums.py), which reads everything. Only reads; never writes.
"""
import json
import os
import struct

from ..common.errors import ModelWakeError
from ..common.units import MIB

# safetensors' own MAX_HEADER_SIZE: a larger length prefix is garbage, not a header.
MAX_HEADER_SIZE = 100_000_000
# Bits per element of every dtype safetensors knows. An unknown dtype (a newer one) is not refused:
# only its byte count cannot be checked against its shape.
DTYPE_BITS = {
    "BOOL": 8, "U8": 8, "I8": 8, "F8_E4M3": 8, "F8_E5M2": 8, "F8_E8M0": 8,
    "U16": 16, "I16": 16, "F16": 16, "BF16": 16,
    "U32": 32, "I32": 32, "F32": 32,
    "U64": 64, "I64": 64, "F64": 64, "C64": 64,
    "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6,
}
# A data area whose last MiB is all zeros was allocated and never written. Below this size a run
# of zeros can be real (a tiny zero bias), so small shards are not judged by their zeros.
ZERO_TAIL_BYTES = MIB
ZERO_TAIL_MIN_DATA = 64 * 1024


class ShardDamaged(ModelWakeError):
    """A shard that the engine would refuse, or load as garbage; str() is the reason."""


def read_header(fileobj, file_size):
    """(tensors, data_start) of an open shard: {name: {dtype, shape, data_offsets}}, metadata dropped.

    Raises ShardDamaged naming what is wrong with the length prefix or the JSON.
    """
    if file_size < 8:
        raise ShardDamaged("only %d bytes, shorter than the 8-byte header length: truncated" % file_size)
    (length,) = struct.unpack("<Q", fileobj.read(8))
    if length > MAX_HEADER_SIZE or 8 + length > file_size:
        raise ShardDamaged("its header length prefix says %d bytes but the file has %d: corrupt header" % (
            length, file_size))
    raw = fileobj.read(length)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise ShardDamaged("its header is not valid JSON (%s): corrupt header" % exc)
    if not isinstance(header, dict):
        raise ShardDamaged("its header is JSON but not an object: corrupt header")
    header.pop("__metadata__", None)
    for name, info in header.items():
        if not (isinstance(info, dict) and isinstance(info.get("dtype"), str)
                and isinstance(info.get("shape"), list) and all(isinstance(d, int) and d >= 0 for d in info["shape"])
                and isinstance(info.get("data_offsets"), list) and len(info["data_offsets"]) == 2
                and all(isinstance(o, int) and o >= 0 for o in info["data_offsets"])):
            raise ShardDamaged("tensor %s has no valid dtype, shape and data_offsets: corrupt header" % name)
    return header, 8 + length


def tensor_bytes(dtype, shape):
    """Bytes a tensor of dtype and shape takes, or None for a dtype this code does not know."""
    bits = DTYPE_BITS.get(dtype)
    if bits is None:
        return None
    count = 1
    for dim in shape:
        count *= dim
    return (count * bits + 7) // 8


def check_layout(tensors, data_bytes):
    """Raise ShardDamaged unless the tensors cover the data_bytes after the header exactly."""
    end = 0
    for name, info in sorted(tensors.items(), key=lambda item: tuple(item[1]["data_offsets"])):
        begin, stop = info["data_offsets"]
        if begin != end:
            raise ShardDamaged("tensor %s starts at data byte %d where the one before ends at %d: corrupt header" % (
                name, begin, end))
        if stop < begin:
            raise ShardDamaged("tensor %s ends before it starts (data_offsets %s): corrupt header" % (
                name, info["data_offsets"]))
        needed = tensor_bytes(info["dtype"], info["shape"])
        if needed is not None and needed != stop - begin:
            raise ShardDamaged("tensor %s holds %d bytes but %s %s needs %d: corrupt header" % (
                name, stop - begin, info["dtype"], info["shape"], needed))
        end = stop
    if end > data_bytes:
        raise ShardDamaged("its tensors need %d bytes of data but the file holds %d: truncated" % (end, data_bytes))
    if end < data_bytes:
        raise ShardDamaged("the file holds %d bytes after its last tensor: not a shard its header describes" % (
            data_bytes - end))


def _all_zero(fileobj, start, count):
    fileobj.seek(start)
    left = count
    while left:
        block = fileobj.read(min(left, MIB))
        if not block:
            return False
        if block.count(0) != len(block):
            return False
        left -= len(block)
    return True


def check_shard(path):
    """Names of the tensors in a whole shard; raises ShardDamaged (or OSError) otherwise.

    Reads the header and at most ZERO_TAIL_BYTES of data, whatever the shard's size.
    """
    with open(path, "rb") as fileobj:
        size = os.fstat(fileobj.fileno()).st_size
        tensors, data_start = read_header(fileobj, size)
        data_bytes = size - data_start
        check_layout(tensors, data_bytes)
        if data_bytes >= ZERO_TAIL_MIN_DATA:
            tail = min(ZERO_TAIL_BYTES, data_bytes)
            if _all_zero(fileobj, size - tail, tail):
                raise ShardDamaged("its last %s of tensor data is all zeros: allocated and never written "
                                   "(an interrupted download?)" % ("%d KiB" % (tail // 1024) if tail < MIB
                                                                   else "%d MiB" % (tail // MIB)))
    return set(tensors)
