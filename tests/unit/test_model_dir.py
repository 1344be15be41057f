"""The preflight's model-directory check on real safetensors files, whole and damaged in each way.

Shards are written by the safetensors library itself (numpy tensors); each damage is one a host
really gets: a copy cut short, a header overwritten in place (same size), a download preallocated
to its final size and never filled, a shard of another revision. The real library must agree
with every verdict on a header (it refuses what the check refuses), so the check is neither
stricter nor looser than the engine's loader.
"""
import json
import os
import struct

import numpy
import pytest
import safetensors
from safetensors.numpy import save_file

from ansible_collections.modelwake.serving.plugins.module_utils.common.errors import InputError
from ansible_collections.modelwake.serving.plugins.module_utils.preflight import modeldir, shards

MIB = 1024 * 1024
ROWS = 256  # rows of 1024: 1 MiB of float32 and 512 KiB of float16 per shard, more than the 1 MiB sampled


def write_model(path, count=4):
    """A model directory: config.json, the index, `count` shards of real random tensors; their names."""
    os.makedirs(path)
    rng = numpy.random.default_rng(7)
    names = ["model-%05d-of-%05d.safetensors" % (i + 1, count) for i in range(count)]
    weight_map = {}
    for i, name in enumerate(names):
        tensors = {
            "model.layers.%d.mlp.down_proj.weight" % i: rng.standard_normal((ROWS, 1024)).astype(numpy.float32),
            "model.layers.%d.mlp.up_proj.weight" % i: rng.standard_normal((ROWS, 1024)).astype(numpy.float16),
            "model.layers.%d.input_layernorm.weight" % i: numpy.ones(1024, dtype=numpy.float32),
        }
        save_file(tensors, os.path.join(path, name), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(tensors, name))
    with open(os.path.join(path, "config.json"), "w") as handle:
        json.dump({"architectures": ["LlamaForCausalLM"]}, handle)
    with open(os.path.join(path, modeldir.INDEX_NAME), "w") as handle:
        json.dump({"metadata": {"total_size": 0}, "weight_map": weight_map}, handle)
    return names


def library_refuses(path):
    """Does the real safetensors library refuse to open the file (what the engine's loader does)?"""
    try:
        with safetensors.safe_open(path, framework="numpy") as handle:
            for key in handle.keys():
                handle.get_tensor(key)
    except Exception:  # noqa: BLE001 - any refusal of the library counts
        return True
    return False


@pytest.fixture
def model(tmp_path):
    path = str(tmp_path / "m")
    return path, write_model(path)


def damaged_reasons(path):
    found = modeldir.inspect(path)
    return dict((d["name"], d["reason"]) for d in found["damaged"]), modeldir.problems(found)


def test_a_whole_model_passes(model):
    path, names = model
    found = modeldir.inspect(path)
    assert found["shard_count"] == 4 and found["missing"] == [] and found["damaged"] == []
    assert found["total_bytes"] == sum(os.path.getsize(os.path.join(path, n)) for n in names)
    assert modeldir.problems(found) == []
    assert not any(library_refuses(os.path.join(path, n)) for n in names)


def test_a_truncated_shard_is_named(model):
    path, names = model
    shard = os.path.join(path, names[2])
    os.truncate(shard, os.path.getsize(shard) - 4096)
    reasons, problems = damaged_reasons(path)
    assert list(reasons) == [names[2]]
    assert reasons[names[2]].endswith("but the file holds %d: truncated" % (os.path.getsize(shard) - data_start(shard)))
    assert problems == ["%s: %s" % (names[2], reasons[names[2]])]
    assert library_refuses(shard)


def test_a_shard_cut_inside_its_header_is_named(model):
    path, names = model
    shard = os.path.join(path, names[0])
    os.truncate(shard, 100)
    reasons, _ = damaged_reasons(path)
    assert reasons == {names[0]: "its header length prefix says %d bytes but the file has 100: corrupt header"
                       % header_length(shard)}
    assert library_refuses(shard)


@pytest.mark.parametrize("damage,reason", [
    # Garbage over the length prefix: an absurd length.
    (lambda raw: b"\xff" * 8 + raw[8:], "its header length prefix says 18446744073709551615 bytes"),
    # Garbage in the JSON.
    (lambda raw: raw[:20] + b"\x00" * 16 + raw[36:], "its header is not valid JSON"),
    # Valid JSON, a tensor's end moved: it no longer matches its dtype x shape.
    (lambda raw: shift_first_end(raw, -8), "holds 1048568 bytes but F32 [256, 1024] needs 1048576: corrupt header"),
])
def test_a_corrupt_header_of_unchanged_size_is_named(model, damage, reason):
    path, names = model
    shard = os.path.join(path, names[1])
    size = os.path.getsize(shard)
    with open(shard, "rb") as handle:
        raw = handle.read()
    with open(shard, "r+b") as handle:
        handle.write(damage(raw)[:len(raw)])
    assert os.path.getsize(shard) == size
    reasons, _ = damaged_reasons(path)
    assert list(reasons) == [names[1]] and reason in reasons[names[1]], reasons
    assert library_refuses(shard)


def test_a_preallocated_shard_never_filled_is_named(model):
    # What a downloader that preallocates leaves when it is killed: the header written, the final
    # size reserved, the data still zeros. Every size is right and the library opens it.
    path, names = model
    shard = os.path.join(path, names[3])
    size, start = os.path.getsize(shard), data_start(shard)
    with open(shard, "r+b") as handle:
        handle.truncate(start)
        handle.truncate(size)
    reasons, _ = damaged_reasons(path)
    assert reasons == {names[3]: "its last 1 MiB of tensor data is all zeros: allocated and never written "
                                 "(an interrupted download?)"}
    assert not library_refuses(shard)


def test_a_shard_of_another_revision_is_named(model):
    path, names = model
    index_path = os.path.join(path, modeldir.INDEX_NAME)
    with open(index_path) as handle:
        index = json.load(handle)
    index["weight_map"]["model.layers.1.self_attn.q_proj.weight"] = names[1]
    with open(index_path, "w") as handle:
        json.dump(index, handle)
    reasons, _ = damaged_reasons(path)
    assert reasons == {names[1]: "the index maps 1 tensors to it that its header lacks "
                                 "(model.layers.1.self_attn.q_proj.weight): a file of another model or revision"}


def test_missing_shards_and_many_damaged_ones_are_counted(tmp_path):
    path = str(tmp_path / "m")
    names = write_model(path, count=12)
    os.unlink(os.path.join(path, names[0]))
    for name in names[1:11]:
        os.truncate(os.path.join(path, name), 1000)
    problems = modeldir.problems(modeldir.inspect(path))
    assert problems[0] == "1 of 12 shards named in the index are missing: %s" % names[0]
    assert len(problems) == 1 + modeldir.LISTED + 1 and problems[-1] == "and 2 more damaged shards"


def test_small_shards_of_zeros_are_not_judged_by_their_zeros(tmp_path):
    path = str(tmp_path / "m")
    os.makedirs(path)
    save_file({"bias": numpy.zeros(1024, dtype=numpy.float32)}, os.path.join(path, "model.safetensors"))
    with open(os.path.join(path, "config.json"), "w") as handle:
        handle.write("{}")
    assert modeldir.inspect(path)["damaged"] == []


@pytest.mark.parametrize("setup,message", [
    (lambda p: None, "is not a directory"),
    (lambda p: os.makedirs(p), "has no config.json"),
    (lambda p: write_model(p) and open(os.path.join(p, "config.json"), "w").write("{\"a\": "), "config.json is unreadable or not valid JSON"),
    (lambda p: write_model(p) and open(os.path.join(p, modeldir.INDEX_NAME), "w").write("[]"), "has no weight_map"),
])
def test_a_bad_directory_is_refused_naming_the_field(tmp_path, setup, message):
    path = str(tmp_path / "m")
    setup(path)
    with pytest.raises(InputError) as err:
        modeldir.inspect(path)
    assert err.value.field == "model_path" and message in str(err.value)


@pytest.mark.parametrize("dtype,shape,expected", [
    ("BF16", [3, 5], 30), ("F8_E4M3", [7168, 2048], 7168 * 2048), ("F4", [3], 2), ("I64", [], 8),
    ("F6_E2M3", [4], 3), ("NEW_DTYPE", [2], None),
])
def test_tensor_bytes(dtype, shape, expected):
    assert shards.tensor_bytes(dtype, shape) == expected


def header_length(path):
    with open(path, "rb") as handle:
        return struct.unpack("<Q", handle.read(8))[0]


def data_start(path):
    return 8 + header_length(path)


def shift_first_end(raw, delta):
    """The header with its F32 tensor's end offset moved by delta, padded back to the same length."""
    length = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + length])
    name = next(n for n, info in header.items() if n != "__metadata__" and info["dtype"] == "F32" and len(info["shape"]) == 2)
    header[name]["data_offsets"][1] += delta
    text = json.dumps(header, separators=(",", ":")).encode()
    assert len(text) <= length
    return raw[:8] + text + b" " * (length - len(text)) + raw[8 + length:]
