"""plugins/modules/model_service_restart_pending.py: the stateless "restart still owed" check.

The decision is a pure function of `systemctl show`, the paths' mtimes and the host's two clocks,
replayed here as case tables; main() runs against a scripted systemctl and real files.
"""
import os
import sys
import time

import pytest
import yaml
from ansible.module_utils import basic

from ansible_collections.modelwake.serving.plugins.module_utils.host.systemd import parse_show
from ansible_collections.modelwake.serving.plugins.modules import model_service_restart_pending as module
from tests.helpers.modules import call_main, patch_exits

UNIT = "sglang-k26.service"
# The host's clocks: wall time 1_000_000 s, monotonic 5_000 s (the service started at monotonic 4_000).
NOW_REAL, NOW_MONO = 1000000.0, 5000.0
STARTED = NOW_REAL - 1000.0


def show(**props):
    base = {"LoadState": "loaded", "ActiveState": "active", "SubState": "running", "MainPID": "4242",
            "NeedDaemonReload": "no", "InvocationID": "abc", "ExecMainStartTimestampMonotonic": "4000000000"}
    base.update(props)
    return parse_show("\n".join("%s=%s" % item for item in base.items()))


def decide(props, mtimes):
    return module.restart_pending(UNIT, props, mtimes, NOW_REAL, NOW_MONO)


@pytest.mark.parametrize("props, mtimes, pending, reason", [
    # A normal unchanged run: everything older than the start.
    (show(), [("/unit", STARTED - 60), ("/env", STARTED - 3600)], False, "after every file it runs from changed"),
    # The controller died after writing the unit, before the handler restarted.
    (show(), [("/unit", STARTED + 30), ("/env", STARTED - 60)], True, "before /unit changed (999030.0)"),
    # Still loading (Type=notify activating) from an old unit: pending as well.
    (show(ActiveState="activating", SubState="start"), [("/venv", STARTED + 5)], True, "before /venv changed"),
    # After a reboot systemd started it after every file: nothing owed, just wait.
    (show(ExecMainStartTimestampMonotonic="4990000000"), [("/unit", NOW_REAL - 60)], False, "after every file"),
    # The unit file changed on disk since systemd loaded it, whatever the mtimes say.
    (show(NeedDaemonReload="yes"), [], True, "NeedDaemonReload=yes"),
    # Down, failed or not installed: a start (not a restart) reads the current files.
    (show(ActiveState="inactive", SubState="dead", MainPID="0"), [("/unit", NOW_REAL - 1)], False, "is inactive"),
    (show(ActiveState="failed", SubState="failed", MainPID="0"), [("/unit", NOW_REAL - 1)], False, "is failed"),
    (show(LoadState="not-found", ActiveState="inactive", NeedDaemonReload="no"), [], False, "LoadState not-found"),
    # Between two automatic restarts no process runs: the next start reads the current files.
    (show(ActiveState="activating", SubState="auto-restart", MainPID="0"), [("/unit", NOW_REAL - 1)], False,
     "no main process now (auto-restart)"),
    # A clock stepped back since the file was written: ignored, or it would restart on every run.
    (show(), [("/unit", NOW_REAL + 3600)], False, "after every file"),
])
def test_decision_table(props, mtimes, pending, reason):
    result = decide(props, mtimes)
    assert result["pending"] is pending
    assert reason in result["reason"]


def test_start_is_placed_on_the_wall_clock_through_the_monotonic_clock():
    result = decide(show(), [("/old", STARTED - 1), ("/a", STARTED + 10), ("/b", STARTED + 20)])
    assert result["started"] == STARTED
    assert [entry["path"] for entry in result["newer"]] == ["/b", "/a"]  # newest first
    assert result["reason"] == "sglang-k26.service started at 999000.0, before /b changed (999020.0)"


def test_a_future_mtime_is_reported_not_counted():
    result = decide(show(), [("/unit", NOW_REAL + 10), ("/env", STARTED - 1)])
    assert result["future"] == [{"path": "/unit", "mtime": NOW_REAL + 10}]
    assert result["newer"] == [] and result["pending"] is False


def test_a_file_written_in_the_same_instant_as_the_start_is_not_newer():
    # Handlers write nothing: whatever a run wrote came before the restart, so equal is not newer.
    assert decide(show(), [("/unit", STARTED)])["pending"] is False


def test_path_mtimes_expands_patterns_and_skips_missing_paths(tmp_path):
    site = tmp_path / "venv" / "lib" / "python3.11" / "site-packages"
    site.mkdir(parents=True)
    unit = tmp_path / "unit.service"
    unit.write_text("[Service]\n")
    os.utime(str(unit), (1000.0, 1000.0))
    found = module.path_mtimes([str(unit), str(tmp_path / "absent.yaml"), str(tmp_path / "venv/lib/python*/site-packages"),
                                str(unit)])
    assert found == [(str(unit), 1000.0), (str(site), os.stat(str(site)).st_mtime)]


def run_module(monkeypatch, args, answer):
    """main() with `systemctl show` scripted: answer is (rc, stdout, stderr)."""
    calls = []

    def run_command(self, argv, **kwargs):
        calls.append(argv)
        return answer

    patch_exits(monkeypatch)
    monkeypatch.setattr(basic.AnsibleModule, "run_command", run_command)
    return call_main(module.main, args), calls


def test_main_finds_a_unit_file_written_after_the_start(monkeypatch, tmp_path):
    unit = tmp_path / "sglang-k26.service"
    unit.write_text("[Service]\n")
    # The service started 100 s ago on the monotonic clock; the unit was written 10 s ago.
    start_usec = int((time.monotonic() - 100) * 1e6)
    os.utime(str(unit), (time.time() - 10, time.time() - 10))
    out = ("LoadState=loaded\nActiveState=active\nSubState=running\nMainPID=4242\nNeedDaemonReload=no\n"
           "InvocationID=abc\nExecMainStartTimestampMonotonic=%d\n" % start_usec)
    result, calls = run_module(monkeypatch, {"unit": UNIT, "paths": [str(unit)]}, (0, out, ""))
    assert calls == [["systemctl", "show", UNIT, "-p", ",".join(module.PROPERTIES)]]
    assert result["changed"] is False and result["pending"] is True
    assert result["invocation_id"] == "abc"
    assert abs(result["started"] - (time.time() - 100)) < 5
    assert result["newer"][0]["path"] == str(unit)


def test_main_fails_when_systemctl_cannot_answer(monkeypatch):
    result, _ = run_module(monkeypatch, {"unit": UNIT, "paths": []}, (1, "", "Failed to connect to bus"))
    assert result["failed"] and result["msg"] == "systemctl show %s failed (rc 1): Failed to connect to bus" % UNIT


def test_return_documents_every_key_the_decision_returns():
    # DOCUMENTATION, RETURN and the argument spec agree: ansible-test sanity (validate-modules) checks that.
    returned = yaml.safe_load(module.RETURN)
    assert set(decide(show(), [])) | {"invocation_id"} == set(returned)

