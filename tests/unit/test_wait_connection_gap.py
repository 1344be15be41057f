"""A wait whose host stops answering (plugins/action/wait_for_model_ready.py's follow loop and its Gap).

The loop is driven here by a scripted connection: each read answers as FOLLOW_COMMAND does on a host, or
fails as Ansible's ssh connection fails on a cut network (AnsibleConnectionFailure). The same over a real
cut, a guest's link taken down during a rolling restart's wait: tests/integration/test_deploy_lifecycle.py.
"""
import importlib.util
import json
import os
import time
import types

import pytest
from ansible.errors import AnsibleConnectionFailure

from tests.helpers import ROOT

SPEC = importlib.util.spec_from_file_location(
    "wait_for_model_ready_action_gap", os.path.join(ROOT, "plugins", "action", "wait_for_model_ready.py"))
action = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(action)

BOOT = "b0075e1d-0000-4000-8000-000000000001"
INTERVAL = 0.05
CUT = AnsibleConnectionFailure("Failed to connect to the host via ssh: ssh: connect to host 10.213.77.10 port 22: "
                               "No route to host")


def follow_info(pid=4242, timeout=600):
    return {"path": "/run/modelwake/modelwake-wait-x.json", "fifo": "/run/modelwake/modelwake-wait-x.fifo",
            "pid": pid, "boot_id": BOOT, "timeout": timeout}


def read_answer(phase, done=False, running=True, boot=BOOT, pid=4242):
    """FOLLOW_COMMAND's stdout: the boot id and whether the wait's process lives, then its file."""
    data = {"version": 1, "done": done, "pid": pid, "boot_id": BOOT, "info": {},
            "result": {"phase": phase, "elapsed": 30, "failed": False,
                       "msg": "ready: answered a completion" if phase == "ready" else None}}
    return {"stdout": "%s %s\n%s" % (boot, "running" if running else "gone", json.dumps(data))}


FILES_GONE = {"stdout": "%s gone\n" % BOOT}  # no process, no file: the wait ended itself (its lease)


class ScriptedWait(object):
    """The action plugin's follow loop on a connection that answers from a script, one entry per read:
    a FOLLOW_COMMAND answer, or an exception to raise. Every command it was given is kept."""

    def __init__(self, script):
        self.plugin = action.ActionModule.__new__(action.ActionModule)
        self.plugin._task = types.SimpleNamespace(no_log=False, retries=0, args={"unit": "sglang-k26.service"},
                                                  _uuid="uuid-gap")
        self.plugin._low_level_execute_command = self.execute
        self.script = list(script)
        self.commands = []
        self.said = []
        self.started_again = 0

    def execute(self, command, sudoable=False):
        self.commands.append(command)
        if command.startswith("rm -f") or command.startswith("kill "):
            return {"stdout": "", "rc": 0}  # the cleanup at the end
        answer = self.script.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    def start_wait(self):
        self.started_again += 1
        return {"changed": False, "_follow": follow_info(pid=5151)}

    def follow(self, timeout=600, board=None):
        said = self.said

        class Said(object):
            @staticmethod
            def display(text, stderr=False):
                said.append(text)

            @staticmethod
            def vvv(text):
                pass
        original = action.display
        action.display = Said()
        try:
            return self.plugin._follow("gpu-03", follow_info(timeout=timeout), INTERVAL, board, self.start_wait)
        finally:
            action.display = original

    def reads(self):
        return [command for command in self.commands if "head -c 1" in command]


def test_a_host_that_stops_answering_is_looked_at_again_and_its_verdict_is_the_hosts_own():
    wait = ScriptedWait([read_answer("loading"), CUT, CUT, CUT, read_answer("ready", done=True)])
    reply = wait.follow()
    assert reply["phase"] == "ready" and not reply.get("failed"), reply
    unreachable = [line for line in wait.said if "unreachable for" in line]
    assert len(unreachable) == 3, wait.said
    assert "No route to host" in unreachable[0] and "the wait goes on on the host" in unreachable[0]
    assert [line for line in wait.said if line.startswith("wait_for_model_ready [gpu-03]: answering again after")]
    # The same wait followed throughout: its own file read five times, none started again, none killed.
    assert len(wait.reads()) == 5 and wait.started_again == 0
    assert not [command for command in wait.commands if command.startswith("kill ")]


def test_a_wait_that_ended_itself_during_the_gap_is_started_again_never_called_failed():
    # Negative control for "the wait's file is gone", which ends a wait `failed` when it happens with no gap.
    wait = ScriptedWait([read_answer("loading"), CUT, FILES_GONE,
                         read_answer("initializing", pid=5151), read_answer("ready", done=True, pid=5151)])
    reply = wait.follow()
    assert reply["phase"] == "ready" and not reply.get("failed"), reply
    assert wait.started_again == 1
    assert any("the wait had ended itself without its controller, a new one looks from now" in line
               for line in wait.said), wait.said
    # The reads after the new start are of the new wait's files (its pid in the liveness check).
    assert "kill -0 5151" in wait.reads()[-1]


def test_without_a_gap_a_wait_whose_files_are_gone_still_fails():
    wait = ScriptedWait([read_answer("loading"), FILES_GONE])
    reply = wait.follow()
    assert reply["phase"] == "failed" and "is gone" in reply["msg"] and wait.started_again == 0, reply


def test_a_host_that_never_answers_again_is_unreachable_once_the_waits_own_budget_is_spent():
    wait = ScriptedWait([read_answer("loading")] + [CUT] * 50)
    with pytest.raises(AnsibleConnectionFailure):
        wait.follow(timeout=0.2)
    # Budget 0.2 s plus one interval, a read each interval: a few reads, never judged, never restarted.
    assert 3 <= len(wait.reads()) <= 12 and wait.started_again == 0, wait.reads()
    assert not [line for line in wait.said if "failed" in line or "stalled" in line], wait.said


def test_a_host_that_rebooted_during_the_gap_is_said_so():
    wait = ScriptedWait([read_answer("loading"), CUT, read_answer("loading", running=False, boot="another-boot")])
    reply = wait.follow()
    assert reply["phase"] == "failed" and "rebooted during the wait" in reply["msg"], reply
    assert wait.started_again == 0


def test_the_gap_says_each_line_with_the_time_since_the_host_last_answered():
    gap = action.Gap(100.0, budget_left=600, interval=25)
    assert gap.line("h", 145.0, CUT).startswith("wait_for_model_ready [h]: unreachable for 45s (Failed to connect")
    assert gap.line("h", 145.0, CUT).endswith("looked at again every 25s")
    assert not gap.over(724.0) and gap.over(725.0)
    assert gap.answered_line("h", 230.0, False) == "wait_for_model_ready [h]: answering again after 2m10s"


def test_on_a_fleets_board_the_host_counts_as_unreachable_and_its_gap_is_said_once(tmp_path, monkeypatch):
    board = action.FleetBoard("uuid-gap", ["gpu-%02d" % i for i in range(6)], INTERVAL, root=str(tmp_path))
    for other in (0, 1, 2, 4, 5):
        board.post("gpu-%02d" % other, {"phase": "loading"})
    wait = ScriptedWait([read_answer("loading"), CUT, CUT, CUT, CUT, read_answer("ready", done=True)])
    seen = []
    original = action.FleetBoard.post

    def post(self, key, look):
        seen.append(look["phase"])
        original(self, key, look)
    monkeypatch.setattr(action.FleetBoard, "post", post)
    reply = wait.follow(board=board)
    assert reply["phase"] == "ready", reply
    # Posted at each failed read, then the verdict; on the screen, the gap once and the fleet's lines counting it.
    assert seen.count("unreachable") == 4 and seen[-1] == "ready", seen
    assert len([line for line in wait.said if "unreachable for" in line]) == 1, wait.said
    assert any(line.startswith("wait_for_model_ready: 5 loading, 1 unreachable") for line in wait.said), wait.said


class SlowCut(Exception):
    """A read that hangs longer than an interval before SSH gives up (keepalives unanswered), then fails."""


def test_on_a_fleets_board_a_gap_found_after_a_hung_read_is_still_said(tmp_path):
    board = action.FleetBoard("uuid-slow-gap", ["gpu-%02d" % i for i in range(6)], INTERVAL, root=str(tmp_path))
    wait = ScriptedWait([read_answer("loading"), SlowCut(), CUT, read_answer("ready", done=True)])
    execute = wait.execute

    def hung_then_cut(command, sudoable=False):
        if wait.script and isinstance(wait.script[0], SlowCut):
            wait.script.pop(0)
            wait.commands.append(command)
            time.sleep(4 * INTERVAL)
            raise CUT
        return execute(command, sudoable)
    wait.plugin._low_level_execute_command = hung_then_cut
    reply = wait.follow(board=board)
    assert reply["phase"] == "ready", reply
    assert len([line for line in wait.said if "unreachable for" in line]) == 1, wait.said
