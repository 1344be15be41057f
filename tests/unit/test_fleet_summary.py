"""The fleet's one line (readiness/fleet.py) and the board where a task's waits meet on the controller
(plugins/action/wait_for_model_ready.py's FleetBoard); the board under real ansible-playbook is
tests/integration/test_live_progress.py's."""
import importlib.util
import json
import multiprocessing
import os
import subprocess

from ansible_collections.modelwake.serving.plugins.module_utils.readiness import fleet

from tests.helpers import ANSIBLE_PLAYBOOK, ROOT

SPEC = importlib.util.spec_from_file_location(
    "wait_for_model_ready_action", os.path.join(ROOT, "plugins", "action", "wait_for_model_ready.py"))
action = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(action)

OOM = "failed: the server logged a fatal error: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"


def test_the_line_counts_each_phase_in_the_starts_order_and_names_the_failed_hosts_with_their_cause():
    looks = dict(("gpu-%02d" % i, {"phase": "loading"}) for i in range(12))
    looks.update(("gpu-%02d" % i, {"phase": "initializing"}) for i in range(12, 52))
    looks.update(("gpu-%02d" % i, {"phase": "ready"}) for i in range(52, 63))
    looks["gpu-63"] = {"phase": "failed", "msg": OOM}
    assert fleet.summary_line(looks) == (
        "12 loading, 40 initializing, 11 ready, 1 failed: gpu-63 (the server logged a fatal error: "
        "torch.OutOfMemoryError: CUDA out of memory. ...)")


def test_hosts_not_looked_at_yet_come_first_and_many_failures_are_named_up_to_three():
    looks = dict(("h%d" % i, {"phase": "stalled", "msg": "stalled: no progress for 600 s in phase loading"})
                 for i in range(5))
    assert fleet.summary_line(looks, not_looked=27) == (
        "27 not looked at yet, 5 stalled: h0 (no progress for 600 s in phase loading), h1 (no progress for 600 s in "
        "phase loading), h2 (no progress for 600 s in phase loading) and 2 more")
    assert fleet.summary_line({}) == "no hosts"
    assert fleet.summary_line({"a": {"phase": "not_started"}, "b": {}}) == "1 not started, 1 unknown"


def test_the_board_says_the_fleets_line_once_per_interval_and_once_more_when_every_host_has_its_verdict(tmp_path):
    batch = ["h%d" % i for i in range(6)]
    board = action.FleetBoard("task-1", batch, interval=25, root=str(tmp_path))
    board.post("h0/sglang-k26.service", {"phase": "loading"})
    assert board.line_if_due(now=1000.0) == "5 not looked at yet, 1 loading"
    board.post("h1/sglang-k26.service", {"phase": "loading"})
    assert board.line_if_due(now=1010.0) is None  # another worker said it 10 s ago
    assert board.line_if_due(now=1025.0) == "4 not looked at yet, 2 loading"
    for host in batch:
        board.post(host + "/sglang-k26.service", {"phase": "ready"})
    board.post("h5/sglang-k26.service", {"phase": "failed", "msg": OOM})
    assert board.line_if_due(now=1026.0) == ("5 ready, 1 failed: h5 (the server logged a fatal error: "
                                             "torch.OutOfMemoryError: CUDA out of memory. ...)")
    assert board.line_if_due(now=2000.0) is None  # every verdict is in: said once


def test_the_next_wave_of_the_same_task_has_a_board_of_its_own(tmp_path):
    first = action.FleetBoard("task-1", ["a", "b", "c", "d", "e"], interval=25, root=str(tmp_path))
    first.post("a", {"phase": "ready"})
    second = action.FleetBoard("task-1", ["f", "g", "h", "i", "j"], interval=25, root=str(tmp_path))
    assert second.looks() == {}


def _post_and_say(args):
    root, host = args
    board = action.FleetBoard("task-1", ["h%d" % i for i in range(8)], interval=25, root=root)
    board.post(host, {"phase": "loading"})
    return board.line_if_due(now=1000.0)


def test_workers_at_the_same_moment_say_the_line_once(tmp_path):
    with multiprocessing.Pool(8) as pool:
        said = pool.map(_post_and_say, [(str(tmp_path), "h%d" % i) for i in range(8)])
    assert len([line for line in said if line]) == 1, said


def test_a_host_that_waits_on_two_models_is_named_with_each_unit(tmp_path):
    board = action.FleetBoard("task-2", ["a", "b", "c", "d", "e"], interval=25, root=str(tmp_path))
    board.post("a/sglang-k26.service", {"phase": "ready"})
    board.post("a/vllm-small.service", {"phase": "failed", "msg": "failed: unit vllm-small.service failed"})
    board.post("b/sglang-k26.service", {"phase": "failed", "msg": "failed: unit sglang-k26.service failed"})
    assert board.line_if_due(now=1000.0) == ("3 not looked at yet, 1 ready, 2 failed: a/vllm-small.service "
                                             "(unit vllm-small.service failed), b (unit sglang-k26.service failed)")


def test_the_lookup_gives_the_same_line_in_a_play(tmp_path):
    play = tmp_path / "play.yml"
    play.write_text("""
- hosts: localhost
  gather_facts: false
  tasks:
    - ansible.builtin.debug:
        msg: "{{ lookup('modelwake.serving.fleet_summary', looks=looks, not_looked=2) }}"
""")
    looks = {"gpu-1": {"phase": "ready"}, "gpu-2": {"phase": "failed", "msg": OOM}}
    proc = subprocess.run([ANSIBLE_PLAYBOOK, "-i", "localhost,", "-c", "local", str(play), "-e",
                           json.dumps({"looks": looks})], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          universal_newlines=True, env=dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"),
                                                            ANSIBLE_CALLBACK_RESULT_FORMAT="json"))
    assert proc.returncode == 0, proc.stdout
    assert '"msg": %s' % json.dumps(fleet.summary_line(looks, not_looked=2)) in proc.stdout, proc.stdout


class _Task(object):
    def __init__(self, no_log):
        self.no_log = no_log
        self.args = {"unit": "sglang-k26.service"}


def test_under_no_log_the_board_holds_no_cause_and_no_phase_before_the_verdict(tmp_path):
    board = action.FleetBoard("task-3", ["a", "b", "c", "d", "e"], interval=0, root=str(tmp_path))
    plugin = action.ActionModule.__new__(action.ActionModule)  # only its board helpers are used
    plugin._task = _Task(no_log=True)
    plugin._to_board(board, "a", {"phase": "loading"}, to_stderr=True)
    plugin._to_board(board, "b", {"phase": "failed", "msg": OOM}, to_stderr=True)
    assert board.looks() == {"a/sglang-k26.service": {"key": "a/sglang-k26.service", "phase": "waiting", "msg": None},
                             "b/sglang-k26.service": {"key": "b/sglang-k26.service", "phase": "failed", "msg": None}}


def test_one_task_over_the_fleet_says_how_many_ended_how_and_names_the_hosts_not_ready():
    results = {"gpu-1": {"phase": "ready"}, "gpu-2": {"phase": "ready"}, "gpu-3": {"phase": "failed", "failed": True},
               "gpu-4": {"unreachable": True, "failed": True, "msg": "unreachable: ssh: connect to host ..."}}
    assert action.fleet_summary(results) == "1 failed, 2 ready, 1 unreachable: not ready: gpu-3, gpu-4"
    assert action.fleet_summary({"gpu-1": {"phase": "ready"}}) == "1 ready"
