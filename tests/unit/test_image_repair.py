"""The compressed-tensors repair of a container image as a thin derived image (module_utils/python_env/
image_repair.py), against a scripted container runtime: the words it says to Podman or Docker, what it leaves
on the host when the repair succeeds, is found again, is not needed, or fails."""
import json
import re

import pytest

from ansible_collections.modelwake.serving.plugins.module_utils.python_env import image_repair
from ansible_collections.modelwake.serving.plugins.module_utils.python_env.image_repair import ImageRepair
from ansible_collections.modelwake.serving.plugins.module_utils.python_env.pyenv import SNAPSHOT_SCRIPT, PyEnvError

BASE = "sha256:" + "ab" * 32
CLI = "/usr/bin/podman"
CONTAINER = "modelwake-repair-" + "ab" * 6
NVFP4 = "nvfp4-pack-quantized"


class FakeRuntime(object):
    """A container runtime's client as the repair uses it: images with labels and a config, one container at
    a time whose Python holds packages, and pip that installs what the wheelhouse holds."""

    def __init__(self, packages, wheels=("compressed-tensors==0.15.0.1",), pip_breaks_enum=False):
        self.images = {BASE: {"Labels": {"vendor": "x"}, "Entrypoint": None, "Cmd": ["bash"]}}
        self.base_packages = dict(packages)
        self.wheels = list(wheels)
        self.pip_breaks_enum = pip_breaks_enum
        self.containers = {}
        self.calls = []
        self.commits = 0

    def __call__(self, argv):
        assert argv[0] == CLI
        words = argv[1:]
        self.calls.append(words)
        verb = words[0]
        if verb == "images":
            wanted = words[words.index("--filter") + 1][len("label=" + image_repair.LABEL_BASE + "="):]
            return 0, "".join(i + "\n" for i, c in self.images.items()
                              if (c["Labels"] or {}).get(image_repair.LABEL_BASE) == wanted), ""
        if verb == "image" and words[1] == "inspect":
            config = self.images[words[-1]]
            return 0, json.dumps(config["Labels"] if words[3].endswith(".Config.Labels}}") else config), ""
        if verb == "rm":
            self.containers.pop(words[-1], None)
            return 0, "", ""
        if verb == "run":
            name = words[words.index("--name") + 1]
            assert words[words.index("--entrypoint") + 1] == "python3" and BASE in words
            self.containers[name] = {"packages": dict(self.base_packages), "running": True, "argv": words}
            return 0, "f00d\n", ""
        if verb == "exec":
            return self.python(self.containers[words[1]], words[3:])
        if verb == "stop":
            self.containers[words[-1]]["running"] = False
            return 0, "", ""
        if verb == "commit":
            changes = [words[i + 1] for i, word in enumerate(words) if word == "--change"]
            self.commits += 1
            new = "sha256:" + ("%02d" % self.commits) * 32
            labels = dict(change.split(" ", 1)[1].split("=", 1) for change in changes if change.startswith("LABEL "))
            config = {"Labels": labels}
            for change in changes:
                if not change.startswith("LABEL "):
                    key, value = change.split(" ", 1)
                    config[key.title()] = json.loads(value)
            self.images[new] = config
            return 0, new[len("sha256:"):] + "\n", ""
        if verb == "rmi":
            self.images.pop(words[-1])
            return 0, "", ""
        raise AssertionError("unexpected command %r" % (words,))

    def python(self, container, args):
        assert container["running"]
        packages = container["packages"]
        if args[:3] == ["-I", "-B", "-c"] and args[3] == SNAPSHOT_SCRIPT:
            return 0, json.dumps(packages), ""
        if args[:3] == ["-I", "-B", "-c"]:  # the verification script: nvfp4 needs compressed-tensors >= 0.10
            has = packages.get("compressed-tensors", "0").split(".")[:2] >= ["0", "10"] and not self.pip_breaks_enum
            report = {"missing": [] if has else ["nvfp4_pack_quantized"]}
            return (0 if has else 1), json.dumps(report), ""
        if args[:3] == ["-m", "pip", "install"]:
            name = re.split("[=>]=", args[-1])[0]
            match = [w for w in self.wheels if w.startswith(name + "==")]
            if not match:
                return 1, "", "ERROR: Could not find a version that satisfies the requirement %s" % args[-1]
            packages[name] = match[0].split("==")[1]
            return 0, "Successfully installed", ""
        raise AssertionError("unexpected python %r" % (args,))


def repair(runtime, tmp_path, **kw):
    return ImageRepair(runtime, CLI, BASE, "compressed-tensors", "0.10.0", "minimum", protect=["torch"],
                       verify_module="compressed_tensors.config", verify_attribute="CompressionFormat",
                       verify_values=[NVFP4], wheelhouse="/var/cache/wh", work_dir=str(tmp_path), **kw)


OLD = {"torch": "2.13.0+cpu", "compressed-tensors": "0.8.1", "pip": "23.0.1"}


def test_an_image_that_lacks_the_format_is_derived_with_torch_held_and_labelled(tmp_path):
    runtime = FakeRuntime(OLD)
    result = repair(runtime, tmp_path).apply()
    assert result["changed"] and result["derived"] and result["image"] == "sha256:" + "01" * 32
    assert (result["before"], result["after"]) == ("0.8.1", "0.15.0.1")
    assert result["diff"]["changed"] == {"compressed-tensors": ["0.8.1", "0.15.0.1"]}
    # The container: the base image, no network, the wheelhouse read-only, idle under the image's Python.
    run = [c for c in runtime.calls if c[0] == "run"][0]
    assert "--network=none" in run and "/var/cache/wh:%s:ro" % image_repair.WHEELHOUSE_MOUNT in run
    assert run[-3:] == [BASE, "-c", image_repair.IDLE]
    # pip from the wheelhouse alone, torch held where it is by the constraints file.
    pip = [c for c in runtime.calls if c[:6] == ["exec", CONTAINER, "python3", "-m", "pip", "install"]][0]
    assert pip[-1] == "compressed-tensors>=0.10.0"
    assert pip[pip.index("--find-links") + 1] == image_repair.WHEELHOUSE_MOUNT and "--no-index" in pip
    constraint = pip[pip.index("--constraint") + 1]
    assert constraint.startswith(image_repair.CONSTRAINTS_MOUNT + "/")
    assert (tmp_path / "constraints" / constraint.rsplit("/", 1)[1]).read_text() == "torch==2.13.0+cpu\n"
    # Committed only after the verification, stopped first; the base's Entrypoint and Cmd kept, the labels found again.
    verbs = [c[0] for c in runtime.calls]
    assert verbs.index("stop") < verbs.index("commit") and verbs[-1] == "rm"
    derived = runtime.images[result["image"]]
    assert derived["Labels"] == {image_repair.LABEL_BASE: BASE,
                                 image_repair.LABEL_SPEC: "compressed-tensors/minimum/0.10.0"}
    assert (derived["Entrypoint"], derived["Cmd"]) == ([], ["bash"])
    assert runtime.containers == {}


def test_a_rerun_finds_the_derived_image_by_its_labels_and_starts_nothing(tmp_path):
    runtime = FakeRuntime(OLD)
    first = repair(runtime, tmp_path).apply()
    runtime.calls = []
    again = repair(runtime, tmp_path).apply()
    assert (again["changed"], again["derived"], again["image"]) == (False, True, first["image"])
    assert [c[0] for c in runtime.calls] == ["images", "image"]
    # Check mode finds it the same way.
    assert repair(runtime, tmp_path).apply(check_mode=True)["image"] == first["image"]


def test_a_repair_for_another_release_is_not_taken_for_this_one(tmp_path):
    runtime = FakeRuntime(OLD)
    repair(runtime, tmp_path).apply()
    other = ImageRepair(runtime, CLI, BASE, "compressed-tensors", "0.15.0.1", "exact", wheelhouse="/wh",
                        work_dir=str(tmp_path)).apply()
    assert other["changed"] and other["image"] == "sha256:" + "02" * 32


def test_an_image_that_has_what_the_model_needs_is_run_as_it_is(tmp_path):
    runtime = FakeRuntime(dict(OLD, **{"compressed-tensors": "0.12.0"}))
    result = repair(runtime, tmp_path).apply()
    assert (result["changed"], result["derived"], result["image"]) == (False, False, BASE)
    assert runtime.commits == 0 and runtime.containers == {} and list(runtime.images) == [BASE]


def test_an_image_that_needs_no_repair_is_read_in_a_container_once(tmp_path):
    runtime = FakeRuntime(dict(OLD, **{"compressed-tensors": "0.12.0"}))
    state = str(tmp_path / "reads")
    # Check mode reads it in a container and keeps no record.
    assert repair(runtime, tmp_path, state_dir=state, record_reads=False).apply(check_mode=True)["image"] == BASE
    assert not (tmp_path / "reads").exists()
    # The first run reads it in a container, the next ones in the record: no container.
    first = repair(runtime, tmp_path, state_dir=state).apply()
    assert [c for c in runtime.calls if c[0] == "run"]
    runtime.calls = []
    again = repair(runtime, tmp_path, state_dir=state).apply()
    assert [c[0] for c in runtime.calls] == ["images"], runtime.calls
    assert (again["changed"], again["image"], again["before"]) == (False, BASE, first["before"]) == (False, BASE, "0.12.0")
    assert "read on an earlier run" in again["msg"]
    assert repair(runtime, tmp_path, state_dir=state).apply(check_mode=True)["image"] == BASE
    assert [c[0] for c in runtime.calls] == ["images", "images"]
    # Another repair, or the same one verified for other formats, is read again.
    other = ImageRepair(runtime, CLI, BASE, "compressed-tensors", "0.11.0", "minimum", state_dir=state,
                        work_dir=str(tmp_path)).apply()
    assert other["image"] == BASE and [c for c in runtime.calls if c[0] == "run"]
    runtime.calls = []
    ImageRepair(runtime, CLI, BASE, "compressed-tensors", "0.10.0", "minimum", verify_module="compressed_tensors.config",
                verify_attribute="CompressionFormat", verify_values=["pack-quantized"], state_dir=state,
                work_dir=str(tmp_path)).apply()
    assert [c for c in runtime.calls if c[0] == "run"]


def test_an_image_that_needs_the_repair_is_not_remembered_as_read(tmp_path):
    runtime = FakeRuntime(OLD, wheels=())
    state = str(tmp_path / "reads")
    assert repair(runtime, tmp_path, state_dir=state).apply(check_mode=True)["action"] == "install"
    with pytest.raises(PyEnvError):
        repair(runtime, tmp_path, state_dir=state).apply()
    assert not (tmp_path / "reads").exists()


def test_check_mode_reads_the_base_image_and_changes_nothing(tmp_path):
    runtime = FakeRuntime(OLD)
    result = repair(runtime, tmp_path).apply(check_mode=True)
    assert result["changed"] and result["action"] == "install" and result["image"] is None
    assert "compressed-tensors is 0.8.1" in result["msg"]
    assert runtime.commits == 0 and runtime.containers == {}
    assert not [c for c in runtime.calls if c[:5] == ["exec", CONTAINER, "python3", "-m", "pip"]]
    # A read needs no wheels (they are staged only for an install) and no network.
    run = [c for c in runtime.calls if c[0] == "run"][0]
    assert "--network=none" in run and "--volume" not in run


def test_a_wheelhouse_without_the_wheel_fails_with_pips_cause_and_leaves_nothing(tmp_path):
    runtime = FakeRuntime(OLD, wheels=())
    with pytest.raises(PyEnvError) as failed:
        repair(runtime, tmp_path).apply()
    message = str(failed.value)
    assert "pip install compressed-tensors>=0.10.0 failed in the image" in message
    assert "Could not find a version that satisfies the requirement" in message
    assert "nothing was left on the host" in message
    assert runtime.commits == 0 and runtime.containers == {} and list(runtime.images) == [BASE]


def test_an_install_that_does_not_verify_is_never_committed(tmp_path):
    runtime = FakeRuntime(OLD, pip_breaks_enum=True)
    with pytest.raises(PyEnvError) as failed:
        repair(runtime, tmp_path).apply()
    assert "verification after installing compressed-tensors 0.15.0.1 failed" in str(failed.value)
    assert "nvfp4_pack_quantized" in str(failed.value)
    assert runtime.commits == 0 and runtime.containers == {} and list(runtime.images) == [BASE]


def test_a_commit_that_fails_leaves_neither_container_nor_image(tmp_path):
    runtime = FakeRuntime(OLD)
    scripted = runtime.__call__

    def refusing_commit(argv):
        if argv[1] == "commit":
            runtime.calls.append(argv[1:])
            return 125, "", "Error: no space left on device"
        return scripted(argv)

    with pytest.raises(PyEnvError) as failed:
        repair(refusing_commit, tmp_path).apply()
    assert "committing the repaired image failed" in str(failed.value) and "no space left" in str(failed.value)
    assert runtime.containers == {} and list(runtime.images) == [BASE]
