"""GPU readers: NVML through ctypes against a fake libnvidia-ml.so.1 (tests/fakes/fake_nvml.c), the
faked NVML calls (tests/fakes/nvml_api.py) and a scripted nvidia-smi on PATH."""
import ctypes
import json
import os
import stat
import subprocess
import sys
import time

import pytest

from ansible_collections.modelwake.serving.plugins.module_utils.host import gpu, nvml
from ansible_collections.modelwake.serving.plugins.module_utils.common import command
from ansible_collections.modelwake.serving.plugins.module_utils.common.command import run_command
from ansible_collections.modelwake.serving.plugins.module_utils.preflight import holders
from ansible_collections.modelwake.serving.plugins.module_utils.readiness.probe import HostProbe

from tests.fakes import fake_nvml  # builds the fake library
from tests.helpers import FAKES, ROOT
from tests.helpers.fakes import fresh_nvml_api
from tests.helpers.network import free_port
from tests.helpers.traces import config


@pytest.fixture(scope="session")
def fake_library(tmp_path_factory):
    return fake_nvml.build(str(tmp_path_factory.mktemp("fake-nvml")))


@pytest.fixture
def gpu_dir(tmp_path, monkeypatch):
    """A scripted GPU picture: two GPUs, the first with the driver's reserved memory of an H200, the
    second without utilisation (Not Supported)."""
    directory = tmp_path / "gpu"
    directory.mkdir()
    (directory / "gpus.json").write_text(json.dumps({"gpus": [
        {"index": 0, "uuid": "GPU-aaa", "memory_total_mib": 97887, "memory_used_mib": 1824, "memory_reserved_mib": 615,
         "utilization_gpu": 0},
        {"index": 1, "uuid": "GPU-bbb", "memory_total_mib": 97887, "memory_used_mib": 512, "utilization_gpu": None},
    ]}))
    monkeypatch.setenv("MODELWAKE_FAKE_GPU_DIR", str(directory))
    monkeypatch.delenv("MODELWAKE_FAKE_NVML_INIT_ERROR", raising=False)
    monkeypatch.delenv("MODELWAKE_FAKE_NVML_V1_ONLY", raising=False)
    monkeypatch.delenv("MODELWAKE_FAKE_NVML_BLOCK", raising=False)
    return directory


def hold(gpu_dir, pid, memory_mib, index=0, utilization=0):
    path = gpu_dir / ("holder-%d.json" % pid)
    path.with_suffix(".tmp").write_text(json.dumps(
        {"pid": pid, "name": "python", "gpus": {str(index): {"memory_mib": memory_mib, "utilization": utilization}}}))
    os.replace(str(path.with_suffix(".tmp")), str(path))  # as the simulated engine writes it


def calls(library, name):
    return ctypes.CDLL(library).fakeNvmlCalls(name.encode())


def test_the_binding_reads_memory_utilisation_uuid_and_processes_from_the_driver_library(fake_library, gpu_dir):
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        hold(gpu_dir, holder.pid, 76000, index=0, utilization=40)
        hold(gpu_dir, 2 ** 22 + 7, 9000, index=1)  # no such process: it holds nothing
        session = nvml.Nvml(fake_library)
        session.nvmlInit()
        assert session.nvmlDeviceGetCount() == 2
        first, second = session.nvmlDeviceGetHandleByIndex(0), session.nvmlDeviceGetHandleByIndex(1)
        memory = session.nvmlDeviceGetMemoryInfo(first)  # the second version: used as nvidia-smi shows it
        assert (memory.used, memory.total, memory.free) == (77824 * 2 ** 20, 97887 * 2 ** 20,
                                                            (97887 - 615 - 77824) * 2 ** 20)
        assert calls(fake_library, "nvmlDeviceGetMemoryInfo") == 0
        assert session.nvmlDeviceGetUtilizationRates(first).gpu == 40
        assert session.nvmlDeviceGetUUID(second) == "GPU-bbb"
        with pytest.raises(nvml.NvmlError) as info:
            session.nvmlDeviceGetUtilizationRates(second)
        assert info.value.code == nvml.ERROR_NOT_SUPPORTED and "Not Supported" in str(info.value)
        processes = session.nvmlDeviceGetComputeRunningProcesses(first)
        assert [(p.pid, p.usedGpuMemory) for p in processes] == [(holder.pid, 76000 * 2 ** 20)]
        assert session.nvmlDeviceGetComputeRunningProcesses(second) == []
        with pytest.raises(nvml.NvmlError):
            session.nvmlDeviceGetHandleByIndex(2)
        session.nvmlShutdown()
    finally:
        holder.kill()
        holder.wait()


def test_a_driver_before_510_is_read_through_the_first_memory_call_and_asked_once(fake_library, gpu_dir,
                                                                                   monkeypatch):
    """Without nvmlDeviceGetMemoryInfo_v2 the first version answers: its `used` counts the reserved
    memory (as the old drivers' nvidia-smi did), `free` is the same."""
    monkeypatch.setenv("MODELWAKE_FAKE_NVML_V1_ONLY", "1")
    session = nvml.Nvml(fake_library)
    session.nvmlInit()
    first = session.nvmlDeviceGetHandleByIndex(0)
    asked = calls(fake_library, "nvmlDeviceGetMemoryInfo_v2")
    for _ in range(3):
        memory = session.nvmlDeviceGetMemoryInfo(first)
        assert (memory.used, memory.free) == ((1824 + 615) * 2 ** 20, (97887 - 615 - 1824) * 2 ** 20)
    assert calls(fake_library, "nvmlDeviceGetMemoryInfo_v2") == asked + 1
    session.nvmlShutdown()


def test_a_reader_keeps_one_session_and_its_handles_and_sees_memory_grow(fake_library, gpu_dir):
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        reader = gpu.GpuReader(nvml=nvml.Nvml(fake_library))
        inits, handles = calls(fake_library, "nvmlInit_v2"), calls(fake_library, "nvmlDeviceGetHandleByIndex_v2")
        assert [g["memory_used_mib"] for g in reader.read()] == [1824, 512]
        assert reader.backend == "nvml"
        assert [g["utilization"] for g in reader.read()] == [0, None]
        for used in (10000, 20000, 30000):  # a rank loading its weights
            hold(gpu_dir, holder.pid, used, index=1)
            assert [g["memory_used_mib"] for g in reader.read()] == [1824, 512 + used]
        assert reader.compute_processes() == [{"index": 1, "pid": holder.pid, "used_memory_mib": 30000}]
        assert calls(fake_library, "nvmlInit_v2") == inits + 1
        assert calls(fake_library, "nvmlDeviceGetHandleByIndex_v2") == handles + 2  # once per GPU, not per read
    finally:
        holder.kill()
        holder.wait()


def test_the_watched_gpus_only(fake_library, gpu_dir):
    reader = gpu.GpuReader(gpus=[1], nvml=nvml.Nvml(fake_library))
    assert [(g["index"], g["uuid"]) for g in reader.read()] == [(1, "GPU-bbb")]


def test_a_driver_that_does_not_initialise_is_said_and_nvidia_smi_answers(fake_library, gpu_dir, monkeypatch,
                                                                           scripted_smi):
    monkeypatch.setenv("MODELWAKE_FAKE_NVML_INIT_ERROR", "9")
    reader = gpu.GpuReader(nvml=nvml.Nvml(fake_library), runner=run_command)
    assert reader.read() == EXPECTED_GPUS and reader.backend == "nvidia-smi"


def test_no_driver_library_is_an_nvml_error_that_names_the_library(tmp_path):
    with pytest.raises(nvml.NvmlError) as info:
        nvml.Nvml(str(tmp_path / "libnvidia-ml.so.1"))
    assert info.value.function == "dlopen" and "libnvidia-ml.so.1" in str(info.value)


def test_the_binding_finds_the_library_as_the_loader_does(fake_library, gpu_dir):
    """On a GPU host the library is found by name; here LD_LIBRARY_PATH points at the fake."""
    code = ("from ansible_collections.modelwake.serving.plugins.module_utils.host import gpu\n"
            "reader = gpu.GpuReader()\nprint([g['uuid'] for g in reader.read()], reader.backend)\n")
    env = dict(os.environ, LD_LIBRARY_PATH=os.path.dirname(fake_library), PATH="/usr/bin:/bin")
    out = subprocess.run([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, universal_newlines=True,
                         check=True, cwd=ROOT).stdout
    assert out.strip() == "['GPU-aaa', 'GPU-bbb'] nvml", out


# -- GpuReader's logic over NVML's calls, with the Python fake, and the nvidia-smi fallback ---------

@pytest.fixture
def fake_calls():
    return fresh_nvml_api()


DEVICES = [
    {"uuid": "GPU-aaa", "memory_used_mib": 77824, "memory_total_mib": 97887, "utilization": 0,
     "processes": [{"pid": 4242, "used_mib": 76000}]},
    {"uuid": "GPU-bbb", "memory_used_mib": 512, "memory_total_mib": 97887, "utilization": None,
     "processes": [{"pid": 4243, "used_mib": None}]},
]


# The same GPUs as NVML and nvidia-smi describe them: both backends must read them alike.
EXPECTED_GPUS = [
    {"index": 0, "uuid": "GPU-aaa", "memory_used_mib": 77824, "memory_total_mib": 97887, "memory_free_mib": 20063,
     "utilization": 0},
    {"index": 1, "uuid": "GPU-bbb", "memory_used_mib": 512, "memory_total_mib": 97887, "memory_free_mib": 97375,
     "utilization": None},
]
EXPECTED_PROCESSES = [{"index": 0, "pid": 4242, "used_memory_mib": 76000},
                      {"index": 1, "pid": 4243, "used_memory_mib": None}]


def test_nvml_backend_reads_memory_in_mib_and_utilisation(fake_calls):
    fake_calls.configure(DEVICES)
    reader = gpu.GpuReader(nvml=fake_calls)
    assert reader.read() == EXPECTED_GPUS
    assert reader.backend == "nvml"
    assert reader.compute_processes() == EXPECTED_PROCESSES


def test_gpus_filter_by_index(fake_calls):
    fake_calls.configure(DEVICES)
    reader = gpu.GpuReader(gpus=[1], nvml=fake_calls)
    assert [g["index"] for g in reader.read()] == [1]
    assert [p["pid"] for p in reader.compute_processes()] == [4243]


SMI = r"""#!/bin/sh
case "$*" in
  *--query-gpu=index,uuid,memory.used,memory.total,utilization.gpu,memory.free*)
    printf '0, GPU-aaa, 77824, 97887, 0, 20063\n1, GPU-bbb, 512, 97887, [N/A], 97375\n' ;;
  *--query-compute-apps=gpu_uuid,pid,used_memory*)
    printf 'GPU-aaa, 4242, 76000\nGPU-bbb, 4243, [N/A]\n' ;;
  *) echo "unexpected: $*" >&2; exit 2 ;;
esac
"""


@pytest.fixture
def scripted_smi(tmp_path, monkeypatch):
    path = tmp_path / "nvidia-smi"
    path.write_text(SMI)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", "%s:%s" % (tmp_path, os.environ["PATH"]))
    return path


def test_nvidia_smi_fallback_when_nvml_cannot_initialise(fake_calls, scripted_smi):
    fake_calls.configure(init_error="NVML Shared Library Not Found")
    reader = gpu.GpuReader(runner=run_command, nvml=fake_calls)
    assert reader.read() == EXPECTED_GPUS
    assert reader.backend == "nvidia-smi" and reader.error is None
    assert reader.compute_processes() == EXPECTED_PROCESSES
    assert [g["index"] for g in gpu.GpuReader(gpus=[0], runner=run_command).read()] == [0]


def test_the_nvidia_smi_run_that_chooses_the_backend_is_the_first_read(scripted_smi):
    calls_made = []

    def counting_runner(argv, timeout=30):
        calls_made.append(argv)
        return run_command(argv, timeout)

    reader = gpu.GpuReader(runner=counting_runner)  # no driver library on this machine
    assert reader.read() == EXPECTED_GPUS
    assert len(calls_made) == 1  # chosen and read with one run
    assert reader.read() == EXPECTED_GPUS
    assert len(calls_made) == 2  # later reads ask again: the GPUs change


def test_nvidia_smi_when_the_driver_library_is_absent(scripted_smi):
    reader = gpu.GpuReader()
    assert len(reader.read()) == 2 and reader.backend == "nvidia-smi"


def test_no_gpu_at_all_is_empty_not_an_error(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi, and no libnvidia-ml.so.1 here
    reader = gpu.GpuReader()
    assert reader.read() == [] and reader.compute_processes() == []
    assert reader.backend == "none" and reader.no_gpu_tools is True
    assert "libnvidia-ml.so.1" in reader.error  # why NVML did not answer, for a preflight


# Read on an NVIDIA H200 (driver 580.159.04) while a PyTorch process held 2.6 GiB: both backends'
# answers, byte for byte (tools/gpu-check's session, bench/REPORT.md "On a real GPU").
H200_SMI = {
    "--query-gpu": "0, GPU-2aeab138-72ee-c109-7814-9b564e67de7f, 2667, 143771, 1, 140490\n",
    "--query-compute-apps": "GPU-2aeab138-72ee-c109-7814-9b564e67de7f, 563, 2658\n",
}
H200_NVML = {"total": 150754820096, "reserved": 644939776, "free": 147313524736, "used": 2796355584,
             "process_used": 2658 * 2 ** 20}
H200_READ = [{"index": 0, "uuid": "GPU-2aeab138-72ee-c109-7814-9b564e67de7f", "memory_used_mib": 2667,
              "memory_total_mib": 143771, "memory_free_mib": 140490, "utilization": 1}]


def test_a_real_h200s_answers_read_alike_through_nvidia_smi_and_nvml(fake_calls):
    def runner(argv, timeout=30):
        return 0, H200_SMI[argv[1].split("=")[0]], ""

    fake_calls.configure(init_error="left out: read through nvidia-smi")
    through_smi = gpu.GpuReader(runner=runner, nvml=fake_calls)
    assert through_smi.read() == H200_READ and through_smi.backend == "nvidia-smi"
    assert through_smi.compute_processes() == [{"index": 0, "pid": 563, "used_memory_mib": 2658}]

    class H200(object):
        """The binding's answers on that GPU: nvmlDeviceGetMemoryInfo_v2's, without the 615 MiB reserved."""
        nvmlInit = nvmlShutdown = staticmethod(lambda: None)
        nvmlDeviceGetCount = staticmethod(lambda: 1)
        nvmlDeviceGetHandleByIndex = staticmethod(lambda index: "h200")
        nvmlDeviceGetUUID = staticmethod(lambda handle: "GPU-2aeab138-72ee-c109-7814-9b564e67de7f")
        nvmlDeviceGetMemoryInfo = staticmethod(lambda handle: nvml.MemoryV2(
            version=nvml.MEMORY_V2_VERSION, **dict((k, H200_NVML[k]) for k in ("total", "reserved", "free", "used"))))
        nvmlDeviceGetUtilizationRates = staticmethod(lambda handle: nvml.Utilization(gpu=1, memory=0))
        nvmlDeviceGetComputeRunningProcesses = staticmethod(
            lambda handle: [nvml.ComputeProcess(563, H200_NVML["process_used"])])

    through_nvml = gpu.GpuReader(nvml=H200())
    assert through_nvml.read() == H200_READ and through_nvml.backend == "nvml"
    assert through_nvml.compute_processes() == [{"index": 0, "pid": 563, "used_memory_mib": 2658}]


def test_failing_nvidia_smi_is_reported():
    def runner(argv, timeout=30):
        return 9, "", "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."

    reader = gpu.GpuReader(runner=runner)
    assert reader.read() == []
    assert reader.backend == "none"
    assert "rc 9" in reader.error and "couldn't communicate" in reader.error


# -- the PCI ids the kernel's Xid lines name the GPUs by ------------------------------------------

def test_the_pci_ids_of_every_gpu_through_the_binding_and_through_nvidia_smi(fake_library, gpu_dir, monkeypatch):
    spec = json.loads((gpu_dir / "gpus.json").read_text())
    spec["gpus"][1]["bus_id"] = "00000000:C1:00.0"
    spec["gpus"][1]["utilization_gpu"] = 0  # the scripted nvidia-smi has no Not Supported
    (gpu_dir / "gpus.json").write_text(json.dumps(spec))
    expected = {0: "0000:18:00", 1: "0000:c1:00"}  # the first GPU's the scripted nvidia-smi's default
    through_nvml = gpu.GpuReader(gpus=[1], nvml=nvml.Nvml(fake_library))  # every GPU, watched or not
    asked = calls(fake_library, "nvmlDeviceGetPciInfo_v3")
    assert through_nvml.pci_bus_ids() == expected and through_nvml.pci_bus_ids() == expected
    assert calls(fake_library, "nvmlDeviceGetPciInfo_v3") == asked + 2  # read once
    monkeypatch.setenv("PATH", "%s:%s" % (FAKES, os.environ["PATH"]))
    monkeypatch.setenv("MODELWAKE_FAKE_NVML_INIT_ERROR", "9")
    through_smi = gpu.GpuReader(nvml=nvml.Nvml(fake_library))
    assert through_smi.pci_bus_ids() == expected and through_smi.backend == "nvidia-smi"


# -- no read hangs on the driver --------------------------------------------------------------

def test_an_nvml_call_that_never_returns_ends_the_read_in_its_time_and_nvml_is_not_called_again(
        fake_library, gpu_dir, monkeypatch):
    """Through ctypes, against the fake library blocking in nvmlDeviceGetMemoryInfo_v2 as a wedged driver
    would: the read returns within its bound, says which GPU and call, and the GPUs are not read again."""
    monkeypatch.setenv("MODELWAKE_FAKE_NVML_BLOCK", "nvmlDeviceGetMemoryInfo_v2")
    reader = gpu.GpuReader(gpus=[1], nvml=nvml.Nvml(fake_library), timeout=0.5)
    asked = calls(fake_library, "nvmlDeviceGetMemoryInfo_v2")
    began = time.monotonic()
    assert reader.read() == []
    assert 0.5 <= time.monotonic() - began < 2.0
    assert reader.wedged == reader.error == ("NVML did not answer in 0.5 s (GPU 1, nvmlDeviceGetMemoryInfo); "
                                             "the GPUs are not read again by this process")
    began = time.monotonic()
    assert reader.read() == [] and reader.compute_processes() == [] and reader.pci_bus_ids() == {}
    assert time.monotonic() - began < 0.1
    assert calls(fake_library, "nvmlDeviceGetMemoryInfo_v2") == asked + 1


def test_a_look_on_a_wedged_driver_keeps_its_time_says_so_and_the_next_asks_nothing(fake_library, gpu_dir,
                                                                                   monkeypatch, tmp_path):
    monkeypatch.setenv("MODELWAKE_FAKE_NVML_BLOCK", "nvmlDeviceGetUtilizationRates")
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        probe = HostProbe(config(pid=sleeper.pid, url="http://127.0.0.1:%d" % free_port()),
                          nvml=nvml.Nvml(fake_library))
        probe.gpus.timeout = 0.5
        probe.kernel_log_path = str(tmp_path / "kmsg")
        (tmp_path / "kmsg").write_text("")
        asked = calls(fake_library, "nvmlDeviceGetUtilizationRates")
        began = time.monotonic()
        snap = probe.snapshot(0.0)
        assert time.monotonic() - began < 3.0
        assert snap.gpus == []
        assert snap.errors == ["NVML did not answer in 0.5 s (GPU 0, nvmlDeviceGetUtilizationRates); "
                               "the GPUs are not read again by this process"]
        later = probe.snapshot(5.0)
        assert later.gpus == [] and later.errors == snap.errors
        assert calls(fake_library, "nvmlDeviceGetUtilizationRates") == asked + 1
    finally:
        sleeper.kill()
        sleeper.wait()


def test_an_nvml_init_that_never_returns_does_not_fall_back_to_nvidia_smi(fake_calls):
    """nvidia-smi would hang on the same driver (and stay behind in state D)."""
    fake_calls.configure(DEVICES, block="nvmlInit")
    ran = []
    reader = gpu.GpuReader(nvml=fake_calls, runner=lambda argv, timeout: ran.append(argv) or (0, "", ""))
    reader.init_timeout = 0.2
    assert reader.read() == [] and reader.backend == "nvml" and ran == []
    assert reader.error.startswith("NVML did not answer in 0.2 s (nvmlInit)")


def test_the_gpu_preflight_says_the_driver_did_not_answer(fake_calls):
    fake_calls.configure(DEVICES, block="nvmlDeviceGetMemoryInfo")
    result = holders.survey(needed=[0], reader=gpu.GpuReader(nvml=fake_calls, timeout=0.2))
    assert result["gpus"] == [] and result["backend"] == "nvml"
    assert result["backend_error"].startswith("NVML did not answer in 0.2 s (GPU 0, nvmlDeviceGetMemoryInfo)")


def test_an_nvidia_smi_that_hangs_is_killed_in_its_time_and_not_run_again(fake_calls, gpu_dir, monkeypatch):
    fake_calls.configure(init_error="no driver library")
    monkeypatch.setenv("PATH", "%s:%s" % (FAKES, os.environ["PATH"]))
    monkeypatch.setenv("MODELWAKE_FAKE_SMI_HANG", "1")
    ran = []

    def counting_runner(argv, timeout):
        ran.append(timeout)
        return run_command(argv, timeout)

    reader = gpu.GpuReader(nvml=fake_calls, runner=counting_runner)
    reader.smi_timeout = 1
    began = time.monotonic()
    assert reader.read() == []
    assert time.monotonic() - began < 1 + command.KILL_GRACE + 1
    assert reader.error == "nvidia-smi did not answer in 1 s; the GPUs are not read again by this process"
    assert reader.read() == [] and reader.compute_processes() == [] and ran == [1]


def test_every_nvidia_smi_run_is_bounded_by_the_smi_timeout(scripted_smi):
    asked = []

    def runner(argv, timeout):
        asked.append(timeout)
        return run_command(argv, timeout)

    reader = gpu.GpuReader(runner=runner)
    reader.read()
    reader.compute_processes()
    reader.pci_bus_ids()
    assert asked and set(asked) == {gpu.SMI_TIMEOUT}


def test_a_command_that_outlives_its_timeout_is_killed_and_its_children_do_not_hold_the_wait():
    began = time.monotonic()
    # The shell is killed; the sleep it started keeps the output open: waited for KILL_GRACE, no more.
    rc, out, err = run_command(["sh", "-c", "sleep 30 & sleep 30"], 0.5)
    assert rc == command.TIMED_OUT and out == "" and err == "sh: timed out after 0.5 s"
    assert time.monotonic() - began < 0.5 + command.KILL_GRACE + 1


def test_a_command_the_kernel_will_not_let_die_is_left_behind(monkeypatch):
    """A process in state D (nvidia-smi on a wedged driver) ignores SIGKILL until the kernel lets go:
    subprocess.run would wait for it without end."""
    waits = []

    class Unkillable(object):
        def __init__(self, *args, **kwargs):
            self.stdout, self.stderr = open(os.devnull), open(os.devnull)
            self.killed = False

        def communicate(self, timeout=None):
            waits.append(timeout)
            raise subprocess.TimeoutExpired("nvidia-smi", timeout)

        def kill(self):
            self.killed = True

        def wait(self, timeout=None):
            raise AssertionError("waited on a process that cannot die")

    monkeypatch.setattr(command.subprocess, "Popen", Unkillable)
    monkeypatch.setattr(command.shutil, "which", lambda name: "/usr/bin/" + name)
    assert run_command(["nvidia-smi"], 3) == (124, "", "nvidia-smi: timed out after 3 s")
    assert waits == [3, command.KILL_GRACE]
