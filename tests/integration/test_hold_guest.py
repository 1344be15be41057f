"""The maintenance hold on a real systemd guest: the simulated SGLang server (inventories/vllm-cpu,
catalog entry `sim-sglang`) deployed, then held with playbooks/hold.yml while a person "works on it".

  a deploy with a change   leaves the held unit alone: changed=0, the hold named, the unit file and the
                           engine untouched
  status.yml               shows who holds it, since when and why, in the table, the JSON document and
                           the look's verdict event (what python -m modelwake_runner status prints)
  the engine killed        the launcher ends with status 8 and systemd does not restart the unit
  released                 the flag and its textfile gone, the deploy converges onto the change

The guest is destroyed afterwards, also when a test fails."""
import json
import os
import shutil

import pytest

from tests.helpers import ROOT, until
from tests.helpers.guesthost import GuestHost, verdicts

HOST = "vllm-cpu"  # the inventory's host name; the catalog entry chooses what it runs
VM = GuestHost("mwh", os.path.join(ROOT, "inventories", "vllm-cpu"), HOST)
UNIT = "sglang-sim"
SIM = {"modelwake_deploy_model": "sim-sglang", "modelwake_host_models": ["sim-sglang"],
       "inference_env_wheelhouse": "", "inference_env_wheelhouse_lock": "",
       "modelwake_textfile_dir": "/var/lib/node_exporter/textfile"}
HOLD_FILE = "/etc/modelwake/hold/%s.json" % UNIT
HOLD_METRIC = "/var/lib/node_exporter/textfile/%s-hold.prom" % UNIT
REASON = "reseat the NVLink bridge"
# The catalog entry's arguments with one changed: what a deploy would restart the unit for.
CHANGED = {"model_service_extra_args": ["--disable-cuda-graph", "--load-rate-mib", "32", "--start-seconds", "1",
                                        "--init-seconds", "1", "--warmup-seconds", "1"]}

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0 or shutil.which("systemd-nspawn") is None,
                       reason="test hosts need root and systemd-nspawn (make system-deps)"),
]


@pytest.fixture(scope="module")
def held(tmp_path_factory):
    """The simulated server deployed and ready, then held."""
    try:
        VM.up(str(tmp_path_factory.mktemp("hold")))
        rc, out = VM.play("playbooks/demo-model.yml", dict(SIM, modelwake_demo_model_size_mib=64,
                                                            modelwake_demo_model_shards=8))
        assert rc == 0, out[-4000:]
        rc, out = VM.deploy(SIM)
        assert rc == 0, out[-4000:]
        rc, out = VM.play("playbooks/hold.yml", dict(SIM, modelwake_hold_reason=REASON, modelwake_hold_by="alice"))
        assert rc == 0, out[-4000:]
        yield json.loads(VM.sh("cat " + HOLD_FILE))
    finally:
        VM.down()


def test_the_hold_is_a_root_flag_and_a_metric(held):
    assert held["by"] == "alice" and held["reason"] == REASON and held["unit"] == UNIT + ".service"
    # The service user reads it and cannot remove it.
    assert VM.sh("stat -c '%U %a' /etc/modelwake/hold " + HOLD_FILE).split("\n") == ["root 755", "root 644"]
    assert 'modelwake_held{name="%s.service"} 1' % UNIT in VM.sh("cat " + HOLD_METRIC)


def test_a_deploy_with_a_change_leaves_the_held_unit_alone(held):
    before = VM.unit_state(UNIT)
    unit_file = VM.sh("md5sum /etc/systemd/system/%s.service" % UNIT)
    rc, out = VM.deploy(dict(SIM, **CHANGED))
    assert rc == 0, out[-4000:]
    assert VM.recap(out)["changed"] == 0, out[-4000:]
    flat = " ".join(out.split())
    assert ("%s.service is held by alice since %s: %s; left alone (release with: ansible-playbook playbooks/hold.yml "
            "-e modelwake_hold=false -e modelwake_deploy_model=sim-sglang)" % (UNIT, held["since"], REASON)) in flat, flat[-4000:]
    assert flat.count("is held by alice") == 1, flat[-4000:]
    assert VM.sh("md5sum /etc/systemd/system/%s.service" % UNIT) == unit_file
    after = VM.unit_state(UNIT)
    assert (after["MainPID"], after["InvocationID"], after["ActiveState"]) == (
        before["MainPID"], before["InvocationID"], "active"), after


def test_status_shows_the_hold(held, tmp_path):
    document = str(tmp_path / "status.json")
    rc, out = VM.play("playbooks/status.yml", dict(SIM, modelwake_status_json=document))
    assert rc == 0, out[-4000:]
    expected = {"by": "alice", "since": held["since"], "reason": REASON}
    with open(document) as handle:
        looks = json.load(handle)
    assert [(look["unit"], look["phase"], look["hold"]) for look in looks] == [(UNIT + ".service", "ready", expected)]
    assert "held by alice since %s: %s | " % (held["since"], REASON) in " ".join(out.split()), out[-4000:]
    # The look's verdict event, as python -m modelwake_runner status prints it.
    assert [v.get("hold") for v in verdicts(out, UNIT + ".service")] == [expected]


def test_a_killed_engine_is_not_restarted_while_held(held):
    before = VM.unit_state(UNIT)
    assert before["ActiveState"] == "active", before
    # The engine: the launcher's (the unit's main process's) child; its ranks go with its group.
    VM.sh("kill -KILL $(cat /proc/%s/task/*/children)" % before["MainPID"])
    until("the unit ended", lambda: VM.unit_state(UNIT)["ActiveState"] in ("failed", "inactive"), timeout=60)
    # RestartSec (10 s) and more: systemd would have started it again by now.
    VM.sh("sleep 15")
    after = VM.unit_state(UNIT)
    assert after["ActiveState"] == "failed" and after["ExecMainStatus"] == "8", after
    assert after["NRestarts"] == before["NRestarts"], after
    journal = VM.sh("journalctl -u %s.service -o cat --no-pager -n 40" % UNIT)
    assert "held by alice since %s: %s: not restarting (exit 8 instead of 6" % (held["since"], REASON) in journal, journal


def test_a_release_lets_the_deploy_converge(held):
    rc, out = VM.play("playbooks/hold.yml", dict(SIM, modelwake_hold=False))
    assert rc == 0, out[-4000:]
    assert VM.sh("ls %s %s" % (HOLD_FILE, HOLD_METRIC), check=False) == ""
    rc, out = VM.deploy(dict(SIM, **CHANGED))
    assert rc == 0, out[-4000:]
    assert "is held by" not in out
    assert VM.unit_state(UNIT)["ActiveState"] == "active"
    assert "--init-seconds 1" in VM.sh("systemctl cat %s" % UNIT)
    rc, out = VM.deploy(dict(SIM, **CHANGED))
    assert rc == 0 and VM.recap(out)["changed"] == 0, out[-4000:]
