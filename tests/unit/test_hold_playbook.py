"""playbooks/hold.yml and the roles' hold check, run by Ansible itself on this machine (connection local),
the flags redirected into a temporary directory: a hold needs a reason and writes the flag the launcher
reads (the format round-trips through host/hold.py) and the Prometheus textfile; holding again for the
same reason changes nothing; stop.yml leaves a held unit alone (without touching systemd); a release
removes both files. The deploy's own skipping runs on a systemd guest (tests/integration/test_hold_guest.py)."""
import json
import os
import pwd
import re
import shutil
import sys
import tempfile

import pytest

from ansible_collections.modelwake.serving.plugins.module_utils.host.hold import read_hold

from modelwake_runner.cli import run_playbook

from tests.unit.test_model_service_render import make_model
from tests.unit.test_monitoring import promtool

UNIT = "sglang-holdtest"


@pytest.fixture(scope="module")
def box(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hold")
    inventory = {"all": {"children": {"model_hosts": {"hosts": {"box": {
        "ansible_connection": "local", "ansible_python_interpreter": sys.executable,
        "modelwake_models": {"k26": {"engine": "sglang", "unit": UNIT, "port": 30001, "model_path": "/srv/models/k26"}},
        "modelwake_host_models": ["k26"],
        "modelwake_textfile_dir": str(tmp / "textfile"),
        "model_service_hold_dir": str(tmp / "hold"),
    }}}}}}
    (tmp / "inventory.json").write_text(json.dumps(inventory))
    (tmp / "textfile").mkdir()  # node_exporter's directory, which a deploy created
    return tmp


class Played(object):
    """One playbook run through ansible-runner: its exit status, its stats and its events as data."""

    def __init__(self, runner):
        self.rc = runner.rc
        self.stats = runner.stats or {}
        self.events = list(runner.events)

    def changed(self, host="box"):
        return (self.stats.get("changed") or {}).get(host, 0)

    def tasks(self):
        """The tasks that started, in order: [(name, role or None)]."""
        return [(event["event_data"].get("task"), event["event_data"].get("role")) for event in self.events
                if event.get("event") == "playbook_on_task_start"]

    def results(self, task):
        """[(event, result)] of one task's host results: runner_on_ok, _failed, _skipped."""
        return [(event["event"], event["event_data"].get("res") or {}) for event in self.events
                if event.get("event") in ("runner_on_ok", "runner_on_failed", "runner_on_skipped")
                and event["event_data"].get("task") == task]

    def messages(self):
        """Every result's msg, the callback's line wrapping never in it."""
        return [" ".join(str(event["event_data"]["res"]["msg"]).split()) for event in self.events
                if event.get("event", "").startswith("runner_on_") and "msg" in (event["event_data"].get("res") or {})]

    def said(self, text):
        return any(text in message for message in self.messages())

    def __str__(self):
        return "rc %s, stats %s, messages %s" % (self.rc, self.stats, self.messages())


def play(inventory, playbook, extravars=None, env=None):
    private = tempfile.mkdtemp(prefix="hold-play-")
    try:
        runner, _events = run_playbook(playbook, private, [str(inventory)], extravars, env=env, timeout=300)
        return Played(runner)
    finally:
        shutil.rmtree(private, ignore_errors=True)


def play_hold(box, playbook, **extravars):
    # The hold names $USER. Ansible's local connection takes its own user from LOGNAME first: it stays the
    # real one, or its temporary directory would be ~alice/..., a relative path for a user that does not exist.
    return play(box / "inventory.json", os.path.join("playbooks", playbook), extravars,
                env={"USER": "alice", "LOGNAME": pwd.getpwuid(os.getuid()).pw_name})


def test_a_hold_without_a_reason_is_refused_and_changes_nothing(box):
    proc = play_hold(box, "hold.yml")
    assert proc.rc != 0
    assert proc.said("A hold needs a reason, nothing was changed") and proc.said("modelwake_hold_reason is empty"), proc
    assert not (box / "hold").exists() and not os.listdir(str(box / "textfile"))


def test_a_hold_writes_the_flag_and_the_metric_once(box):
    proc = play_hold(box, "hold.yml", modelwake_hold_reason="reseat the NVLink bridge")
    assert proc.rc == 0, proc
    assert proc.changed() == 3, proc  # the directory, the flag, the textfile
    flag = box / "hold" / (UNIT + ".json")
    hold = read_hold(str(flag))
    assert hold.by == "alice" and hold.reason == "reseat the NVLink bridge"
    assert re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$", hold.since), hold.since
    assert oct(os.stat(str(flag)).st_mode & 0o777) == "0o644" and os.stat(str(flag)).st_uid == 0
    metric = (box / "textfile" / (UNIT + "-hold.prom")).read_text()
    assert 'modelwake_held{name="%s.service"} 1\n' % UNIT in metric
    checked = promtool("check", "metrics", stdin=metric)  # as node_exporter's textfile collector takes it
    assert (checked.returncode, checked.stdout) == (0, ""), checked.stdout
    assert proc.said("%s.service: held by alice since %s: reseat the NVLink bridge" % (UNIT, hold.since)), proc

    again = play_hold(box, "hold.yml", modelwake_hold_reason="reseat the NVLink bridge")
    assert again.rc == 0 and again.changed() == 0, again
    assert read_hold(str(flag)).since == hold.since  # the first hold's date stays


def test_stop_leaves_a_held_unit_alone(box):
    proc = play_hold(box, "stop.yml")
    assert proc.rc == 0 and proc.changed() == 0, proc
    assert any(re.search(r"%s\.service is held by alice since \S+: reseat the NVLink bridge; left alone \(release with: "
                         r"ansible-playbook playbooks/hold.yml -e modelwake_hold=false -e modelwake_deploy_model=k26\)"
                         % UNIT, message) for message in proc.messages()), proc
    stops = proc.results("Stop and disable the units")
    assert stops and all(event == "runner_on_skipped" for event, _res in stops), stops


def test_a_release_removes_the_flag_and_the_metric(box):
    proc = play_hold(box, "hold.yml", modelwake_hold=False)
    assert proc.rc == 0 and proc.changed() == 1, proc
    assert not (box / "hold" / (UNIT + ".json")).exists()
    assert not (box / "textfile" / (UNIT + "-hold.prom")).exists()
    assert proc.said("%s.service: released (was held by alice since " % UNIT), proc
    again = play_hold(box, "hold.yml", modelwake_hold=False)
    assert again.rc == 0 and again.changed() == 0 and again.said("%s.service: not held" % UNIT), again


ROLE_PLAY = """
- name: The model_service role on a held unit
  hosts: all
  connection: local
  gather_facts: false
  roles:
    - role: model_service
"""


def test_the_roles_main_entry_point_ends_at_a_held_unit(tmp_path):
    """What rolling-restart.yml and a playbook of one's own run: the role's input checks, then nothing
    (no service user, no files, no restart, no start) for a held unit."""
    model = str(tmp_path / "k26")
    make_model(model)
    hold_dir = tmp_path / "hold"
    hold_dir.mkdir()
    (hold_dir / "sglang-held.json").write_text(json.dumps({"unit": "sglang-held.service", "by": "bob",
                                                           "since": "2026-12-04T23:30:00Z", "reason": "BIOS update"}))
    inventory = {"all": {"hosts": {"box": {"ansible_python_interpreter": sys.executable,
                                           "model_service_unit": "sglang-held", "model_service_model_path": model,
                                           "model_service_hold_dir": str(hold_dir),
                                           "model_service_force_restart": True}}}}
    (tmp_path / "inventory.json").write_text(json.dumps(inventory))
    (tmp_path / "play.yml").write_text(ROLE_PLAY)
    proc = play(tmp_path / "inventory.json", str(tmp_path / "play.yml"))
    assert proc.rc == 0 and proc.changed() == 0, proc
    assert proc.said("sglang-held.service is held by bob since 2026-12-04T23:30:00Z: BIOS update; left alone"), proc
    tasks = [name for name, role in proc.tasks() if role == "model_service"]
    assert tasks[-1] == "Leave a held unit alone", tasks
    assert "Create the service user" not in tasks and "Request a restart the operator asked for" not in tasks
