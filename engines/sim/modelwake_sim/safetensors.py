"""Just enough of the safetensors file format to write shards and check them like the real loader.

Layout: 8-byte little-endian header length N, N bytes of JSON header (padded with spaces to a
multiple of 8), then the data area that the header's `data_offsets` must cover exactly.
"""
import json
import os
import struct

# Header limit of the real library (safetensors' MAX_HEADER_SIZE), so a garbage length is caught.
MAX_HEADER_SIZE = 100_000_000


class SafetensorError(Exception):
    """Raised with the real library's messages (`safetensors_rust.SafetensorError` in tracebacks)."""


def encode_header(tensors, metadata=None):
    """Return the header bytes (length prefix included) for `tensors`: [(name, dtype, shape, nbytes)].

    Tensors are laid out back to back in the given order.
    """
    header = {}
    if metadata:
        header["__metadata__"] = dict(metadata)
    offset = 0
    for name, dtype, shape, nbytes in tensors:
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw


def data_size(header):
    """Bytes the data area must hold according to a parsed header."""
    end = 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        end = max(end, info["data_offsets"][1])
    return end


def read_header(fileobj, file_size):
    """Parse and validate a shard's header like safetensors' `safe_open` does; return (header, data_start).

    Raises SafetensorError with the real messages: a shard cut short gives
    "Error while deserializing header: incomplete metadata, file not fully covered".
    """
    prefix = fileobj.read(8)
    if len(prefix) < 8:
        raise SafetensorError("Error while deserializing header: header too small")
    (length,) = struct.unpack("<Q", prefix)
    if length > MAX_HEADER_SIZE:
        raise SafetensorError("Error while deserializing header: header too large")
    if 8 + length > file_size:
        raise SafetensorError("Error while deserializing header: invalid header length")
    raw = fileobj.read(length)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise SafetensorError("Error while deserializing header: invalid JSON in header: %s" % exc)
    if not isinstance(header, dict):
        raise SafetensorError("Error while deserializing header: invalid JSON in header: not an object")
    try:
        needed = data_size(header)
    except (KeyError, TypeError, IndexError):
        raise SafetensorError("Error while deserializing header: invalid header format")
    if 8 + length + needed != file_size:
        raise SafetensorError("Error while deserializing header: incomplete metadata, file not fully covered")
    return header, 8 + length


def check_file(path):
    """Validate a shard on disk; return (header, data_start, file_size)."""
    with open(path, "rb") as fileobj:
        size = os.fstat(fileobj.fileno()).st_size
        header, start = read_header(fileobj, size)
    return header, start, size
