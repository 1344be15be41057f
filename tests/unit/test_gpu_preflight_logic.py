"""The GPU preflight's logic: holders, their units, the plan, the read rate (the model directory: test_model_dir.py).

GPUs come from the faked NVML calls (tests/fakes/nvml_api.py); /proc is a directory tree written by
the test, so PIDs, users and cgroups are exactly the ones described here. No sleeping: the read
rate is measured with an injected clock.
"""
import os

import pytest

from ansible_collections.modelwake.serving.plugins.module_utils.preflight import holders
from ansible_collections.modelwake.serving.plugins.module_utils.host.gpu import GpuReader
from tests.helpers.fakes import fresh_nvml_api

MIB = 1024 * 1024


@pytest.fixture
def nvml():
    return fresh_nvml_api()


def write_proc(root, pid, cmdline, uid=0, cgroup="0::/user.slice/user-0.slice/session-3.scope\n"):
    base = root / str(pid)
    base.mkdir(parents=True)
    (base / "stat").write_text("%d (python3) S 1 %d %d 0 -1 4194304 0 0 0 0 10 5 0 0 20 0 1 0 100 0 0\n" % (pid, pid, pid))
    (base / "cmdline").write_bytes(b"\0".join(w.encode() for w in cmdline) + b"\0")
    (base / "status").write_text("Name:\tpython3\nUid:\t%d\t%d\t%d\t%d\n" % (uid, uid, uid, uid))
    (base / "cgroup").write_text(cgroup)


def gpu(index, used, total=97887):
    return {"index": index, "uuid": "GPU-%d" % index, "memory_used_mib": used, "memory_total_mib": total,
            "utilization": 0}


def holder(pid, unit, gpus, user="root", cmdline="python"):
    return {"pid": pid, "user": user, "unit": unit, "cmdline": cmdline, "gpus": gpus}


@pytest.mark.parametrize("text,unit", [
    ("0::/system.slice/sglang-k26.service\n", "sglang-k26.service"),
    ("0::/system.slice/sglang-k26.service/worker\n", "sglang-k26.service"),
    ("12:memory:/system.slice/x.service\n1:name=systemd:/system.slice/sglang-k26-ddtree.service\n0::/\n",
     "sglang-k26-ddtree.service"),
    ("0::/user.slice/user-0.slice/session-3.scope\n", "session-3.scope"),
    ("0::/\n", None),
    ("", None),
])
def test_unit_from_cgroup(text, unit):
    assert holders.unit_from_cgroup(text) == unit


def test_plan_sorts_own_stoppable_and_foreign():
    gpus = [gpu(0, 80000), gpu(1, 76000), gpu(2, 300)]
    found = [holder(10, "sglang-k26.service", {0: 20000, 1: 76000}),
             holder(11, "sglang-k26-ddtree.service", {0: 55000}),
             holder(12, "session-3.scope", {0: 5000}),
             holder(13, None, {2: 300})]
    result = holders.plan(gpus, found, needed=[0, 1, 2], service_unit="sglang-k26",
                          stop_units=["sglang-k26-ddtree"], max_foreign_mib=1024)
    assert [(h["pid"], h["verdict"]) for h in result["holders"]] == [
        (10, "own"), (11, "stoppable"), (12, "foreign"), (13, "foreign")]
    # GPU 0: 5000 MiB foreign (the ddtree unit may be stopped, so it does not count); GPU 2: 300 <= 1024.
    assert result["blocking_gpus"] == [0]
    assert [h["pid"] for h in result["blocking"]] == [12]
    assert result["stop_units"] == ["sglang-k26-ddtree.service"]


def test_plan_only_stops_units_that_hold_needed_gpus():
    gpus = [gpu(0, 55000), gpu(1, 55000)]
    found = [holder(11, "sglang-k26-ddtree.service", {1: 55000})]
    result = holders.plan(gpus, found, needed=[0], service_unit="sglang-k26",
                          stop_units=["sglang-k26-ddtree", "other"])
    assert result["stop_units"] == []
    assert result["holders"] == []


def test_plan_unknown_memory_blocks():
    result = holders.plan([gpu(0, 10)], [holder(5, None, {0: None})], needed=[0], max_foreign_mib=1024)
    assert result["blocking_gpus"] == [0]


def test_plan_missing_gpus_and_free_memory():
    gpus = [gpu(0, 60000), gpu(1, 0)]
    found = [holder(10, "sglang-k26.service", {0: 40000})]
    result = holders.plan(gpus, found, needed=[0, 1, 2], service_unit="sglang-k26", min_free_mib=80000)
    assert result["missing_gpus"] == [2]
    # GPU 0: 97887 - 60000 + 40000 (own, freed by the restart) = 77887 < 80000.
    assert result["short_gpus"] == [{"index": 0, "free_mib": 77887, "needed_mib": 80000}]


def test_plan_counts_free_memory_as_the_driver_does_when_it_says():
    """Where the reader has the driver's own free figure, the reserved memory (615 MiB of an H200,
    in neither `used` nor `free`) is not counted as free."""
    exact = dict(gpu(0, 17000), memory_free_mib=97887 - 615 - 17000)
    result = holders.plan([exact, gpu(1, 17000)], [], needed=[0, 1], min_free_mib=80500)
    assert result["short_gpus"] == [{"index": 0, "free_mib": 80272, "needed_mib": 80500}]


def test_plan_derives_the_need_from_the_model_size():
    gpus = [gpu(0, 97000), gpu(1, 0)]
    result = holders.plan(gpus, [], needed=[0, 1], model_bytes=2 * 1000 * MIB)
    assert result["min_free_mib"] == 1000
    assert [s["index"] for s in result["short_gpus"]] == [0]


def test_plan_all_gpus_when_none_named():
    result = holders.plan([gpu(0, 0), gpu(3, 0)], [], needed=[])
    assert result["needed"] == [0, 3]


def test_survey_reads_nvml_and_proc(tmp_path, nvml):
    nvml.configure(devices=[
        {"uuid": "GPU-a", "memory_used_mib": 55100, "memory_total_mib": 97887, "utilization": 0,
         "processes": [{"pid": 4242, "used_mib": 55000}]},
        {"uuid": "GPU-b", "memory_used_mib": 100, "memory_total_mib": 97887, "utilization": 0,
         "processes": [{"pid": 4243, "used_mib": None}]},
    ])
    proc = tmp_path / "proc"
    write_proc(proc, 4242, ["python", "ddtree_qwen_wrapper.py", "--port", "30010"])
    write_proc(proc, 4243, ["python", "mystery.py"], uid=os.getuid(),
               cgroup="0::/system.slice/sglang-k26-ddtree.service\n")
    result = holders.survey(needed=[0, 1], service_unit="sglang-k26", stop_units=["sglang-k26-ddtree"],
                            reader=GpuReader(nvml=nvml), proc_root=str(proc))
    assert result["backend"] == "nvml"
    assert [h["pid"] for h in result["blocking"]] == [4242]
    assert result["blocking"][0]["cmdline"] == "python ddtree_qwen_wrapper.py --port 30010"
    assert result["blocking"][0]["user"] == "root"
    assert result["blocking"][0]["unit"] == "session-3.scope"
    assert result["stop_units"] == ["sglang-k26-ddtree.service"]
    table = result["blocking_table"]
    assert table[0].split()[:5] == ["PID", "USER", "UNIT", "VERDICT", "GPU"]
    assert table[1].split()[:5] == ["4242", "root", "session-3.scope", "foreign", "0:55000"]
    assert "?" in result["holder_table"][2]  # NVML could not tell pid 4243's memory


def test_survey_without_gpus(tmp_path):
    def no_smi(argv, timeout):
        return 127, "", "nvidia-smi: command not found"

    class NoNvml(object):
        def nvmlInit(self):
            raise RuntimeError("NVML Shared Library Not Found")

    result = holders.survey(reader=GpuReader(nvml=NoNvml(), runner=no_smi), proc_root=str(tmp_path))
    assert result["gpus"] == [] and result["backend"] == "none"
    assert "NVML Shared Library Not Found" in result["backend_error"]
