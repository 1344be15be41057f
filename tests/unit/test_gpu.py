"""GPU readers: the faked pynvml (tests/fakes/pynvml.py) and a scripted nvidia-smi on PATH."""
import importlib.util
import os
import stat
import sys

import pytest

from ansible_collections.modelwake.serving.plugins.module_utils.host import gpu
from ansible_collections.modelwake.serving.plugins.module_utils.common.command import run_command

FAKES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fakes")


@pytest.fixture
def fake_nvml(monkeypatch):
    spec = importlib.util.spec_from_file_location("pynvml", os.path.join(FAKES, "pynvml.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setitem(sys.modules, "pynvml", module)
    return module


DEVICES = [
    {"uuid": "GPU-aaa", "memory_used_mib": 77824, "memory_total_mib": 97887, "utilization": 0,
     "processes": [{"pid": 4242, "used_mib": 76000}]},
    {"uuid": "GPU-bbb", "memory_used_mib": 512, "memory_total_mib": 97887, "utilization": None,
     "processes": [{"pid": 4243, "used_mib": None}]},
]


# The same GPUs as NVML and nvidia-smi describe them: both backends must read them alike.
EXPECTED_GPUS = [
    {"index": 0, "uuid": "GPU-aaa", "memory_used_mib": 77824, "memory_total_mib": 97887, "utilization": 0},
    {"index": 1, "uuid": "GPU-bbb", "memory_used_mib": 512, "memory_total_mib": 97887, "utilization": None},
]
EXPECTED_PROCESSES = [{"index": 0, "pid": 4242, "used_memory_mib": 76000},
                      {"index": 1, "pid": 4243, "used_memory_mib": None}]


def test_nvml_backend_reads_memory_in_mib_and_utilisation(fake_nvml):
    fake_nvml.configure(DEVICES)
    reader = gpu.GpuReader()
    assert reader.read() == EXPECTED_GPUS
    assert reader.backend == "nvml"
    assert reader.compute_processes() == EXPECTED_PROCESSES


def test_gpus_filter_by_index(fake_nvml):
    fake_nvml.configure(DEVICES)
    reader = gpu.GpuReader(gpus=[1])
    assert [g["index"] for g in reader.read()] == [1]
    assert [p["pid"] for p in reader.compute_processes()] == [4243]


SMI = r"""#!/bin/sh
case "$*" in
  *--query-gpu=index,uuid,memory.used,memory.total,utilization.gpu*)
    printf '0, GPU-aaa, 77824, 97887, 0\n1, GPU-bbb, 512, 97887, [N/A]\n' ;;
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


def test_nvidia_smi_fallback_when_nvml_cannot_initialise(fake_nvml, scripted_smi):
    fake_nvml.configure(init_error="NVML Shared Library Not Found")
    reader = gpu.GpuReader(runner=run_command)
    assert reader.read() == EXPECTED_GPUS
    assert reader.backend == "nvidia-smi" and reader.error is None
    assert reader.compute_processes() == EXPECTED_PROCESSES
    assert [g["index"] for g in gpu.GpuReader(gpus=[0], runner=run_command).read()] == [0]


def test_the_nvidia_smi_run_that_chooses_the_backend_is_the_first_read(monkeypatch, scripted_smi):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    calls = []

    def counting_runner(argv, timeout=30):
        calls.append(argv)
        return run_command(argv, timeout)

    reader = gpu.GpuReader(runner=counting_runner)
    assert reader.read() == EXPECTED_GPUS
    assert len(calls) == 1  # chosen and read with one run
    assert reader.read() == EXPECTED_GPUS
    assert len(calls) == 2  # later reads ask again: the GPUs change


def test_nvidia_smi_when_pynvml_is_not_installed(monkeypatch, scripted_smi):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml -> ImportError
    reader = gpu.GpuReader()
    assert len(reader.read()) == 2 and reader.backend == "nvidia-smi"


@pytest.mark.parametrize("nvml_installed", [False, True])
def test_no_gpu_at_all_is_empty_not_an_error(monkeypatch, tmp_path, fake_nvml, nvml_installed):
    fake_nvml.configure(init_error="NVML Shared Library Not Found")
    if not nvml_installed:
        monkeypatch.setitem(sys.modules, "pynvml", None)
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi
    reader = gpu.GpuReader()
    assert reader.read() == [] and reader.compute_processes() == []
    assert reader.backend == "none" and reader.no_gpu_tools is True
    assert (reader.error is not None) == nvml_installed  # why NVML did not answer, for a preflight


def test_failing_nvidia_smi_is_reported(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)

    def runner(argv, timeout=30):
        return 9, "", "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."

    reader = gpu.GpuReader(runner=runner)
    assert reader.read() == []
    assert reader.backend == "none"
    assert "rc 9" in reader.error and "couldn't communicate" in reader.error
