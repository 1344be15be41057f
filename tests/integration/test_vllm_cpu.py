"""A REAL vLLM server (CPU build, tiny local model): the facts the readiness module relies on.
Few tests on purpose: each real start costs ~20 s on 2 cores. The module watching real starts is
tested where it is used: on a test host by deploy-k26.yml (test_vllm_deploy.py: ready, the
truncated shard's SafetensorError, the stopped worker) and under the launcher (test_launcher_vllm.py)."""
import json
import os
import shutil

import pytest

from realengine import real_vllm, tiny_model, vllm_cpu, vllm_python  # noqa: F401 (pytest fixtures)

pytestmark = pytest.mark.slow

# The lines the module's vLLM markers depend on, in the order a start prints them.
START_MARKERS = ("Starting to load model", "Loading weights took", "Application startup complete.")


def first_index(lines, needle):
    return next((i for i, line in enumerate(lines) if needle in line), None)


def truncated_copy(model_dir, tmp_path):
    return vllm_cpu.damaged_copy(model_dir, str(tmp_path / "truncated-model"), "truncated-shard")


def test_start_to_ready_refuses_then_answers(real_vllm, tiny_model):
    server = real_vllm(tiny_model)
    probes = server.probe_until_ready()

    # Before ready nothing answers: the socket is bound early but listens only when ready.
    before = probes[:-2]
    assert before, "the first probe already found the server ready: nothing observed while starting"
    assert all(status is None and "Connection refused" in error for _, _, status, error in before), before
    status, text = vllm_cpu.completion(server.url)
    assert (status, bool(text.strip())) == (200, True), (status, text)
    status, body = vllm_cpu.http(server.url + "/v1/models")
    assert status == 200 and [m["id"] for m in json.loads(body)["data"]] == [vllm_cpu.SERVED_NAME]

    lines = server.log_lines()
    positions = [first_index(lines, marker) for marker in START_MARKERS]
    assert None not in positions, dict(zip(START_MARKERS, positions))
    assert positions == sorted(positions), dict(zip(START_MARKERS, positions))
    assert server.popen.poll() is None


def test_truncated_shard_fails_with_safetensor_error(real_vllm, tiny_model, tmp_path):
    server = real_vllm(truncated_copy(tiny_model, tmp_path))
    assert server.wait_exit() == 1
    lines = server.log_lines()
    root_cause = first_index(lines, "SafetensorError")
    final = max(i for i, line in enumerate(lines) if line.startswith("RuntimeError: Engine core initialization failed"))
    assert root_cause is not None and root_cause < final, lines[-30:]
    assert "incomplete metadata, file not fully covered" in lines[root_cause]


def test_tiny_model_is_generated_locally_and_cached(vllm_python, tmp_path):
    """The model comes from no hub; a second make is a no-op; model vocab == tokenizer vocab."""
    target = str(tmp_path / "model")
    vllm_cpu.make_model(target)
    made = os.path.getmtime(os.path.join(target, "model.safetensors"))
    vllm_cpu.make_model(target)
    assert os.path.getmtime(os.path.join(target, "model.safetensors")) == made
    with open(os.path.join(target, "config.json")) as handle:
        config = json.load(handle)
    with open(os.path.join(target, "tokenizer.json")) as handle:
        tokenizer = json.load(handle)
    vocab = len(tokenizer["model"]["vocab"]) + len([t for t in tokenizer["added_tokens"]
                                                    if t["content"] not in tokenizer["model"]["vocab"]])
    assert (config["head_dim"], config["num_hidden_layers"], config["vocab_size"]) == (64, 2, vocab)
    shutil.rmtree(target)
