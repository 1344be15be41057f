"""The gpu_preflight role run by ansible-playbook against this machine, with the scripted GPUs.

tests/fakes/nvidia-smi is first on PATH and reads a temporary MODELWAKE_FAKE_GPU_DIR (the health
tests put the fake libnvidia-ml.so.1 on LD_LIBRARY_PATH too, so NVML answers); the GPU
"holders" are real processes started here (and stopped by PID afterwards). This machine has no
systemd, so no holder can be attributed to a unit: the stop-a-listed-unit path is tested on the
systemd test hosts (molecule/deploy-preflight).
"""
import json
import os
import re
import subprocess
import sys

import numpy
import pytest
from safetensors.numpy import save_file

from tests.fakes import fake_nvml
from tests.helpers import ANSIBLE_PLAYBOOK as PLAYBOOK, FAKES, ROOT
MIB = 1024 * 1024

PLAY = """
- name: Run the GPU preflight
  hosts: all
  connection: local
  gather_facts: false
  environment:
    PATH: "{{ fake_path }}"
    MODELWAKE_FAKE_GPU_DIR: "{{ fake_gpu_dir }}"
    LD_LIBRARY_PATH: "{{ fake_library_dir }}"
  roles:
    - role: gpu_preflight
  tasks:
    - name: Show what the preflight keeps for the model's service
      ansible.builtin.debug:
        msg: "expected load seconds: {{ gpu_preflight_expected_load_seconds }}, disk rate: {{ gpu_preflight_disk_rate }}"
"""


@pytest.fixture
def gpu_dir(tmp_path):
    path = tmp_path / "gpus"
    path.mkdir()
    gpus = [{"index": i, "name": "NVIDIA RTX PRO 6000 Blackwell Server Edition", "uuid": "GPU-fake-%d" % i,
             "memory_total_mib": 97887, "memory_used_mib": 0, "utilization_gpu": 0} for i in range(8)]
    (path / "gpus.json").write_text(json.dumps({"gpus": gpus}))
    return path


@pytest.fixture
def holder_process(gpu_dir):
    """A real process holding 55000 MiB on GPU 0 in the scripted picture, like a stale wrapper left from an earlier run."""
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()", "ddtree-qwen-wrapper"],
                            stdin=subprocess.PIPE)
    (gpu_dir / "holder-ddtree.json").write_text(json.dumps(
        {"pid": proc.pid, "name": "python", "gpus": {"0": {"memory_mib": 55000, "utilization": 0}}}))
    yield proc
    proc.stdin.close()
    proc.kill()
    proc.wait()


@pytest.fixture
def model(tmp_path):
    path = tmp_path / "model"
    path.mkdir()
    (path / "config.json").write_text("{}")
    names = ["model-%05d-of-00004.safetensors" % (i + 1) for i in range(4)]
    (path / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": 4 * 8 * MIB}, "weight_map": dict(("w%d" % i, n) for i, n in enumerate(names))}))
    for i, name in enumerate(names):
        save_file({"w%d" % i: numpy.frombuffer(os.urandom(8 * MIB), dtype=numpy.uint8)}, str(path / name))
        # On disk, as a downloaded model is: dirty pages of a file just written stay cached, and the
        # preflight then reads its sample warm and gives no estimate (a unit test covers that case).
        fd = os.open(str(path / name), os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
    return path


def run(tmp_path, gpu_dir, host_vars, path=None, library_dir="", check=False):
    inventory = {"all": {"hosts": {"gpuhost": dict(host_vars, ansible_python_interpreter=sys.executable)}}}
    (tmp_path / "inventory.json").write_text(json.dumps(inventory))
    (tmp_path / "play.yml").write_text(PLAY)
    extra = {"fake_path": path if path is not None else FAKES + os.pathsep + os.environ["PATH"],
             "fake_gpu_dir": str(gpu_dir), "fake_library_dir": library_dir}
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    return subprocess.run([PLAYBOOK, "-i", str(tmp_path / "inventory.json"), str(tmp_path / "play.yml"),
                           "-e", json.dumps(extra)] + (["--check"] if check else []), cwd=ROOT, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, universal_newlines=True, timeout=300)


def flat(text):
    return " ".join(text.split())


def test_free_gpus_and_a_complete_model_pass(tmp_path, gpu_dir, model):
    proc = run(tmp_path, gpu_dir, {"gpu_preflight_gpus": list(range(8)), "gpu_preflight_model_path": str(model),
                                   "gpu_preflight_service_unit": "sglang-k26", "gpu_preflight_read_sample_mib": 4})
    assert proc.returncode == 0, proc.stdout
    out = flat(proc.stdout)
    assert "4 shards, 0.0 GiB; disk read" in out
    assert "(4 MiB sampled), expected load time" in out
    # 32 MiB read from a fast disk or the page cache rounds to 0.0 s: still measured, so 1 s at least.
    expected = re.search(r"expected load seconds: (\d+), disk rate: (\d+)", out)
    assert expected and int(expected.group(1)) >= 1, out
    assert int(expected.group(2)) > 0, out
    # 4 MiB asked: one reader's range (the blocks are 16 MiB), read cold as the fixture synced it.
    assert "/s cold, 1 reader (4 MiB sampled), expected load time" in out
    assert "no process holds the needed GPUs" in out
    assert "0/97887" in out
    # The health read through nvidia-smi (no driver library here): the fake's healthy defaults.
    assert "driver 580.95.05 (CUDA 13.0)" in out
    assert "GPU 7 persistence on remapped rows 0 correctable, 0 uncorrectable" in out


def test_foreign_holder_fails_naming_its_pid(tmp_path, gpu_dir, holder_process):
    proc = run(tmp_path, gpu_dir, {"gpu_preflight_gpus": [0, 1], "gpu_preflight_service_unit": "sglang-k26",
                                   "gpu_preflight_stop_units": ["sglang-k26-ddtree"]})
    assert proc.returncode == 2, proc.stdout
    out = flat(proc.stdout)
    assert "GPUs 0 of gpuhost are held by processes outside sglang-k26 (more than 1024 MiB), PIDs %d" % holder_process.pid in out
    # The table row: pid, user, no unit (this machine has no systemd), verdict, memory, command line.
    assert "%d root - foreign 0:55000" % holder_process.pid in out
    assert "ddtree-qwen-wrapper" in out
    assert "Nothing was changed" in out
    # Listed in gpu_preflight_stop_units or not, a process outside a unit is never touched.
    assert holder_process.poll() is None


def test_holder_on_a_gpu_not_needed_passes(tmp_path, gpu_dir, holder_process):
    proc = run(tmp_path, gpu_dir, {"gpu_preflight_gpus": [1, 2, 3]})
    assert proc.returncode == 0, proc.stdout
    assert holder_process.poll() is None


def test_threshold_lets_a_small_holder_pass(tmp_path, gpu_dir, holder_process):
    proc = run(tmp_path, gpu_dir, {"gpu_preflight_gpus": [0], "gpu_preflight_max_foreign_mib": 60000,
                                   "gpu_preflight_min_free_mib": 50000})
    assert proc.returncode == 2, proc.stdout
    # Not blocked by the holder (55000 <= 60000), but only 97887 - 55000 < 50000 MiB are free.
    assert "GPU 0 has 42887 MiB free" in flat(proc.stdout)


def test_checksums_refuse_a_changed_shard_then_are_remembered(tmp_path, gpu_dir, model):
    import hashlib
    names = sorted(p.name for p in model.iterdir() if p.name.endswith(".safetensors"))
    sums = dict((n, hashlib.sha256((model / n).read_bytes()).hexdigest()) for n in names)
    state = tmp_path / "model-checks"
    args = {"gpu_preflight_model_path": str(model), "gpu_preflight_verify_checksums": True,
            "gpu_preflight_checksum_state_dir": str(state), "gpu_preflight_read_sample_mib": 0,
            "gpu_preflight_required": False}
    # The published sum of shard 2 is not what is on disk (a bit flipped in transit, say).
    (model / "SHA256SUMS").write_text("".join("%s  %s\n" % ("f" * 64 if n == names[1] else sums[n], n) for n in names))
    proc = run(tmp_path, gpu_dir, args)
    assert proc.returncode == 2, proc.stdout
    assert "%s: its SHA-256 is %s, SHA256SUMS says %s" % (names[1], sums[names[1]], "f" * 64) in flat(proc.stdout)
    assert "Read the GPUs and who holds them" not in proc.stdout
    (model / "SHA256SUMS").write_text("".join("%s  %s\n" % (sums[n], n) for n in names))
    proc = run(tmp_path, gpu_dir, args)
    assert proc.returncode == 0, proc.stdout
    # The three shards that matched in the refused run were remembered; only the fourth is read again.
    assert "SHA-256 (SHA256SUMS): 1 verified now, 3 unchanged since verified, 0 without a published sum" in flat(proc.stdout)
    proc = run(tmp_path, gpu_dir, args)
    assert "0 verified now, 4 unchanged since verified" in flat(proc.stdout)


def test_missing_shard_fails_before_the_gpus_are_read(tmp_path, gpu_dir, model):
    os.unlink(str(model / "model-00003-of-00004.safetensors"))
    proc = run(tmp_path, gpu_dir, {"gpu_preflight_model_path": str(model)})
    assert proc.returncode == 2, proc.stdout
    assert "1 of 4 shards named in the index are missing: model-00003-of-00004.safetensors" in flat(proc.stdout)
    assert "Read the GPUs and who holds them" not in proc.stdout


def test_no_gpu_is_an_error_unless_not_required(tmp_path, gpu_dir):
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    path = str(empty) + os.pathsep + "/usr/bin:/bin"
    proc = run(tmp_path, gpu_dir, {"gpu_preflight_gpus": [0]}, path=path)
    assert proc.returncode == 2, proc.stdout
    assert "No GPU found on gpuhost" in flat(proc.stdout)
    assert "gpu_preflight_required: false" in flat(proc.stdout)
    proc = run(tmp_path, gpu_dir, {"gpu_preflight_gpus": [0], "gpu_preflight_required": False}, path=path)
    assert proc.returncode == 0, proc.stdout
    assert "continuing because gpu_preflight_required is false" in flat(proc.stdout)


@pytest.mark.parametrize("bad,message", [
    ({"gpu_preflight_gpus": [0, 0]}, "gpu_preflight_gpus must be distinct GPU indices"),
    ({"gpu_preflight_service_unit": "sglang-k26", "gpu_preflight_stop_units": ["sglang-k26"]},
     "the unit being deployed cannot be in the list of units to stop"),
    ({"gpu_preflight_model_path": "models/k26"}, "gpu_preflight_model_path must be an absolute path"),
    ({"gpu_preflight_max_foreign_mib": "lots"}, "gpu_preflight_max_foreign_mib"),
])
def test_bad_input_is_a_clear_error(tmp_path, gpu_dir, bad, message):
    proc = run(tmp_path, gpu_dir, bad)
    assert proc.returncode == 2, proc.stdout
    assert message in flat(proc.stdout)
    assert "Read the GPUs and who holds them" not in proc.stdout


# The GPU health preflight: NVML answers from the scripted picture, and each refusal comes before
# anything on the host changes (no unit stopped, no holder touched, changed=0).

@pytest.fixture(scope="module")
def library_dir(tmp_path_factory):
    return os.path.dirname(fake_nvml.build(str(tmp_path_factory.mktemp("fake-nvml"))))


def script_health(gpu_dir, **per_gpu_and_system):
    """Change the picture of gpu_dir: {"gpus": {index: fields}} and top-level fields (driver_version, ...)."""
    spec = json.loads((gpu_dir / "gpus.json").read_text())
    for index, fields in per_gpu_and_system.pop("gpus", {}).items():
        spec["gpus"][index].update(fields)
    spec.update(per_gpu_and_system)
    (gpu_dir / "gpus.json").write_text(json.dumps(spec))


def assert_refused_before_any_change(proc):
    assert proc.returncode == 2, proc.stdout
    assert "nothing was changed" in flat(proc.stdout)
    assert "Read the GPUs and who holds them" not in proc.stdout
    assert re.search(r"gpuhost\s*: ok=\d+\s+changed=0\s", proc.stdout), proc.stdout


@pytest.mark.parametrize("check", [False, True], ids=["run", "check-mode"])
def test_persistence_mode_off_is_refused_naming_the_gpu_and_the_fix(tmp_path, gpu_dir, holder_process, library_dir,
                                                                     check):
    script_health(gpu_dir, gpus={1: {"persistence_mode": False}})
    proc = run(tmp_path, gpu_dir, {"gpu_preflight_gpus": [0, 1], "gpu_preflight_service_unit": "sglang-k26",
                                   "gpu_preflight_stop_units": ["sglang-k26-ddtree"]},
               library_dir=library_dir, check=check)
    assert_refused_before_any_change(proc)
    out = flat(proc.stdout)
    assert "The GPUs of gpuhost are not healthy, nothing was changed:" in out
    assert ("GPU 1 (GPU-fake-1) has persistence mode off: enable it: nvidia-smi -pm 1 (until the next reboot) or the "
            "nvidia-persistenced service") in out
    assert "GPU 0 (GPU-fake-0) has persistence" not in out
    assert holder_process.poll() is None


def test_a_gpu_not_needed_does_not_refuse_and_a_check_turned_off_only_reports(tmp_path, gpu_dir, library_dir):
    script_health(gpu_dir, gpus={2: {"persistence_mode": False, "remapped_rows": None}})
    proc = run(tmp_path, gpu_dir, {"gpu_preflight_gpus": [0, 1]}, library_dir=library_dir)
    assert proc.returncode == 0, proc.stdout
    proc = run(tmp_path, gpu_dir, {"gpu_preflight_gpus": [2], "gpu_preflight_require_persistence": False},
               library_dir=library_dir)
    assert proc.returncode == 0, proc.stdout
    assert "not required: GPU 2 (GPU-fake-2) has persistence mode off" in flat(proc.stdout)
    assert "GPU 2 persistence off remapped rows n/a" in flat(proc.stdout)
    assert "GPU 2: no row remapping on this GPU (before Ampere): not checked" in flat(proc.stdout)


def test_a_row_remapping_failure_and_a_pending_remap_are_refused(tmp_path, gpu_dir, library_dir):
    script_health(gpu_dir, gpus={3: {"remapped_rows": {"correctable": 0, "uncorrectable": 640, "pending": 0,
                                                      "failure": 1}},
                                 4: {"remapped_rows": {"correctable": 1, "uncorrectable": 0, "pending": 1,
                                                      "failure": 0}}})
    proc = run(tmp_path, gpu_dir, {"gpu_preflight_gpus": [3, 4, 5]}, library_dir=library_dir)
    assert_refused_before_any_change(proc)
    out = flat(proc.stdout)
    assert ("GPU 3 (GPU-fake-3) has a row-remapping failure (640 rows remapped for uncorrectable errors, 0 for "
            "correctable ones): its memory has a fault it can no longer hide: drain the node and have the GPU "
            "replaced.") in out
    assert ("GPU 4 (GPU-fake-4) has a pending row remap: reset the GPU (nvidia-smi -r -i 4, with no process on it) "
            "or reboot to apply the pending remap.") in out


def test_gpus_that_never_joined_the_nvswitch_fabric_are_refused(tmp_path, gpu_dir, library_dir):
    """An HGX host whose fabric manager is down: NVML reports every GPU's fabric registration not started."""
    script_health(gpu_dir, driver_version="570.124.06", cuda_driver_version=12080,
                  gpus=dict((i, {"fabric": {"state": "not_started", "status": 0}}) for i in range(8)))
    proc = run(tmp_path, gpu_dir, {"gpu_preflight_gpus": [0, 1]}, library_dir=library_dir)
    assert_refused_before_any_change(proc)
    out = flat(proc.stdout)
    for index in (0, 1):
        assert ("GPU %d (GPU-fake-%d) has not joined the NVSwitch fabric (fabric manager not running): install and "
                "start nvidia-fabricmanager matching driver 570.124.06" % (index, index)) in out
    assert "GPU 2 (GPU-fake-2)" not in out


def test_a_driver_older_than_the_engines_torch_build_is_refused(tmp_path, gpu_dir, library_dir):
    venv = tmp_path / "venv"
    torch = venv / "lib" / "python3.12" / "site-packages" / "torch"
    torch.mkdir(parents=True)
    (torch / "version.py").write_text("__version__ = '2.9.1+cu128'\ncuda: Optional[str] = '12.8'\n")
    script_health(gpu_dir, driver_version="535.104.05", cuda_driver_version=12020)
    proc = run(tmp_path, gpu_dir, {"gpu_preflight_gpus": [0], "gpu_preflight_venv": str(venv)},
               library_dir=library_dir)
    assert_refused_before_any_change(proc)
    assert ("GPU driver 535.104.05 supports CUDA 12.2, the engine's torch 2.9.1+cu128 is built for CUDA 12.8: "
            "upgrade the driver to >= 570.26 (or install a torch built for cu122).") in flat(proc.stdout)
    # The simulated engine's venv has no torch: the comparison is skipped and says so.
    proc = run(tmp_path, gpu_dir, {"gpu_preflight_gpus": [0], "gpu_preflight_venv": str(tmp_path / "no-torch")},
               library_dir=library_dir)
    assert proc.returncode == 0, proc.stdout
    assert "no torch in %s" % (tmp_path / "no-torch") in flat(proc.stdout)
