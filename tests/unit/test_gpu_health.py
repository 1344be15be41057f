"""The GPU health preflight's reads: NVML through ctypes against the fake libnvidia-ml.so.1
(tests/fakes/fake_nvml.c), the scripted nvidia-smi when the library does not answer, the NVSwitch
devices and the fabric manager's unit; and the CUDA build read from a venv's torch.

Each GPU picture is written here: the answers asserted are the ones the picture scripts.
"""
import ctypes
import json
import os
import time

import pytest

from ansible_collections.modelwake.serving.plugins.module_utils.common.command import run_command
from ansible_collections.modelwake.serving.plugins.module_utils.host import gpu, gpu_health, nvml
from ansible_collections.modelwake.serving.plugins.module_utils.preflight import health

from tests.fakes import fake_nvml
from tests.helpers import FAKES
from tests.helpers.fakes import fresh_nvml_api

HEALTHY_ROWS = {"correctable": 0, "uncorrectable": 0, "pending": False, "failure": False}


@pytest.fixture(scope="session")
def fake_library(tmp_path_factory):
    return fake_nvml.build(str(tmp_path_factory.mktemp("fake-nvml")))


@pytest.fixture
def picture(tmp_path, monkeypatch):
    """write(gpus, **system): the scripted GPUs (gpus.json) the fake library and nvidia-smi read."""
    directory = tmp_path / "gpu"
    directory.mkdir()
    monkeypatch.setenv("MODELWAKE_FAKE_GPU_DIR", str(directory))
    monkeypatch.delenv("MODELWAKE_FAKE_NVML_INIT_ERROR", raising=False)

    def write(gpus, **system):
        spec = dict(system, gpus=[dict({"index": i, "uuid": "GPU-%d" % i}, **g) for i, g in enumerate(gpus)])
        (directory / "gpus.json").write_text(json.dumps(spec))
    return write


def no_runner(argv, timeout):
    raise AssertionError("nothing should be run here: %s" % argv)


def read(library, gpus=None, root="/nonexistent", runner=no_runner):
    return gpu_health.read_health(gpu.GpuReader(gpus=gpus, nvml=nvml.Nvml(library), runner=runner), root=root)


def test_a_healthy_gpu_reads_as_healthy_through_the_binding(fake_library, picture):
    picture([{}, {}])
    found = read(fake_library)
    assert found["backend"] == "nvml"
    assert found["driver_version"] == "580.95.05" and found["cuda_version"] == "13.0"
    assert [(g["index"], g["persistence_mode"], g["remapped_rows"], g["fabric"]) for g in found["gpus"]] == [
        (0, True, HEALTHY_ROWS, None), (1, True, HEALTHY_ROWS, None)]
    assert found["nvswitch_devices"] == [] and found["fabric_manager"] is None
    assert health.judge(found) == {"problems": [], "waived": []}


def test_persistence_off_is_read_and_refused_naming_the_gpu_and_the_fix(fake_library, picture):
    picture([{}, {"persistence_mode": False}])
    found = read(fake_library)
    assert [g["persistence_mode"] for g in found["gpus"]] == [True, False]
    problems = health.judge(found)["problems"]
    assert len(problems) == 1
    assert problems[0].startswith("GPU 1 (GPU-1) has persistence mode off: enable it: nvidia-smi -pm 1")
    assert "nvidia-persistenced" in problems[0]


def test_only_the_watched_gpus_are_judged(fake_library, picture):
    picture([{"persistence_mode": False}, {}])
    found = read(fake_library, gpus=[1])
    assert [g["index"] for g in found["gpus"]] == [1]
    assert health.judge(found)["problems"] == []


def test_remapped_rows_pending_and_failure_are_read_and_refused(fake_library, picture):
    picture([{"remapped_rows": {"correctable": 2, "uncorrectable": 0, "pending": 1, "failure": 0}},
             {"remapped_rows": {"correctable": 0, "uncorrectable": 512, "pending": 0, "failure": 1}},
             {"remapped_rows": {"correctable": 5, "uncorrectable": 1, "pending": 0, "failure": 0}}])
    found = read(fake_library)
    assert [g["remapped_rows"] for g in found["gpus"]] == [
        {"correctable": 2, "uncorrectable": 0, "pending": True, "failure": False},
        {"correctable": 0, "uncorrectable": 512, "pending": False, "failure": True},
        {"correctable": 5, "uncorrectable": 1, "pending": False, "failure": False}]
    # Remapped rows that were applied are the GPU doing its job: only a pending remap or a failure refuses.
    assert health.judge(found)["problems"] == [
        "GPU 0 (GPU-0) has a pending row remap: reset the GPU (nvidia-smi -r -i 0, with no process on it) or reboot "
        "to apply the pending remap.",
        "GPU 1 (GPU-1) has a row-remapping failure (512 rows remapped for uncorrectable errors, 0 for correctable "
        "ones): its memory has a fault it can no longer hide: drain the node and have the GPU replaced.",
    ]


def test_a_gpu_without_row_remapping_is_skipped_and_says_so(fake_library, picture):
    picture([{"remapped_rows": None}])
    found = read(fake_library)
    assert found["gpus"][0]["remapped_rows"] is None
    assert found["gpus"][0]["notes"] == ["no row remapping on this GPU (before Ampere): not checked"]
    assert health.judge(found)["problems"] == []


@pytest.mark.parametrize("fabric,fragment", [
    ({"state": "not_started"}, "GPU 0 (GPU-0) has not joined the NVSwitch fabric (fabric manager not running): "
                               "install and start nvidia-fabricmanager matching driver 570.124.06"),
    ({"state": "in_progress"}, "GPU 0 (GPU-0) is still joining the NVSwitch fabric: wait for nvidia-fabricmanager"),
    ({"state": "completed", "status": 802}, "GPU 0 (GPU-0) failed to join the NVSwitch fabric (state completed, "
                                            "NVML status 802)"),
    ({"state": "completed", "status": 0}, None),
])
def test_the_fabric_state_of_each_gpu_decides_on_a_fabric(fake_library, picture, fabric, fragment):
    picture([{"fabric": fabric}], driver_version="570.124.06", cuda_driver_version=12080)
    found = read(fake_library)
    assert found["gpus"][0]["fabric"] == {"state": fabric["state"], "status": fabric.get("status", 0)}
    problems = health.judge(found)["problems"]
    if fragment is None:
        assert problems == []
    else:
        assert len(problems) == 1 and problems[0].startswith(fragment), problems
    if fabric["state"] == "not_started":
        assert "nvidia-fabricmanager-570" in problems[0] and "error 802" in problems[0]


def nvswitch_host(tmp_path, count=4):
    root = tmp_path / "host"
    devices = root / gpu_health.NVSWITCH_DEVICES_DIR
    devices.mkdir(parents=True)
    for i in range(count):
        (devices / ("0000:0%d:00.0" % (5 + i))).mkdir()
    return str(root)


def systemctl(load_state, active_state, asked):
    def runner(argv, timeout):
        asked.append(argv)
        assert argv[:2] == ["systemctl", "show"] and argv[-1] == "nvidia-fabricmanager.service"
        return 0, "LoadState=%s\nActiveState=%s\n" % (load_state, active_state), ""
    return runner


@pytest.mark.parametrize("load_state,active_state,fragment", [
    ("not-found", "inactive", "This host has 4 NVSwitches and no nvidia-fabricmanager.service: install and start "
                              "nvidia-fabricmanager matching driver 580.95.05"),
    ("loaded", "failed", "This host has 4 NVSwitches and nvidia-fabricmanager.service is failed: install and start"),
    ("loaded", "inactive", "nvidia-fabricmanager.service is inactive"),
    ("loaded", "active", None),
])
def test_an_nvswitch_host_without_fabric_states_is_judged_from_the_unit(fake_library, picture, tmp_path, load_state,
                                                                        active_state, fragment):
    """A100 HGX: the GPUs report no fabric state (Not Supported), the NVSwitches are listed by the kernel module."""
    picture([{}, {}])
    asked = []
    found = read(fake_library, root=nvswitch_host(tmp_path), runner=systemctl(load_state, active_state, asked))
    assert len(found["nvswitch_devices"]) == 4 and len(asked) == 1
    assert found["fabric_manager"] == {"load_state": load_state, "active_state": active_state}
    problems = health.judge(found)["problems"]
    if fragment is None:
        assert problems == []
    else:
        assert len(problems) == 1 and fragment in problems[0], problems


def test_gpus_that_joined_the_fabric_outweigh_a_unit_not_found(fake_library, picture, tmp_path):
    """The fabric manager may run in a container (the GPU operator): the GPUs' registration is the evidence."""
    picture([{"fabric": {"state": "completed", "status": 0}}])
    found = read(fake_library, root=nvswitch_host(tmp_path), runner=systemctl("not-found", "inactive", []))
    assert health.judge(found)["problems"] == []


def test_a_host_without_nvswitches_never_asks_for_the_fabric_manager(fake_library, picture, tmp_path):
    picture([{}])
    found = read(fake_library, root=str(tmp_path))  # no_runner: systemctl is never run
    assert found["nvswitch_devices"] == [] and found["fabric_manager"] is None


def write_torch(venv, cuda_line, version="2.9.1+cu128"):
    package = venv / "lib" / "python3.12" / "site-packages" / "torch"
    package.mkdir(parents=True)
    (package / "version.py").write_text(
        "from typing import Optional\n\n__all__ = ['__version__', 'debug', 'cuda', 'git_version', 'hip']\n"
        "__version__ = '%s'\ndebug = False\n%s\ngit_version = 'abc'\nhip: Optional[str] = None\n" % (version, cuda_line))


@pytest.mark.parametrize("line", ["cuda: Optional[str] = '12.8'", "cuda = '12.8'"])
def test_the_cuda_build_of_the_engines_torch_is_read_from_its_venv(tmp_path, line):
    write_torch(tmp_path / "venv", line)
    found = health.torch_cuda_build(str(tmp_path / "venv"))
    assert (found["torch_version"], found["cuda"], found["note"]) == ("2.9.1+cu128", "12.8", None)


def test_a_cpu_torch_or_no_torch_skips_the_driver_check_with_a_note(tmp_path):
    write_torch(tmp_path / "cpu", "cuda: Optional[str] = None", version="2.13.0+cpu")
    cpu = health.torch_cuda_build(str(tmp_path / "cpu"))
    assert cpu["cuda"] is None and "torch 2.13.0+cpu in %s is not a CUDA build" % (tmp_path / "cpu") in cpu["note"]
    (tmp_path / "empty").mkdir()
    none = health.torch_cuda_build(str(tmp_path / "empty"))
    assert none["cuda"] is None and none["note"].startswith("no torch in %s" % (tmp_path / "empty"))
    assert health.torch_cuda_build("")["note"].startswith("no engine venv given")


def test_a_driver_older_than_the_torch_build_is_refused_naming_both_and_the_driver_to_install(fake_library, picture,
                                                                                             tmp_path):
    picture([{}], driver_version="535.104.05", cuda_driver_version=12020)
    write_torch(tmp_path / "venv", "cuda: Optional[str] = '12.8'")
    found = read(fake_library)
    assert found["cuda_version"] == "12.2"
    torch = health.torch_cuda_build(str(tmp_path / "venv"))
    assert health.judge(found, torch)["problems"] == [
        "GPU driver 535.104.05 supports CUDA 12.2, the engine's torch 2.9.1+cu128 is built for CUDA 12.8: upgrade the "
        "driver to >= 570.26 (or install a torch built for cu122)."]
    # A driver for a newer CUDA runs an older build.
    picture([{}], driver_version="580.95.05", cuda_driver_version=13000)
    assert health.judge(read(fake_library), torch)["problems"] == []


def test_a_check_turned_off_reports_its_finding_and_refuses_nothing(fake_library, picture):
    picture([{"persistence_mode": False, "remapped_rows": {"pending": 1}}])
    found = read(fake_library)
    verdict = health.judge(found, require={health.PERSISTENCE: False, health.REMAPPED_ROWS: True})
    assert len(verdict["problems"]) == 1 and "pending row remap" in verdict["problems"][0]
    assert len(verdict["waived"]) == 1 and "persistence mode off" in verdict["waived"][0]


@pytest.mark.parametrize("cuda,driver", [("12.8", "570.26"), ("12.2", "535.54.03"), ("13.0", "580.65.06"),
                                         ("12.7", None), ("cpu", None)])
def test_the_minimum_driver_of_a_cuda_release(cuda, driver):
    assert health.minimum_driver(cuda) == driver


@pytest.fixture
def smi_on_path(monkeypatch):
    monkeypatch.setenv("PATH", "%s:%s" % (FAKES, os.environ["PATH"]))


def test_nvidia_smi_answers_the_same_questions_when_nvml_does_not_initialise(fake_library, picture, monkeypatch,
                                                                            smi_on_path):
    monkeypatch.setenv("MODELWAKE_FAKE_NVML_INIT_ERROR", "9")
    picture([{"persistence_mode": False}, {"remapped_rows": {"correctable": 0, "uncorrectable": 3, "failure": 1}},
             {"remapped_rows": None}], driver_version="535.104.05", cuda_driver_version=12020)
    reader = gpu.GpuReader(nvml=nvml.Nvml(fake_library), runner=run_command)
    found = gpu_health.read_health(reader, root="/nonexistent")
    assert found["backend"] == "nvidia-smi"
    assert (found["driver_version"], found["cuda_version"]) == ("535.104.05", "12.2")
    assert [(g["index"], g["persistence_mode"], g["remapped_rows"]) for g in found["gpus"]] == [
        (0, False, HEALTHY_ROWS),
        (1, True, {"correctable": 0, "uncorrectable": 3, "pending": False, "failure": True}),
        (2, True, None)]
    assert found["gpus"][2]["notes"] == ["no row remapping on this GPU (before Ampere): not checked"]
    problems = health.judge(found)["problems"]
    assert [p.split(" has ")[0] for p in problems] == ["GPU 0 (GPU-0)", "GPU 1 (GPU-1)"]


def test_the_python_fake_of_the_calls_gives_the_same_reading():
    """tests/fakes/nvml_api.py stands for the binding in other unit tests: its health answers match."""
    api = fresh_nvml_api()
    api.configure([{"uuid": "GPU-a", "memory_used_mib": 0, "memory_total_mib": 100, "persistence_mode": False,
                    "remapped_rows": None, "fabric": {"state": nvml.FABRIC_STATE_IN_PROGRESS, "status": 0}}])
    api.configure_system("570.124.06", 12080)
    found = gpu_health.read_health(gpu.GpuReader(nvml=api, runner=no_runner), root="/nonexistent")
    assert (found["driver_version"], found["cuda_version"]) == ("570.124.06", "12.8")
    assert found["gpus"][0]["persistence_mode"] is False and found["gpus"][0]["remapped_rows"] is None
    assert found["gpus"][0]["fabric"] == {"state": "in_progress", "status": 0}


def test_the_table_names_each_figure(fake_library, picture):
    picture([{}, {"persistence_mode": False, "remapped_rows": {"correctable": 1, "pending": 1},
                  "fabric": {"state": "completed", "status": 0}}])
    lines = health.health_table(read(fake_library), {"torch_version": "2.9.1+cu128", "cuda": "12.8"})
    assert lines == ["driver 580.95.05 (CUDA 13.0); engine torch 2.9.1+cu128 built for CUDA 12.8",
                     "GPU 0  persistence on  remapped rows 0 correctable, 0 uncorrectable",
                     "GPU 1  persistence off  remapped rows 1 correctable, 0 uncorrectable, pending  fabric completed"]


def test_a_health_read_on_a_wedged_driver_ends_in_its_time_and_asks_nothing_more(fake_library, picture, monkeypatch):
    """The health reads share the reader's bound: a driver that blocks in one call costs one bound, the
    other calls fail at once, and each GPU's note says why its health is unknown."""
    picture([{}, {}])
    monkeypatch.setenv("MODELWAKE_FAKE_NVML_BLOCK", "nvmlDeviceGetPersistenceMode")
    reader = gpu.GpuReader(nvml=nvml.Nvml(fake_library), runner=no_runner, timeout=0.5)
    remaps_asked = ctypes.CDLL(fake_library).fakeNvmlCalls(b"nvmlDeviceGetRemappedRows")
    began = time.monotonic()
    found = gpu_health.read_health(reader, root="/nonexistent")
    assert 0.5 <= time.monotonic() - began < 2.0
    assert reader.wedged.startswith("NVML did not answer in 0.5 s (nvmlDeviceGetPersistenceMode)")
    assert [g["persistence_mode"] for g in found["gpus"]] == [None, None]
    assert all(any("did not answer" in note for note in g["notes"]) for g in found["gpus"])
    assert ctypes.CDLL(fake_library).fakeNvmlCalls(b"nvmlDeviceGetRemappedRows") == remaps_asked
