"""The inference_env role with the REAL compressed-tensors wheels and the real torch 2.13.0 (CPU).

The K2.6 repair end to end without stand-ins: a venv holding torch 2.13.0, transformers and
compressed-tensors 0.8.1 (whose CompressionFormat lacks nvfp4_pack_quantized) and a model whose
config.json uses nvfp4-pack-quantized. The role must upgrade to the real 0.15.0.1 offline, bring
its declared dependency loguru, leave torch alone and prove the member exists by importing it.

The real wheels (about 240 MB, torch included) are downloaded once into
${MODELWAKE_CACHE:-~/.cache/modelwake}/inference_env/real-wheels with pip's own configuration (the
index is needed that first time only); the venv holding torch is built once from them, offline,
and copied for each run. The role's runs themselves reach no index.
"""
import os
import shutil

import pytest

from tests.helpers import envkit
from tests.helpers.realwheels import NVFP4, TORCH, cached, timed, wheelhouse
from tools import sim_wheels

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    timings = {}
    _wheels, template = cached(timings)
    base = tmp_path_factory.mktemp("real")
    house = wheelhouse(str(base / "wheelhouse"))
    venv = str(base / "venv")
    timed("copy the torch venv", timings, shutil.copytree, template, venv, True)
    return {"base": base, "venv": venv, "house": house, "timings": timings}


def test_real_compressed_tensors_upgrade_keeps_torch(real, record_property):
    timings, base, venv = real["timings"], real["base"], real["venv"]
    before = envkit.pip_freeze(venv)
    assert before["compressed-tensors"] == "0.8.1" and before["torch"].startswith(TORCH)
    model = envkit.write_model(str(base / "model"), NVFP4)
    inventory = envkit.write_inventory(str(base / "inventory.ini"))
    extravars = {
        "inference_env_venv": venv, "inference_env_engine": "sglang",
        "inference_env_engine_package": "modelwake-sim", "inference_env_engine_module": "modelwake_sim",
        "inference_env_engine_version": "0.1.0",
        "inference_env_wheelhouse": real["house"], "inference_env_model_path": model,
        "inference_env_stage_dir": str(base / "stage"),
        # The simulated engine's wheel, built here as the demo builds it (no py-spy: not installed here).
        "inference_env_extra_wheel_dirs": [sim_wheels.build(str(base / "sim-wheels"), py_spy="")],
        "inference_env_test_marker": str(base / "restart-requested"), "inference_env_py_spy": False,
    }
    first = timed("role run 1 (upgrade)", timings, envkit.run_playbook, str(base / "r1"), inventory, extravars)
    assert first.rc == 0, first.stdout[-4000:]
    after = envkit.pip_freeze(venv)
    assert after["compressed-tensors"] == "0.15.0.1"
    assert after["torch"] == before["torch"]
    assert "loguru" in after
    proc = envkit.run([os.path.join(venv, "bin", "python"), "-c",
                       "from compressed_tensors.config import CompressionFormat; print(CompressionFormat.nvfp4_pack_quantized.value)"])
    assert proc.returncode == 0 and proc.stdout.strip().endswith("nvfp4-pack-quantized"), proc.stdout[-2000:]
    ct = first.result["compressed_tensors"]
    assert (ct["before"], ct["after"], ct["required_by"]) == ("0.8.1", "0.15.0.1", "nvfp4-pack-quantized")
    second = timed("role run 2 (no change)", timings, envkit.run_playbook, str(base / "r2"), inventory, extravars)
    assert second.rc == 0 and second.changed == 0, second.stdout[-4000:]
    for label, seconds in timings.items():
        record_property(label, seconds)
    print("inference_env real-wheel timings (s): %r" % timings)
