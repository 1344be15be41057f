"""`make-model`: a Kimi-K2.6-like model directory with real safetensors shards of a chosen size.

Everything is derived deterministically from (size, shards, quantization), so a second run can
check what is there and skip it: idempotent, and cheap when the model is already complete.
"""
import json
import os
import random

from . import safetensors

QUANTIZATIONS = ("nvfp4-pack-quantized", "pack-quantized", "mixed-precision", "none")
ARCHITECTURE = "DeepseekV3ForCausalLM"
TENSORS_PER_SHARD = 4
NUM_LAYERS = 61
NUM_EXPERTS = 384
WRITE_BUFFER = 8 * 1024 * 1024
MIB = 1024 * 1024


class ModelError(Exception):
    """Bad make-model input; the message names the option."""


def shard_name(index, total):
    """`model-00001-of-00064.safetensors`, the Hugging Face naming."""
    return "model-%05d-of-%05d.safetensors" % (index + 1, total)


def _weights_scheme(fmt):
    """One compressed-tensors config group for a per-group format."""
    if fmt == "nvfp4-pack-quantized":
        weights = {"num_bits": 4, "type": "float", "symmetric": True, "group_size": 16,
                   "strategy": "tensor_group", "dynamic": False, "actorder": None, "observer": "minmax"}
        acts = {"num_bits": 4, "type": "float", "symmetric": True, "group_size": 16,
                "strategy": "tensor_group", "dynamic": "local", "actorder": None, "observer": "minmax"}
    elif fmt == "pack-quantized":
        # Kimi-K2.6's published scheme: W4A16 INT4, group size 32 (its config.json).
        weights = {"num_bits": 4, "type": "int", "symmetric": True, "group_size": 32,
                   "strategy": "group", "dynamic": False, "actorder": None, "observer": "minmax"}
        acts = None
    else:  # float-quantized: FP8 attention, the second group of the mixed-precision variant
        weights = {"num_bits": 8, "type": "float", "symmetric": True, "group_size": None,
                   "strategy": "channel", "dynamic": False, "actorder": None, "observer": "minmax"}
        acts = {"num_bits": 8, "type": "float", "symmetric": True, "group_size": None,
                "strategy": "token", "dynamic": True, "actorder": None, "observer": None}
    return {"weights": weights, "input_activations": acts, "output_activations": None, "format": fmt}


def quantization_config(quantization):
    """The `quantization_config` block of config.json, or None for an unquantized model."""
    if quantization == "none":
        return None
    if quantization == "mixed-precision":
        groups = {"group_0": dict(_weights_scheme("pack-quantized"), targets=["re:.*mlp.experts.*"]),
                  "group_1": dict(_weights_scheme("float-quantized"), targets=["re:.*self_attn.*"])}
    else:
        groups = {"group_0": dict(_weights_scheme(quantization), targets=["Linear"])}
    return {
        "quant_method": "compressed-tensors",
        "format": quantization,
        "quantization_status": "compressed",
        "config_groups": groups,
        "ignore": ["lm_head", "re:.*mlp.gate$"],
        "kv_cache_scheme": None,
        "global_compression_ratio": None,
        "sparsity_config": {},
        "version": "0.15.0.1",
    }


def model_config(quantization):
    """config.json: a DeepSeek-V3-architecture (Kimi K2) text model."""
    config = {
        "architectures": [ARCHITECTURE],
        "model_type": "kimi_k2",
        "auto_map": {"AutoConfig": "configuration_deepseek.DeepseekV3Config",
                     "AutoModelForCausalLM": "modeling_deepseek.DeepseekV3ForCausalLM"},
        "hidden_size": 7168,
        "intermediate_size": 18432,
        "moe_intermediate_size": 2048,
        "num_hidden_layers": NUM_LAYERS,
        "num_attention_heads": 64,
        "num_key_value_heads": 64,
        "n_routed_experts": NUM_EXPERTS,
        "n_shared_experts": 1,
        "num_experts_per_tok": 8,
        "first_k_dense_replace": 1,
        "kv_lora_rank": 512,
        "q_lora_rank": 1536,
        "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64,
        "v_head_dim": 128,
        "max_position_embeddings": 262144,
        "vocab_size": 163840,
        "rope_theta": 50000.0,
        "torch_dtype": "bfloat16",
        "tie_word_embeddings": False,
        "bos_token_id": 163584,
        "eos_token_id": 163585,
    }
    quant = quantization_config(quantization)
    if quant is not None:
        config["quantization_config"] = quant
    return config


def plan(size_mib, shards, quantization):
    """Return {shard file name: [(tensor, dtype, shape, nbytes), ...]}: the whole layout."""
    if size_mib < 1:
        raise ModelError("--size-mib must be at least 1 (got %s)" % size_mib)
    if shards < 1 or shards > 99999:
        raise ModelError("--shards must be between 1 and 99999 (got %s)" % shards)
    if quantization not in QUANTIZATIONS:
        raise ModelError("--quantization must be one of %s (got %r)" % (", ".join(QUANTIZATIONS), quantization))
    total = size_mib * MIB
    layout = {}
    tensor_no = 0
    for index in range(shards):
        shard_bytes = total // shards + (1 if index < total % shards else 0)
        tensors = []
        for part in range(TENSORS_PER_SHARD):
            nbytes = shard_bytes // TENSORS_PER_SHARD + (1 if part < shard_bytes % TENSORS_PER_SHARD else 0)
            layer = tensor_no // NUM_EXPERTS % NUM_LAYERS
            expert = tensor_no % NUM_EXPERTS
            if quantization == "none":
                name = "model.layers.%d.mlp.experts.%d.down_proj.weight" % (layer, expert)
            else:
                name = "model.layers.%d.mlp.experts.%d.down_proj.weight_packed" % (layer, expert)
            tensors.append((name, "U8", [nbytes], nbytes))
            tensor_no += 1
        layout[shard_name(index, shards)] = tensors
    return layout


def _shard_is_complete(path, header_bytes, expected_size):
    """True when the file has the expected size and starts with the expected header."""
    try:
        if os.path.getsize(path) != expected_size:
            return False
        with open(path, "rb") as fileobj:
            return fileobj.read(len(header_bytes)) == header_bytes
    except OSError:
        return False


def _write_file_atomic(path, data):
    tmp = path + ".tmp"
    with open(tmp, "wb") as fileobj:
        fileobj.write(data)
    os.replace(tmp, path)


def _write_shard(path, header_bytes, data_bytes, block):
    """Write header then `data_bytes` of incompressible filler, through a temporary name."""
    tmp = path + ".tmp"
    with open(tmp, "wb", buffering=0) as fileobj:
        fileobj.write(header_bytes)
        left = data_bytes
        view = memoryview(block)
        while left > 0:
            chunk = min(left, len(block))
            fileobj.write(view[:chunk])
            left -= chunk
        # On disk before it is used, as a downloaded model is: dirty pages stay in the page cache
        # whatever posix_fadvise(DONTNEED) asks, so the preflight's cold read and the engine's
        # "cold" load would both read memory instead of the disk.
        os.fsync(fileobj.fileno())
    os.replace(tmp, path)


def make_model(directory, size_mib=2048, shards=64, quantization="nvfp4-pack-quantized", out=None):
    """Create or complete the model directory; return {"written": [...], "kept": [...]}."""
    layout = plan(size_mib, shards, quantization)
    directory = os.path.abspath(directory)
    if os.path.exists(directory) and not os.path.isdir(directory):
        raise ModelError("model directory %s exists and is not a directory: pass a directory path" % directory)
    os.makedirs(directory, exist_ok=True)
    written, kept = [], []
    config_bytes = (json.dumps(model_config(quantization), indent=2) + "\n").encode("utf-8")
    weight_map = {}
    for name, tensors in layout.items():
        for tensor in tensors:
            weight_map[tensor[0]] = name
    index = {"metadata": {"total_size": size_mib * MIB}, "weight_map": weight_map}
    index_bytes = (json.dumps(index, indent=2) + "\n").encode("utf-8")
    # Random filler so compressing or deduplicating filesystems cannot turn the read into a no-op.
    block = random.Random(0x6D77).getrandbits(WRITE_BUFFER * 8).to_bytes(WRITE_BUFFER, "little")
    for name, tensors in layout.items():
        path = os.path.join(directory, name)
        header_bytes = safetensors.encode_header(tensors, {"format": "pt"})
        data_bytes = sum(t[3] for t in tensors)
        if _shard_is_complete(path, header_bytes, len(header_bytes) + data_bytes):
            kept.append(name)
            continue
        _write_shard(path, header_bytes, data_bytes, block)
        written.append(name)
    for name, data in (("config.json", config_bytes), ("model.safetensors.index.json", index_bytes)):
        path = os.path.join(directory, name)
        try:
            with open(path, "rb") as fileobj:
                same = fileobj.read() == data
        except OSError:
            same = False
        if same:
            kept.append(name)
        else:
            _write_file_atomic(path, data)
            written.append(name)
    # Shards of an earlier layout (other --shards) would confuse a loader globbing *.safetensors.
    for name in sorted(os.listdir(directory)):
        if name.endswith(".safetensors") and name.startswith("model-") and name not in layout:
            os.unlink(os.path.join(directory, name))
            written.append(name)
    return {"written": written, "kept": kept}
