"""The vLLM CPU build's tiny model (tools/vllm_cpu.py), made locally, never from a hub.

Real vLLM starts are tested where they are used, shared by the cases (each costs ~40 s of both
cores): on a test host by deploy-k26.yml, under the launcher (test_vllm_deploy.py: ready, the
truncated shard's SafetensorError, the stopped worker, the port taken). The engine's
own behaviour the classifier relies on (refused until ready, the markers' order, the root cause
before the final error) is replayed from recordings (tests/fixtures/traces/, test_classifier_recorded.py)."""
import json
import os
import shutil

import pytest

from tests.helpers.realengine import vllm_python  # noqa: F401 (pytest fixture)
from tools import vllm_cpu

pytestmark = pytest.mark.slow


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
