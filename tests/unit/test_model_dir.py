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
from ansible_collections.modelwake.serving.plugins.module_utils.preflight import checksums, modeldir, shards

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


# -- The opt-in full verification: checksums.py -----------------------------------------------------

def write_sums(path, names, wrong=()):
    lines = []
    for name in names:
        digest = checksums.sha256_of(os.path.join(path, name))
        lines.append("%s  %s\n" % ("0" * 64 if name in wrong else digest, name))
    with open(os.path.join(path, checksums.SUMS_FILE), "w") as handle:
        handle.writelines(lines)


class CountingHasher(object):
    def __init__(self):
        self.read = []

    def __call__(self, path):
        self.read.append(os.path.basename(path))
        return checksums.sha256_of(path)


def test_checksums_are_verified_once_and_remembered_while_the_copy_is_unchanged(model, tmp_path):
    path, names = model
    write_sums(path, names)
    state = str(tmp_path / "state")
    hasher = CountingHasher()
    first = checksums.verify(path, names, state, hasher=hasher)
    assert (first["source"], first["checked"], first["mismatched"], first["recorded"]) == ("SHA256SUMS", names, [], True)
    second = checksums.verify(path, names, state, hasher=hasher)
    assert (second["checked"], second["remembered"], second["recorded"]) == ([], names, False)
    assert hasher.read == names  # each shard read once in all
    # A copy replaced in place (new mtime) is read again.
    os.utime(os.path.join(path, names[1]), ns=(1, 1))
    third = checksums.verify(path, names, state, hasher=hasher)
    assert third["checked"] == [names[1]]
    # The record lives outside the model directory, which is never written.
    assert os.listdir(state) == [os.path.basename(checksums.record_path(state, path))]


def test_a_flipped_byte_inside_the_data_is_caught_only_by_the_checksum(model, tmp_path):
    path, names = model
    write_sums(path, names)
    shard = os.path.join(path, names[2])
    with open(shard, "r+b") as handle:
        handle.seek(data_start(shard) + 1000)
        byte = handle.read(1)
        handle.seek(-1, os.SEEK_CUR)
        handle.write(bytes([byte[0] ^ 0x01]))
    assert modeldir.inspect(path)["damaged"] == []  # headers and the zero sample see nothing
    result = checksums.verify(path, names, str(tmp_path / "state"))
    assert [m["name"] for m in result["mismatched"]] == [names[2]]
    assert "the bytes differ from the published file" in result["mismatched"][0]["reason"]
    # A mismatch is not remembered: the next run hashes it again.
    again = checksums.verify(path, names, str(tmp_path / "state"))
    assert again["checked"] == [names[2]] and again["mismatched"]


def test_a_hugging_face_download_s_metadata_gives_the_sums(model, tmp_path):
    path, names = model
    meta_dir = os.path.join(path, checksums.HF_METADATA_DIR)
    os.makedirs(meta_dir)
    for name in names[:3]:  # the fourth has no metadata: unverified, not refused
        with open(os.path.join(meta_dir, name + ".metadata"), "w") as handle:
            handle.write("a1b2c3d4e5f6\n%s\n1764547200.0\n" % checksums.sha256_of(os.path.join(path, name)))
    result = checksums.verify(path, names, str(tmp_path / "state"))
    assert result["source"] == checksums.HF_METADATA_DIR
    assert (result["checked"], result["unverified"], result["mismatched"]) == (names[:3], [names[3]], [])


def test_a_malformed_sums_file_is_refused_naming_the_line(model, tmp_path):
    path, names = model
    with open(os.path.join(path, checksums.SUMS_FILE), "w") as handle:
        handle.write("not-a-sum  %s\n" % names[0])
    with pytest.raises(InputError) as err:
        checksums.verify(path, names, str(tmp_path / "state"))
    assert err.value.field == "model_path" and "SHA256SUMS line 1 is not '<sha256>  <file>'" in str(err.value)


# -- the storage's figures (the disk's cold rate, memory, page cache) ------------------------------

def sync_and_drop(path, names):
    """Write the shards to disk and drop them from the page cache (clean pages: DONTNEED drops them)."""
    for name in names:
        fd = os.open(os.path.join(path, name), os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def test_the_figures_of_a_cold_model_give_the_disk_rate_and_the_expected_load(model):
    path, names = model
    sync_and_drop(path, names)
    found = modeldir.inspect(path)
    sync_and_drop(path, names)  # inspect() read the headers and samples back in
    figures = modeldir.storage_figures(path, found, 64 * MIB, readers=4)
    if figures["read_cold"] is False and "stayed in the page cache" in figures["read_how"]:
        pytest.skip("this filesystem keeps clean pages after DONTNEED: no cold read possible here")
    assert figures["read_cold"] is True, figures["read_how"]
    assert figures["read_bytes"] == found["total_bytes"]  # the sample covers this small model
    assert figures["read_readers"] == 4  # one shard each
    assert figures["page_cache_fraction"] == 0.0  # checked before the read
    rate = figures["read_bytes"] / figures["read_seconds"]
    assert figures["disk_rate_bytes_per_s"] == pytest.approx(rate, rel=0.01)
    assert figures["expected_load_seconds"] == pytest.approx(found["total_bytes"] / rate, abs=0.11)
    with open("/proc/meminfo") as handle:
        available = [int(line.split()[1]) * 1024 for line in handle if line.startswith("MemAvailable:")][0]
    assert figures["mem_available_bytes"] == pytest.approx(available, rel=0.2)
    assert figures["mem_holds_model"] == pytest.approx(figures["mem_available_bytes"] / found["total_bytes"], rel=0.01)
    summary = modeldir.storage_summary(path, dict(found, **figures))
    assert summary.startswith("%s: 4 shards, " % path)
    assert "/s cold, 4 readers (%d MiB sampled), expected load time %s" % (
        round(found["total_bytes"] / MIB), figures["expected_load"]) in summary
    assert "; page cache holds 0% of it" in summary
    assert "estimate too low" not in summary


def test_a_sample_the_page_cache_keeps_is_warm_and_gives_no_estimate(model):
    """A running process's mapping keeps the pages in the cache whatever DONTNEED asks: the read is
    the cache's, reported as such, and neither the disk's rate nor an expected load comes of it."""
    import mmap
    path, names = model
    found = modeldir.inspect(path)
    maps = []
    try:
        for name in names:
            with open(os.path.join(path, name), "rb") as handle:
                mapped = mmap.mmap(handle.fileno(), 0, prot=mmap.PROT_READ)
            sum(mapped[offset] for offset in range(0, len(mapped), mmap.PAGESIZE))  # fault every page in
            maps.append(mapped)
        figures = modeldir.storage_figures(path, found, 64 * MIB, readers=2)
    finally:
        for mapped in maps:
            mapped.close()
    assert figures["read_cold"] is False
    assert figures["read_how"].startswith("warm: 100% of the sample stayed in the page cache")
    assert figures["read_rate_mib"] > 0
    assert figures["disk_rate_bytes_per_s"] is None
    assert figures["expected_load_seconds"] is None and figures["expected_load"] == "unknown"
    assert figures["page_cache_fraction"] == 1.0
    summary = modeldir.storage_summary(path, dict(found, **figures))
    assert ", 2 readers (%d MiB sampled), warm: estimate too low (100%% of the sample stayed in the page cache" % (
        round(figures["read_bytes"] / MIB)) in summary
    assert "expected load time unknown" in summary and "page cache holds 100% of it" in summary


def test_no_sample_measures_nothing_but_still_says_memory_and_cache(model):
    path, _names = model
    found = modeldir.inspect(path)
    figures = modeldir.storage_figures(path, found, 0)
    assert (figures["read_bytes"], figures["read_rate_mib"], figures["disk_rate_bytes_per_s"]) == (0, None, None)
    assert figures["mem_available_bytes"] > 0 and figures["page_cache_fraction"] is not None
    assert "; read rate not measured; memory available " in modeldir.storage_summary(path, dict(found, **figures))


def test_a_cold_rate_is_remembered_for_the_same_shards_and_measured_again_for_another_copy(model, tmp_path,
                                                                                          monkeypatch):
    path, names = model
    state = str(tmp_path / "state")
    found = modeldir.inspect(path)
    cold = {"read_cold": True, "disk_rate_bytes_per_s": 600 * MIB, "read_bytes": 4 * MIB, "read_seconds": 0.5,
            "read_readers": 4}
    modeldir.remember_rate(state, path, found, cold, now=1000.0)
    remembered = modeldir.remembered_rate(state, path, found, max_age_seconds=3600, now=1000.0 + 7380)
    assert remembered is None  # older than the age asked
    remembered = modeldir.remembered_rate(state, path, found, max_age_seconds=24 * 3600, now=1000.0 + 7380)
    assert remembered == {"rate_bytes_per_s": 600 * MIB, "sampled_bytes": 4 * MIB, "seconds": 0.5, "readers": 4,
                          "age_seconds": 7380.0}
    assert modeldir.remembered_rate(state, path, found, max_age_seconds=0, now=1001.0) is None  # 0: every run

    # Nothing is read for a remembered rate: the figures are the record's, and say how old they are.
    def no_read(*_args, **_kwargs):
        raise AssertionError("a remembered rate must not read the shards")
    monkeypatch.setattr(modeldir.storage, "measure_read_rate", no_read)
    figures = modeldir.storage_figures(path, found, 64 * MIB, readers=4, remembered=remembered)
    assert (figures["disk_rate_bytes_per_s"], figures["read_cold"], figures["read_readers"]) == (600 * MIB, True, 4)
    assert figures["read_how"] == "remembered: read cold 2h03m ago"
    assert figures["expected_load_seconds"] == pytest.approx(found["total_bytes"] / (600.0 * MIB), abs=0.1)
    summary = modeldir.storage_summary(path, dict(found, **figures))
    assert "; disk read 600 MiB/s cold, 4 readers (4 MiB sampled) remembered 2h03m ago, expected load time " in summary

    # Another copy of the model (a shard written again) is measured again.
    os.utime(os.path.join(path, names[0]), ns=(0, 1))
    assert modeldir.remembered_rate(state, path, found, max_age_seconds=24 * 3600, now=1001.0) is None


def test_a_warm_read_is_not_remembered(model, tmp_path):
    path, _names = model
    state = str(tmp_path / "state")
    found = modeldir.inspect(path)
    warm = {"read_cold": False, "disk_rate_bytes_per_s": None, "read_bytes": 4 * MIB, "read_seconds": 0.01,
            "read_readers": 4}
    modeldir.remember_rate(state, path, found, warm, now=1000.0)
    assert not os.path.exists(modeldir.rate_record_path(state, path))
    assert modeldir.remembered_rate(state, path, found, max_age_seconds=3600, now=1001.0) is None
