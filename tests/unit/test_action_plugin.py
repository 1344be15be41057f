"""The action plugin's progress line and its interval setting (its loop runs in
tests/integration/test_live_progress.py, under real ansible-playbook)."""
import importlib.util
import os

import pytest
from ansible.errors import AnsibleError

from tests.helpers import ROOT

SPEC = importlib.util.spec_from_file_location(
    "wait_for_model_ready_action", os.path.join(ROOT, "plugins", "action", "wait_for_model_ready.py"))
action = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(action)

GIB = 1024 ** 3


def loading_result(**overrides):
    result = {"phase": "loading", "elapsed": 100, "bytes_read": int(1.25 * GIB), "read_rate": 50 * 1024 ** 2,
              "eta": 16.0, "shards": [39, 64],
              "gpu": [{"index": i, "memory_used_mib": 30720, "utilization": 0} for i in range(8)]}
    result.update(overrides)
    return result


INFO = {"expected_bytes": 2 * GIB, "gpu_total_mib": 8 * 97887,
        "log_line": "Loading safetensors checkpoint shards:  61% Completed | 39/64"}


def test_the_line_says_phase_elapsed_bytes_rate_eta_gpus_and_the_last_log_line():
    assert action.progress_line("k26-1", loading_result(), INFO) == (
        "wait_for_model_ready [k26-1]: loading 1m40s | read 1.2 GiB / 2.0 GiB (62 %) at 50.0 MiB/s | "
        "shards 39/64 | ETA 16s | GPU x8 240.0 GiB / 764.7 GiB | "
        "log: Loading safetensors checkpoint shards:  61% Completed | 39/64")


def test_what_is_unknown_is_left_out():
    result = {"phase": "starting", "elapsed": 3725, "bytes_read": None, "read_rate": None, "eta": None,
              "shards": None, "gpu": []}
    assert action.progress_line("h", result, {"expected_bytes": None, "gpu_total_mib": None, "log_line": None}) \
        == "wait_for_model_ready [h]: starting 1h02m"
    no_expected = loading_result(eta=None, shards=None, read_rate=None, bytes_read=5 * 1024 ** 2)
    line = action.progress_line("h", no_expected, dict(INFO, expected_bytes=None, gpu_total_mib=None))
    assert "| read 5.0 MiB | GPU x8 240.0 GiB | log:" in line


@pytest.mark.parametrize("value,interval", [(None, 25), ("5", 5.0), (2.5, 2.5), (0, 0.0)])
def test_progress_interval(value, interval):
    assert action.progress_interval(value) == interval


@pytest.mark.parametrize("value", ["soon", -1, [3]])
def test_a_bad_progress_interval_names_the_variable(value):
    with pytest.raises(AnsibleError, match="modelwake_progress_interval must be a number of seconds"):
        action.progress_interval(value)


def test_every_failure_gets_the_phase_and_elapsed_the_docs_promise():
    refused = {"failed": True, "msg": "argument 'timeout' is of type str"}
    assert action.with_phase(refused) == dict(refused, phase="failed", elapsed=0)
    stalled = {"failed": True, "msg": "stalled: ...", "phase": "stalled", "elapsed": 640}
    assert action.with_phase(stalled) == stalled
    assert action.with_phase({"phase": "ready", "elapsed": 3}) == {"phase": "ready", "elapsed": 3}


@pytest.mark.parametrize("callback,to_stderr", [("default", False), ("ansible.builtin.default", False),
                                                ("community.general.yaml", False), ("ansible.posix.json", True),
                                                ("json", True), ("ansible.posix.jsonl", True), ("awx_display", True)])
def test_lines_stay_off_a_machine_readable_stdout(callback, to_stderr):
    assert action.lines_to_stderr(callback) is to_stderr


FOLLOW = {"path": "/run/modelwake/modelwake-wait-x.json", "fifo": "/run/modelwake/modelwake-wait-x.fifo",
          "pid": 4321, "boot_id": "boot-a"}
LAST = {"done": False, "result": {"phase": "loading", "elapsed": 95, "bytes_read": 10}}


def test_a_wait_that_ended_without_a_verdict_keeps_its_last_look_and_says_why():
    rebooted = action.ended_without_verdict("rebooted", None, FOLLOW)
    assert rebooted["failed"] is True and rebooted["phase"] == "failed" and rebooted["elapsed"] == 0
    assert rebooted["msg"].startswith("failed: the host rebooted during the wait (boot id boot-a)")
    killed = action.ended_without_verdict("gone", LAST, FOLLOW)
    assert killed["elapsed"] == 95 and killed["bytes_read"] == 10
    assert "pid 4321" in killed["msg"] and "in phase loading" in killed["msg"]
    cleaned = action.ended_without_verdict("gone", None, FOLLOW)
    assert FOLLOW["path"] in cleaned["msg"]


def test_a_slow_load_s_line_follows_the_rate():
    slow = "loading at 50 MiB/s, 68x below this disk's 3.6 GB/s: reads too few or too small to fill the device"
    line = action.progress_line("k26-1", loading_result(bottleneck=slow), INFO)
    assert line.startswith("wait_for_model_ready [k26-1]: loading 1m40s | read 1.2 GiB / 2.0 GiB (62 %) at 50.0 MiB/s | "
                           + slow + " | shards 39/64 |")
    assert " below this disk" not in action.progress_line("k26-1", loading_result(bottleneck=""), INFO)
