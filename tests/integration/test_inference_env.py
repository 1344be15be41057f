"""The inference_env role through a real ansible-playbook, against real venvs and real pip, offline.

What is real: Python venvs, pip, Ansible, the role and its modules, the simulated engine's wheel
(built from engines/sim by the role). What stands in: the `compressed-tensors`, `torch` and
`loguru` wheels are small wheels the session fixture builds (tests/helpers/envkit.py);
each `compressed-tensors` release has exactly the `CompressionFormat` members of the real release
(its git tag) and its kind of dependencies (0.16.0 asks for torch >= 2.10, as the real one does;
0.15.0.2 is deliberately broken). No index is reachable during the runs: pip's configuration is
ignored and every proxy points at a closed local port.

The playbook targets the inventory group `inference_env_targets`: localhost with a local
connection today; the same playbook runs against a systemd test host given its inventory.
"""
import os
import subprocess
import sys

import pytest

from tests.helpers import envkit
from tools import sim_wheels

NVFP4 = {"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized", "quantization_status": "compressed",
         "config_groups": {"group_0": {"targets": ["Linear"], "weights": {"num_bits": 4, "type": "float"}}}}
SIM_VERSION = "0.1.0"
SIM = "modelwake-sim==%s" % SIM_VERSION
# The lab installs the simulator as a build of one's own; these name the engines' own distributions.
SGLANG_ITSELF = {"inference_env_engine": "sglang", "inference_env_engine_package": "", "inference_env_engine_module": ""}
VLLM_ITSELF = {"inference_env_engine": "vllm", "inference_env_engine_package": "", "inference_env_engine_module": ""}


UV_VERSION = "0.13.8"


@pytest.fixture(scope="session")
def wheelhouses(tmp_path_factory):
    return envkit.build_wheelhouses(str(tmp_path_factory.mktemp("wheelhouses")))


@pytest.fixture(scope="session")
def uv_binary():
    """uv from PyPI, installed once into the cache (the index is needed that first time only)."""
    cache = os.path.join(os.environ.get("MODELWAKE_CACHE") or os.path.expanduser("~/.cache/modelwake"), "inference_env")
    target = os.path.join(cache, "uv-%s" % UV_VERSION)
    if not os.path.isdir(target):
        partial = target + ".partial"
        subprocess.run(["rm", "-rf", partial], check=True)
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--target", partial, "uv==%s" % UV_VERSION],
                       check=True)
        os.rename(partial, target)
    return os.path.join(target, "bin", "uv")


@pytest.fixture
def lab(tmp_path, wheelhouses):
    """One test's paths and a runner for the role with sensible test defaults."""

    class Lab:
        venv = str(tmp_path / "venv")
        marker = str(tmp_path / "restart-requested")
        stage = str(tmp_path / "stage")
        inventory = envkit.write_inventory(str(tmp_path / "inventory.ini"))

        def model(self, quantization_config, name="model"):
            return envkit.write_model(str(tmp_path / name), quantization_config)

        def run(self, check=False, **overrides):
            extravars = {
                "inference_env_venv": self.venv,
                "inference_env_python": envkit.base_python(),
                # The simulator as a build of one's own: another distribution, imported as modelwake_sim.
                "inference_env_engine": "sglang",
                "inference_env_engine_package": "modelwake-sim",
                "inference_env_engine_module": "modelwake_sim",
                "inference_env_engine_version": SIM_VERSION,
                "inference_env_wheelhouse": wheelhouses["main"],
                "inference_env_stage_dir": self.stage,
                "inference_env_test_marker": self.marker,
                # These wheelhouses are about compressed-tensors; py-spy's install is tested on the
                # test hosts' deploys (test_sim_sglang_deploy.py, test_collection_install.py).
                "inference_env_py_spy": False,
            }
            extravars.update(overrides)
            self.runs = getattr(self, "runs", 0) + 1
            return envkit.run_playbook(str(tmp_path / ("runner-%d" % self.runs)), self.inventory, extravars, check=check)

    return Lab()


def venv_python(venv):
    return os.path.join(venv, "bin", "python")


def enum_has(venv, member):
    """Ask the venv itself, as the engine would: CompressionFormat.<member>."""
    proc = envkit.run([venv_python(venv), "-c",
                       "from compressed_tensors.config import CompressionFormat; print(CompressionFormat.%s.value)" % member])
    return proc.returncode == 0


def assert_ok(run):
    assert run.rc == 0, run.stdout[-4000:]


# The wheel bootstrap (no ensurepip) is the K2.6 host's case: the `repaired` fixture below.
@pytest.mark.parametrize("case", ["absent-venv", "without-pip-auto", "uv-venv"])
def test_pip_bootstrap_offline(lab, case, request):
    """A missing venv is created; a venv without pip (--without-pip, or made by uv) gets pip from ensurepip."""
    if case == "uv-venv":
        proc = envkit.run([request.getfixturevalue("uv_binary"), "venv", "--python", envkit.base_python(), lab.venv])
        assert proc.returncode == 0, proc.stdout
        assert envkit.run([venv_python(lab.venv), "-m", "pip", "--version"]).returncode != 0
    elif case != "absent-venv":
        proc = envkit.run([envkit.base_python(), "-m", "venv", "--without-pip", lab.venv])
        assert proc.returncode == 0, proc.stdout
        assert envkit.run([venv_python(lab.venv), "-m", "pip", "--version"]).returncode != 0
    run = lab.run()
    assert_ok(run)
    result = run.result
    assert result["venv_created"] is (case == "absent-venv")
    assert result["pip_bootstrap"] == "ensurepip"
    pip = envkit.run([venv_python(lab.venv), "-m", "pip", "--version"])
    assert pip.returncode == 0, pip.stdout
    assert envkit.pip_freeze(lab.venv)["modelwake-sim"] == SIM_VERSION
    assert any(line.startswith("pip: bootstrapped with " + result["pip_bootstrap"]) for line in run.summary)
    assert os.path.exists(lab.marker), "a changed environment must notify 'restart model service'"


@pytest.fixture(scope="module")
def repaired(tmp_path_factory, wheelhouses):
    """The K2.6 host: torch 2.9 + compressed-tensors 0.8.1, no pip and (like Debian's python3 without python3-venv) no ensurepip
    to be had, an nvfp4 model. The role runs twice with the engine, its version and the model path;
    the rest is the test's plumbing (paths, the offline wheelhouse, which holds no pip wheel)."""
    base = tmp_path_factory.mktemp("repaired")

    class State:
        pass

    state = State()
    state.venv = envkit.make_venv(str(base / "venv"), wheelhouses["main"],
                                  ["torch==%s" % envkit.TORCH_OLD, "compressed-tensors==0.8.1"], with_pip=False)
    state.marker = str(base / "restart-requested")
    model = envkit.write_model(str(base / "model"), NVFP4)
    state.model_digest = envkit.tree_digest(model)
    inventory = envkit.write_inventory(str(base / "inventory.ini"))
    extravars = {
        "inference_env_engine": "sglang", "inference_env_engine_package": "modelwake-sim",
        "inference_env_engine_module": "modelwake_sim",
        "inference_env_engine_version": SIM_VERSION, "inference_env_model_path": model,
        # Plumbing. pip_bootstrap wheel is what a host without ensurepip gets under auto.
        "inference_env_venv": state.venv, "inference_env_pip_bootstrap": "wheel",
        "inference_env_wheelhouse": wheelhouses["nopip"],
        "inference_env_stage_dir": str(base / "stage"),
        "inference_env_test_marker": state.marker, "inference_env_py_spy": False,
    }
    state.before_has_member = enum_has(state.venv, "nvfp4_pack_quantized")
    state.before_has_pip = envkit.run([venv_python(state.venv), "-m", "pip", "--version"]).returncode == 0
    state.first = envkit.run_playbook(str(base / "runner-1"), inventory, extravars)
    state.first_marker = os.path.exists(state.marker)
    state.freeze_after_first = envkit.pip_freeze(state.venv)
    if state.first_marker:
        os.unlink(state.marker)
    state.second = envkit.run_playbook(str(base / "runner-2"), inventory, extravars)
    state.model_digest_after = envkit.tree_digest(model)
    return state


def test_the_venv_without_pip_gets_the_controllers_own_pip_wheel(repaired):
    assert not repaired.before_has_pip
    assert_ok(repaired.first)
    assert repaired.first.result["pip_bootstrap"] == "wheel"
    # The controller Python's ensurepip bundle (or Debian's python-wheels): what envkit finds the same way.
    wheel_version = os.path.basename(envkit.pip_wheel_path()).split("-")[1]
    assert envkit.run([venv_python(repaired.venv), "-m", "pip", "--version"]).stdout.startswith("pip %s " % wheel_version)


def test_nvfp4_model_gets_a_compressed_tensors_that_has_the_member(repaired):
    assert not repaired.before_has_member, "0.8.1 must lack nvfp4_pack_quantized, as in the K2.6 crash"
    assert_ok(repaired.first)
    assert enum_has(repaired.venv, "nvfp4_pack_quantized")
    ct = repaired.first.result["compressed_tensors"]
    assert (ct["before"], ct["after"], ct["requirement"], ct["required_by"]) == (
        "0.8.1", "0.15.0.1", ">=0.10.0", "nvfp4-pack-quantized")
    assert "compressed-tensors: 0.8.1 -> 0.15.0.1, >=0.10.0 required by nvfp4-pack-quantized" in repaired.first.summary


def test_upgrade_keeps_torch_and_installs_dependencies(repaired):
    freeze = repaired.freeze_after_first
    # 0.16.0 is in the wheelhouse but wants torch >= 2.10: the pin on torch makes pip settle on 0.15.0.1.
    assert freeze["torch"] == envkit.TORCH_OLD
    assert freeze["compressed-tensors"] == "0.15.0.1"
    # Not --no-deps: the new release's declared dependency came along.
    assert freeze["loguru"] == "0.7.3"


def test_second_run_changes_nothing_and_requests_no_restart(repaired):
    assert repaired.first.changed > 0 and repaired.first_marker
    assert_ok(repaired.second)
    assert repaired.second.changed == 0, repaired.second.stdout[-4000:]
    assert not os.path.exists(repaired.marker)
    assert envkit.pip_freeze(repaired.venv) == repaired.freeze_after_first


def test_model_files_are_never_written(repaired):
    assert repaired.model_digest_after == repaired.model_digest


def test_an_engine_in_the_venv_is_kept_without_a_version_and_a_missing_one_needs_it(lab, wheelhouses):
    envkit.make_venv(lab.venv, wheelhouses["main"], ["sglang==%s" % envkit.SGLANG_KEPT])
    before = envkit.pip_freeze(lab.venv)
    run = lab.run(**SGLANG_ITSELF, inference_env_engine_version="")
    assert_ok(run)
    assert run.changed == 0 and envkit.pip_freeze(lab.venv) == before
    assert "engine sglang: %s (unchanged) (version: kept: already in the venv)" % envkit.SGLANG_KEPT in run.summary
    # A venv without vllm: nothing to keep, so the version is needed; refused before any change.
    run = lab.run(**VLLM_ITSELF, inference_env_engine_version="")
    assert run.rc != 0
    assert ("inference_env_engine_version must name the exact vllm release to install (e.g. 0.5.23): %s has no "
            "vllm to keep" % lab.venv) in " ".join(run.stdout.split())
    assert envkit.pip_freeze(lab.venv) == before and not os.path.exists(lab.marker)


def test_the_engine_comes_from_an_extra_wheel_directory_without_an_index(lab, tmp_path):
    # The simulator's wheel as the demo builds it, and no wheelhouse: pip installs it with no index.
    wheels = sim_wheels.build(str(tmp_path / "sim-wheels"), py_spy="")
    run = lab.run(inference_env_wheelhouse="", inference_env_extra_wheel_dirs=[wheels])
    assert_ok(run)
    assert envkit.pip_freeze(lab.venv)["modelwake-sim"] == SIM_VERSION
    assert any(line.startswith("engine sglang: absent -> %s (version: inference_env_engine_version" % SIM_VERSION)
               for line in run.summary), run.summary


@pytest.mark.parametrize("groups, installed, expected, required_by", [
    ({"group_0": "nvfp4-pack-quantized", "group_1": "mxfp8-quantized"}, "0.11.0", "0.15.0.1", "mxfp8-quantized"),
    ({"group_0": "nvfp4-pack-quantized", "group_1": "pack-quantized"}, "0.11.0", "0.11.0", "mixed-precision"),
    # (Which release each mix needs is tests/unit/test_inference_env_pyenv.py's; here: one upgrade, one kept.)
])
def test_mixed_precision_reads_every_group_format(lab, wheelhouses, groups, installed, expected, required_by):
    # The engine is already there, so the compressed-tensors decision is the only possible change.
    envkit.make_venv(lab.venv, wheelhouses["main"], ["torch==%s" % envkit.TORCH_OLD, "compressed-tensors==%s" % installed, SIM])
    model = lab.model({"quant_method": "compressed-tensors", "format": "mixed-precision",
                       "config_groups": dict((g, {"format": f, "weights": {"num_bits": 4}}) for g, f in groups.items())})
    run = lab.run(inference_env_model_path=model)
    assert_ok(run)
    ct = run.result["compressed_tensors"]
    assert (ct["after"], ct["required_by"]) == (expected, required_by)
    assert sorted(ct["formats"]) == sorted(["mixed-precision"] + list(groups.values()))
    for fmt in ct["formats"]:
        assert enum_has(lab.venv, fmt.replace("-", "_"))
    assert (run.changed > 0) is (installed != expected)
    assert os.path.exists(lab.marker) is (installed != expected)


def test_pin_too_old_for_the_model_fails_before_any_change(lab, wheelhouses):
    envkit.make_venv(lab.venv, wheelhouses["main"], ["torch==%s" % envkit.TORCH_OLD, "compressed-tensors==0.8.1"])
    model = lab.model({"quant_method": "compressed-tensors", "format": "mxfp8-quantized"})
    digest, freeze = envkit.tree_digest(lab.venv), envkit.pip_freeze(lab.venv)
    run = lab.run(inference_env_model_path=model, inference_env_compressed_tensors_version="0.11.0")
    assert run.rc != 0
    message = " ".join(run.failures)
    for needle in ("inference_env_compressed_tensors_version=0.11.0", "'mxfp8-quantized'", ">= 0.15.0"):
        assert needle in message
    assert run.changed == 0
    assert envkit.tree_digest(lab.venv) == digest
    assert envkit.pip_freeze(lab.venv) == freeze
    assert not os.path.exists(lab.stage) and not os.path.exists(lab.marker)


def test_failed_install_rolls_back_to_the_exact_previous_versions(lab, wheelhouses):
    envkit.make_venv(lab.venv, wheelhouses["broken"], ["torch==%s" % envkit.TORCH_OLD, "compressed-tensors==0.8.1", SIM])
    model = lab.model(NVFP4)
    before = envkit.pip_freeze(lab.venv)
    run = lab.run(inference_env_wheelhouse=wheelhouses["broken"], inference_env_model_path=model,
                  inference_env_compressed_tensors_version=envkit.BROKEN_CT)
    assert run.rc != 0
    message = " ".join(run.failures)
    assert "deliberately broken test release" in message
    assert "Rolled back: the venv's packages are exactly as before" in message
    after = envkit.pip_freeze(lab.venv)
    assert after == before, "pip freeze after the rollback must equal the freeze before the attempt"
    assert after["compressed-tensors"] == "0.8.1" and "loguru" not in after
    assert not os.path.exists(lab.marker)


def test_check_mode_reports_changes_and_changes_nothing(lab, wheelhouses):
    envkit.make_venv(lab.venv, wheelhouses["main"], ["torch==%s" % envkit.TORCH_OLD, "compressed-tensors==0.8.1"])
    model = lab.model(NVFP4)
    digest = envkit.tree_digest(lab.venv)
    run = lab.run(check=True, inference_env_model_path=model)
    assert_ok(run)
    assert run.changed > 0
    assert "compressed-tensors: 0.8.1 -> would be >=0.10.0, >=0.10.0 required by nvfp4-pack-quantized" in run.summary
    assert envkit.tree_digest(lab.venv) == digest
    assert not os.path.exists(lab.stage) and not os.path.exists(lab.marker)


def test_check_mode_on_a_host_without_the_venv_creates_nothing(lab):
    run = lab.run(check=True)
    assert_ok(run)
    assert run.changed > 0
    assert run.result["venv_created"] is True
    assert not os.path.exists(lab.venv)


@pytest.mark.parametrize("overrides, needle", [
    ({"inference_env_engine": "tgi"}, "inference_env_engine"),
    ({"inference_env_extra_wheel_dirs": ["/nonexistent/wheels"]}, "inference_env_extra_wheel_dirs: /nonexistent/wheels not a directory on the controller"),
    ({"inference_env_venv": "relative/venv"}, "inference_env_venv must be an absolute path"),
    (dict(VLLM_ITSELF, inference_env_engine_version=""), "inference_env_engine_version must name the exact"),
    ({"inference_env_wheelhouse": "/nonexistent/wheelhouse"}, "inference_env_wheelhouse /nonexistent/wheelhouse is not a directory"),
    ({"inference_env_model_path": "/nonexistent/model"}, "inference_env_model_path: /nonexistent/model has no config.json"),
    ({"inference_env_compressed_tensors_version": "latest"}, "inference_env_compressed_tensors_version: 'latest' is not a valid version"),
])
def test_bad_input_is_named_and_changes_nothing(lab, overrides, needle):
    run = lab.run(**overrides)
    assert run.rc != 0
    assert needle in " ".join(run.failures), run.failures
    assert run.changed == 0
    assert not os.path.exists(lab.venv)


def test_a_model_without_compressed_tensors_changes_nothing(lab, wheelhouses):
    envkit.make_venv(lab.venv, wheelhouses["main"], ["torch==%s" % envkit.TORCH_OLD, "compressed-tensors==0.8.1", SIM])
    freeze = envkit.pip_freeze(lab.venv)
    model = lab.model({"quant_method": "fp8", "weight_block_size": [128, 128]})
    run = lab.run(inference_env_model_path=model)
    assert_ok(run)
    assert run.changed == 0 and not os.path.exists(lab.marker)
    assert envkit.pip_freeze(lab.venv) == freeze
    assert run.result["compressed_tensors"]["requirement"] is None


def test_pip_check_conflicts_are_warnings_quoting_the_lines(lab, wheelhouses, tmp_path):
    """An engine that pins compressed-tensors exactly (as vLLM does) conflicts after the upgrade: warn, do not fail."""
    house = str(tmp_path / "wheelhouse")
    subprocess.run(["cp", "-r", wheelhouses["main"], house], check=True)
    envkit.make_wheel(house, "pinning-engine", "1.0", {"pinning_engine/__init__.py": ""}, ["compressed-tensors==0.8.1"])
    envkit.make_venv(lab.venv, house, ["torch==%s" % envkit.TORCH_OLD, "pinning-engine==1.0"])
    run = lab.run(inference_env_wheelhouse=house, inference_env_model_path=lab.model(NVFP4))
    assert_ok(run)
    conflicts = run.result["conflicts"]
    assert any("pinning-engine 1.0 has requirement compressed-tensors==0.8.1" in line for line in conflicts), conflicts
    assert any("pinning-engine 1.0 has requirement compressed-tensors==0.8.1" in w for w in run.warnings)
