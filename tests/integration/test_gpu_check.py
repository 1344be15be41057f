"""tools/gpu-check, the check prepared for a real NVIDIA host, run here on what this machine has.

Without a driver it must skip cleanly (exit 0, the reason). With --simulate it runs every one of its
checks through the same NVML binding, against the fake libnvidia-ml.so.1 and a process that grows
its scripted GPU memory in steps: so the script that will meet a real GPU has already run whole.
"""
import json
import os
import subprocess
import sys

from tests.fakes import fake_nvml
from tests.helpers import TOOLS

GPU_CHECK = os.path.join(TOOLS, "gpu-check")


def run(tmp_path, *args, **env):
    return subprocess.run([sys.executable, GPU_CHECK] + list(args), capture_output=True, text=True, timeout=180,
                          env=dict(os.environ, **env))


def test_without_a_driver_it_skips_saying_why(tmp_path):
    done = run(tmp_path, LD_LIBRARY_PATH=str(tmp_path))  # no libnvidia-ml.so.1 there
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("SKIPPED: no NVIDIA driver or GPU here: dlopen: libnvidia-ml.so.1")


def test_every_check_runs_on_scripted_gpus_through_nvml(tmp_path):
    library = os.path.dirname(fake_nvml.build(str(tmp_path / "nvml")))
    gpus = tmp_path / "gpu"
    done = run(tmp_path, "--simulate", str(gpus), "--out", str(tmp_path), LD_LIBRARY_PATH=library,
               MODELWAKE_FAKE_GPU_DIR=str(gpus))
    assert done.returncode == 0 and done.stdout.rstrip().endswith("PASSED"), done.stdout + done.stderr
    figures = json.loads((tmp_path / "gpu-check.json").read_text())
    assert all(check["ok"] for check in figures["checks"].values())
    # The six steps of 1024 MiB were read through NVML and the process is the GPU's holder.
    assert figures["memory_used_mib"][-1] - figures["memory_used_mib"][0] >= 6 * 1024
    assert figures["holders"] and figures["holders"][0]["used_memory_mib"] == figures["memory_used_mib"][-1]
    assert figures["result"]["phase"] == "stalled"
    assert figures["read_cost"]["gpus"] == 8 and figures["read_cost"]["read_cpu_ms"] > 0
    # The health preflight's reads, through NVML and through the scripted nvidia-smi, of the scripted picture.
    health = figures["health"]
    for read in (health["nvml"], health["nvidia_smi"]):
        assert (read["driver_version"], read["cuda_version"]) == ("570.124.06", "12.8")
        assert read["gpus"][0]["persistence_mode"] is True
        assert read["gpus"][0]["remapped_rows"] == {"correctable": 2, "uncorrectable": 0, "pending": False,
                                                    "failure": False}
    assert health["nvml"]["backend"] == "nvml" and health["nvidia_smi"]["backend"] == "nvidia-smi"
    assert health["problems"] == []
    assert "nvidia-smi agrees; the preflight would pass" in done.stdout
