"""The maintenance hold: the flag's format (host/hold.py), the launcher's decision (launcher/hold.py) and
a real launcher run whose engine crashes on a held unit, which must end with the status that the unit's
RestartPreventExitStatus= lists, so that Restart= leaves the unit alone while a person works on it."""
import json
import os
import subprocess
import sys

import pytest

from ansible_collections.modelwake.serving.plugins.module_utils.host.hold import (HOLD_DIR, hold_path, parse_hold,
                                                                                   read_hold)
from ansible_collections.modelwake.serving.plugins.module_utils.launcher.cli import parse_args
from ansible_collections.modelwake.serving.plugins.module_utils.launcher.exit_codes import (
    EXIT_ENGINE_EXITED, EXIT_FAILED, EXIT_HELD, EXIT_STALLED, EXIT_TIMEOUT, EXIT_USAGE)
from ansible_collections.modelwake.serving.plugins.module_utils.launcher.hold import exit_status_when_held
from ansible_collections.modelwake.serving.plugins.module_utils.launcher.supervisor import Launcher
from ansible_collections.modelwake.serving.plugins.modules import wait_for_model_ready

from tests.helpers import ROOT
from tests.helpers.modules import AnsibleExitJson, call_main, patch_exits
from tests.unit.test_launcher import receiver  # noqa: F401 (a fixture: the test's own notify socket)
from tests.unit.test_launcher_liveness import Err
from tests.unit.test_module import SERVER

UNIT = "sglang-k26.service"
HOLD = {"unit": UNIT, "by": "alice", "since": "2026-12-04T23:30:00Z", "reason": "reseat the NVLink bridge"}


def write_hold(hold_dir, unit="sglang-k26", content=None):
    os.makedirs(str(hold_dir), exist_ok=True)
    path = os.path.join(str(hold_dir), unit + ".json")
    with open(path, "w") as handle:
        handle.write(json.dumps(HOLD) + "\n" if content is None else content)
    return path


def test_the_flag_file_is_named_after_the_unit_with_or_without_service():
    assert hold_path("/etc/modelwake/hold", UNIT) == "/etc/modelwake/hold/sglang-k26.json"
    assert hold_path("/etc/modelwake/hold", "sglang-k26") == "/etc/modelwake/hold/sglang-k26.json"
    assert hold_path("", UNIT) is None  # holds turned off


def test_the_role_keeps_the_flags_where_the_launcher_looks_by_default():
    # The role passes --hold-dir only when model_service_hold_dir is not the launcher's own default.
    with open(os.path.join(ROOT, "roles", "model_service", "defaults", "main.yml")) as handle:
        assert "\nmodel_service_hold_dir: %s\n" % HOLD_DIR in handle.read()
    with open(os.path.join(ROOT, "roles", "model_service", "vars", "main.yml")) as handle:
        assert "\n_model_service_default_hold_dir: %s\n" % HOLD_DIR in handle.read()


def test_a_hold_says_who_since_when_and_why(tmp_path):
    hold = read_hold(write_hold(tmp_path))
    assert hold.as_dict() == {"by": "alice", "since": "2026-12-04T23:30:00Z", "reason": "reseat the NVLink bridge"}
    assert hold.describe() == "held by alice since 2026-12-04T23:30:00Z: reseat the NVLink bridge"


def test_no_file_no_hold(tmp_path):
    assert read_hold(str(tmp_path / "sglang-k26.json")) is None
    assert read_hold(None) is None


@pytest.mark.parametrize("content, reason", [
    ("{not json", "the hold file is not JSON"),
    ("[1, 2]", "the hold file holds no JSON object"),
])
def test_a_damaged_flag_still_holds_the_unit(tmp_path, content, reason):
    # Rather leave a box alone than restart it under a person's hands.
    hold = read_hold(write_hold(tmp_path, content=content))
    assert hold is not None and hold.reason.startswith(reason) and hold.by == "unknown"


def test_a_flag_that_cannot_be_read_still_holds_the_unit(tmp_path):
    os.makedirs(str(tmp_path / "sglang-k26.json"))  # a directory: open() fails with EISDIR, not ENOENT
    hold = read_hold(str(tmp_path / "sglang-k26.json"))
    assert hold is not None and "cannot be read" in hold.reason


def test_missing_fields_read_as_unknown():
    assert parse_hold('{"reason": "firmware update"}').describe() == "held by unknown since unknown: firmware update"


@pytest.mark.parametrize("code", [EXIT_FAILED, EXIT_STALLED, EXIT_TIMEOUT, EXIT_ENGINE_EXITED])
def test_a_held_unit_ends_with_the_held_status_instead_of_one_restart_acts_on(tmp_path, code):
    write_hold(tmp_path)
    logged = []
    assert exit_status_when_held(str(tmp_path), UNIT, code, logged.append) == EXIT_HELD
    assert logged == ["held by alice since 2026-12-04T23:30:00Z: reseat the NVLink bridge: not restarting "
                      "(exit %d instead of %d; release the hold, then start the unit)" % (EXIT_HELD, code)]


@pytest.mark.parametrize("code", [0, EXIT_USAGE])
def test_a_stop_or_a_usage_error_keeps_its_status_on_a_held_unit(tmp_path, code):
    # A stop (0) is not restarted anyway; 2 already prevents the restart and says more.
    write_hold(tmp_path)
    logged = []
    assert exit_status_when_held(str(tmp_path), UNIT, code, logged.append) == code
    assert logged == []


def test_another_units_hold_or_no_hold_changes_nothing(tmp_path):
    write_hold(tmp_path, unit="vllm-qwen36")
    logged = []
    assert exit_status_when_held(str(tmp_path), UNIT, EXIT_FAILED, logged.append) == EXIT_FAILED
    assert exit_status_when_held("", UNIT, EXIT_FAILED, logged.append) == EXIT_FAILED
    assert logged == []


def test_the_unit_lists_the_held_status_among_those_systemd_does_not_restart():
    with open(os.path.join(ROOT, "roles", "model_service", "templates", "unit.service.j2")) as handle:
        line = [text for text in handle.read().splitlines() if text.startswith("RestartPreventExitStatus=")]
    assert len(line) == 1 and " %d" % EXIT_HELD in line[0], line


@pytest.mark.parametrize("held, code", [(True, EXIT_HELD), (False, EXIT_FAILED)])
def test_a_launcher_whose_engine_crashes_on_a_held_unit_exits_held(tmp_path, receiver, held, code):  # noqa: F811
    """A real launcher run: the engine crashes before ready; with the hold, the launcher's last word is
    the hold and its exit status is the one RestartPreventExitStatus= lists."""
    if held:
        write_hold(tmp_path)
    errors = []
    options = parse_args(["--url", "http://127.0.0.1:9", "--name", UNIT, "--hold-dir", str(tmp_path),
                          "--poll-interval", "0.2", "--", sys.executable, "-c",
                          "import sys, time; time.sleep(0.5); print('RuntimeError: CUDA error: an illegal memory "
                          "access was encountered', flush=True); sys.exit(1)"])
    launcher = Launcher(options, environ={"NOTIFY_SOCKET": receiver.address}, err=Err(errors))
    assert launcher.run() == code
    text = "".join(errors)
    assert "failed:" in text
    assert ("held by alice since 2026-12-04T23:30:00Z: reseat the NVLink bridge: not restarting" in text) == held


def test_a_look_reports_the_units_hold_and_nothing_else_changes(monkeypatch, tmp_path):
    """wait_for_model_ready's look (status.yml, python -m modelwake_runner status) carries the hold."""
    patch_exits(monkeypatch)
    proc = subprocess.Popen([sys.executable, "-c", SERVER], stdout=subprocess.PIPE, universal_newlines=True)
    try:
        args = {"url": "http://127.0.0.1:%d" % int(proc.stdout.readline()), "pid": proc.pid, "timeout": 0,
                "ready_check": "health", "hold_file": os.path.join(str(tmp_path), "sglang-k26.json")}
        free = call_main(wait_for_model_ready.main, args, AnsibleExitJson)
        write_hold(tmp_path)
        held = call_main(wait_for_model_ready.main, args, AnsibleExitJson)
    finally:
        proc.kill()
        proc.wait()
    assert free["hold"] is None and free["phase"] == "ready"
    assert held["hold"] == {"by": "alice", "since": "2026-12-04T23:30:00Z", "reason": "reseat the NVLink bridge"}
    assert held["phase"] == "ready" and held["msg"] == free["msg"]
