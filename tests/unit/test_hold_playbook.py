"""playbooks/hold.yml and the roles' hold check, run by Ansible itself on this machine (connection local),
the flags redirected into a temporary directory: a hold needs a reason and writes the flag the launcher
reads (the format round-trips through host/hold.py) and the Prometheus textfile; holding again for the
same reason changes nothing; stop.yml leaves a held unit alone (without touching systemd); a release
removes both files. The deploy's own skipping runs on a systemd guest (tests/integration/test_hold_guest.py)."""
import json
import os
import re
import subprocess
import sys

import pytest

from ansible_collections.modelwake.serving.plugins.module_utils.host.hold import read_hold

from tests.helpers import ANSIBLE_PLAYBOOK, ROOT
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


def play(box, playbook, *extra):
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0",
               USER="alice")
    args = [ANSIBLE_PLAYBOOK, "-i", str(box / "inventory.json"), os.path.join(ROOT, "playbooks", playbook)]
    for value in extra:
        args += ["-e", value]
    return subprocess.run(args, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          universal_newlines=True, timeout=300)


def said(proc):
    """The output with the callback's line wrapping undone."""
    return " ".join(proc.stdout.replace("'", "").split())


def recap(proc):
    found = re.search(r"box\s*: ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", proc.stdout)
    assert found, proc.stdout
    return {"ok": int(found.group(1)), "changed": int(found.group(2)), "failed": int(found.group(4))}


def test_a_hold_without_a_reason_is_refused_and_changes_nothing(box):
    proc = play(box, "hold.yml")
    assert proc.returncode != 0
    assert "A hold needs a reason, nothing was changed" in said(proc) and "modelwake_hold_reason is empty" in said(proc)
    assert not (box / "hold").exists() and not os.listdir(str(box / "textfile"))


def test_a_hold_writes_the_flag_and_the_metric_once(box):
    proc = play(box, "hold.yml", "modelwake_hold_reason='reseat the NVLink bridge'")
    assert proc.returncode == 0, proc.stdout
    assert recap(proc)["changed"] == 3  # the directory, the flag, the textfile
    flag = box / "hold" / (UNIT + ".json")
    hold = read_hold(str(flag))
    assert hold.by == "alice" and hold.reason == "reseat the NVLink bridge"
    assert re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$", hold.since), hold.since
    assert oct(os.stat(str(flag)).st_mode & 0o777) == "0o644" and os.stat(str(flag)).st_uid == 0
    metric = (box / "textfile" / (UNIT + "-hold.prom")).read_text()
    assert 'modelwake_held{name="%s.service"} 1\n' % UNIT in metric
    checked = promtool("check", "metrics", stdin=metric)  # as node_exporter's textfile collector takes it
    assert (checked.returncode, checked.stdout) == (0, ""), checked.stdout
    assert "%s.service: held by alice since %s: reseat the NVLink bridge" % (UNIT, hold.since) in said(proc)

    again = play(box, "hold.yml", "modelwake_hold_reason='reseat the NVLink bridge'")
    assert again.returncode == 0 and recap(again)["changed"] == 0, again.stdout
    assert read_hold(str(flag)).since == hold.since  # the first hold's date stays


def test_stop_leaves_a_held_unit_alone(box):
    proc = play(box, "stop.yml")
    assert proc.returncode == 0, proc.stdout
    assert recap(proc)["changed"] == 0
    assert re.search(r"%s\.service is held by alice since \S+: reseat the NVLink bridge;\s+left alone \(release with: "
                     r"ansible-playbook playbooks/hold.yml -e modelwake_hold=false -e modelwake_deploy_model=k26\)" % UNIT,
                     said(proc)), proc.stdout
    assert re.search(r"TASK \[Stop and disable the units\][^\n]*\n(skipping: [^\n]*\n)+", proc.stdout), proc.stdout


def test_a_release_removes_the_flag_and_the_metric(box):
    proc = play(box, "hold.yml", "modelwake_hold=false")
    assert proc.returncode == 0, proc.stdout
    assert recap(proc)["changed"] == 1
    assert not (box / "hold" / (UNIT + ".json")).exists()
    assert not (box / "textfile" / (UNIT + "-hold.prom")).exists()
    assert "%s.service: released (was held by alice since " % UNIT in said(proc)
    again = play(box, "hold.yml", "modelwake_hold=false")
    assert again.returncode == 0 and recap(again)["changed"] == 0 and "%s.service: not held" % UNIT in said(again)


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
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0")
    proc = subprocess.run([ANSIBLE_PLAYBOOK, "-i", str(tmp_path / "inventory.json"), str(tmp_path / "play.yml")],
                          cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout
    assert recap(proc)["changed"] == 0, proc.stdout
    assert "sglang-held.service is held by bob since 2026-12-04T23:30:00Z: BIOS update; left alone" in said(proc)
    tasks = re.findall(r"^TASK \[model_service : ([^\]]+)\]", proc.stdout, re.M)
    assert tasks[-1] == "Leave a held unit alone", tasks
    assert "Create the service user" not in tasks and "Request a restart the operator asked for" not in tasks
