"""The rollout's order (plugins/lookup/rollout_serial.py), checked against the pinned ansible-core itself: a
play over local hosts with the lookup's serial list runs a canary alone, then waves of the size asked for,
and a failure in the canary stops the play before any other host runs a task. A bad value is refused by
playbooks/rolling-restart.yml before anything is written."""
import json
import os
import shutil
import sys
import tempfile

import pytest

from ansible_collections.modelwake.serving.plugins.lookup.rollout_serial import rollout_serial

from modelwake_runner.cli import run_playbook

PLAY = """
- name: A rollout over local hosts
  hosts: model_hosts
  gather_facts: false
  serial: "{{ lookup('modelwake.serving.rollout_serial', canary=modelwake_canary, max_unavailable=modelwake_max_unavailable) }}"
  any_errors_fatal: true
  max_fail_percentage: 0
  tasks:
    - name: Restart
      ansible.builtin.command: "{{ 'false' if inventory_hostname in failing | default([]) else 'true' }}"
      changed_when: false
"""


@pytest.mark.parametrize("canary,wave,serial", [
    (1, 1, [1, 1]), ("2", "3", [2, 3]), (0, 2, [2]), (1, "25%", [1, "25%"]), ("0", " 100 % ", ["100%"]),
])
def test_a_canary_then_waves(canary, wave, serial):
    assert rollout_serial(canary, wave) == serial


@pytest.mark.parametrize("canary,wave,named", [
    (-1, 1, "modelwake_canary"), ("one", 1, "modelwake_canary"), (True, 1, "modelwake_canary"), (1.5, 1, "modelwake_canary"),
    (1, 0, "modelwake_max_unavailable"), (1, "0%", "modelwake_max_unavailable"), (1, "101%", "modelwake_max_unavailable"),
    (1, "half", "modelwake_max_unavailable"), (1, None, "modelwake_max_unavailable"),
])
def test_a_bad_value_is_refused_naming_the_variable(canary, wave, named):
    with pytest.raises(ValueError) as raised:
        rollout_serial(canary, wave)
    assert str(raised.value).startswith(named + " must be "), raised.value


def run(tmp_path, playbook, hosts, extravars):
    inventory = {"all": {"children": {"model_hosts": {"hosts": dict(
        (name, {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}) for name in hosts)}}}}
    (tmp_path / "inventory.json").write_text(json.dumps(inventory))
    private = tempfile.mkdtemp(prefix="rollout-")
    try:
        runner, _events = run_playbook(playbook, private, [str(tmp_path / "inventory.json")], extravars, timeout=300)
        return runner.rc, list(runner.events)
    finally:
        shutil.rmtree(private, ignore_errors=True)


def batches(events, task):
    """The hosts that ran `task`, one list per batch (each batch starts the task again)."""
    found = []
    for event in events:
        if event.get("event") == "playbook_on_task_start" and event["event_data"].get("task") == task:
            found.append([])
        elif event.get("event") in ("runner_on_ok", "runner_on_failed") and event["event_data"].get("task") == task:
            found[-1].append(event["event_data"]["host"])
    return [sorted(batch) for batch in found]


HOSTS = ["h%d" % i for i in range(1, 8)]


@pytest.mark.parametrize("canary,wave,sizes", [(1, 2, [1, 2, 2, 2]), (1, "40%", [1, 2, 2, 2]), (0, 3, [3, 3, 1])])
def test_ansible_runs_the_canary_alone_then_waves_of_the_size_asked_for(tmp_path, canary, wave, sizes):
    (tmp_path / "play.yml").write_text(PLAY)
    rc, events = run(tmp_path, str(tmp_path / "play.yml"), HOSTS,
                     {"modelwake_canary": canary, "modelwake_max_unavailable": wave})
    assert rc == 0
    ran = batches(events, "Restart")
    assert [len(batch) for batch in ran] == sizes, ran
    assert sorted(sum(ran, [])) == HOSTS


def test_a_failing_canary_stops_the_rollout_before_any_other_host(tmp_path):
    (tmp_path / "play.yml").write_text(PLAY)
    rc, events = run(tmp_path, str(tmp_path / "play.yml"), HOSTS,
                     {"modelwake_canary": 1, "modelwake_max_unavailable": 3, "failing": ["h1"]})
    assert rc != 0
    assert batches(events, "Restart") == [["h1"]]


def test_a_failing_host_in_a_wave_stops_the_next_wave(tmp_path):
    (tmp_path / "play.yml").write_text(PLAY)
    rc, events = run(tmp_path, str(tmp_path / "play.yml"), HOSTS,
                     {"modelwake_canary": 1, "modelwake_max_unavailable": 3, "failing": ["h3"]})
    assert rc != 0
    assert batches(events, "Restart") == [["h1"], ["h2", "h3", "h4"]]


def test_the_rolling_restart_refuses_a_bad_wave_before_anything_is_written(tmp_path):
    rc, events = run(tmp_path, os.path.join("playbooks", "rolling-restart.yml"), ["box"],
                     {"modelwake_max_unavailable": 0})
    assert rc != 0
    started = [event["event_data"]["task"] for event in events if event.get("event") == "playbook_on_task_start"]
    assert started == ["Check the rollout's order before anything is written"], started
    failed = [event["event_data"]["res"]["msg"] for event in events if event.get("event") == "runner_on_failed"]
    assert failed and "modelwake_max_unavailable must be a number of hosts, 1 or more" in failed[0], failed
    assert "nothing was restarted" in failed[0], failed
