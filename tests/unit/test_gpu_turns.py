"""launcher/gpu_turns.py: whose GPU memory a start waits for, its turn on the GPUs, and what it says.

The GPUs are a scripted reader, /proc a directory written here, systemctl a scripted runner, the clock
and the sleep fake: a wait of minutes replays in milliseconds. The turn's locks are real flock(2) locks
on files in a temporary directory (two opens of one file conflict within one process too).
"""
import json
import os
import stat

import pytest

from ansible_collections.modelwake.serving.plugins.module_utils.launcher import gpu_turns
from ansible_collections.modelwake.serving.plugins.module_utils.launcher.gpu_turns import (
    GpuTurnError, GpuTurns, Holder, TurnLocks, memory_message, release_reason, releasing, turn_message)
from ansible_collections.modelwake.serving.plugins.module_utils.readiness.status import (
    STATUS_CHARS, status_phase, status_waiting, waiting_status)

from tests.helpers.traces import Trace, config, replay

OWN = "sglang-b.service"
LAUNCHER_PID = 900


def holder(unit, state=None, pid=4242, gpu=0, exiting=False, mib=76000):
    return Holder(gpu=gpu, pid=pid, mib=mib, unit=unit, unit_state=state, exiting=exiting)


@pytest.mark.parametrize("found,reason", [
    (holder(OWN, "activating"), "left over from its previous run"),
    (holder("sglang-a.service", "deactivating"), "stopping"),
    (holder("sglang-a.service", "inactive"), "stopped"),
    (holder("sglang-a.service", "failed"), "failed"),
    (holder(None, exiting=True), "exiting"),
    # Neighbours: models that share the GPU on purpose, whose start took its turn before this one.
    (holder("sglang-a.service", "active"), None),
    (holder("sglang-a.service", "activating"), None),
    (holder("sglang-a.service", "reloading"), None),
    # What cannot be placed is not waited for: the engine's own memory check comes next.
    (holder("sglang-a.service", None), None),
    (holder(None), None),
    (holder("session-3.scope", "active"), None),
    (holder(OWN, "activating", pid=LAUNCHER_PID), None),
], ids=["own-leftover", "stopping", "stopped", "failed", "exiting-no-unit", "neighbour-active",
        "neighbour-starting", "neighbour-reloading", "unknown-state", "alive-no-unit", "session", "itself"])
def test_which_holders_a_start_waits_for(found, reason):
    assert release_reason(found, OWN, {LAUNCHER_PID}) == reason


def test_releasing_keeps_the_waited_for_by_gpu_and_says_why():
    found = [holder("sglang-a.service", "active", pid=10, gpu=0),
             holder("old.service", "deactivating", pid=30, gpu=2),
             holder(OWN, "activating", pid=20, gpu=1),
             holder("old.service", "deactivating", pid=31, gpu=2)]
    waiting = releasing(found, OWN, {LAUNCHER_PID})
    assert [(h.gpu, h.pid, h.reason) for h in waiting] == [
        (1, 20, "left over from its previous run"), (2, 30, "stopping"), (2, 31, "stopping")]
    assert memory_message(waiting) == (
        "waiting for GPU 1's memory to be released by pid 20 (sglang-b.service, left over from its previous run) "
        "and 2 more")
    assert memory_message(waiting[1:2]) == "waiting for GPU 2's memory to be released by pid 30 (old.service, stopping)"


def test_turn_messages_name_the_start_that_holds_the_gpu():
    assert turn_message(2, {"unit": "sglang-a.service", "pid": 4242}, "starting (loading)") == \
        "waiting for its turn on GPU 2: sglang-a.service (pid 4242) is starting (loading)"
    assert turn_message(0, {"unit": None, "pid": 7}, None) == "waiting for its turn on GPU 0: a process (pid 7) is starting"
    assert turn_message(1, None, None) == "waiting for its turn on GPU 1: another start holds it"


# -- the STATUS= text, both sides ------------------------------------------------------------

@pytest.mark.parametrize("what", [
    "waiting for GPU 2's memory to be released by pid 4242 (sglang-a.service, stopping)",
    "waiting for its turn on GPU 12: sglang-a.service (pid 4242) is starting (loading)",
])
def test_a_waiting_launcher_status_reads_back_as_starting_and_what_it_waits_for(what):
    text = waiting_status(what)
    assert text == "starting: " + what
    assert status_phase(text) == "starting"
    assert status_waiting(text) == what


def test_only_the_launchers_own_wait_reads_as_waiting():
    # A log marker that happens to begin with "waiting" is a phase marker, not the launcher's wait.
    assert status_waiting("starting: Waiting for application startup (since 4s)") is None
    assert status_waiting("starting: waiting for the model (since 4s)") is None
    assert status_waiting("loading 45% (29/64 shards)") is None
    assert status_waiting(None) is None
    # One line, cut to the STATUS= length like every other text.
    long = waiting_status("waiting for its turn on GPU 0: " + "x" * 400 + "\nmore")
    assert len(long) == STATUS_CHARS and "\n" not in long and status_waiting(long)


# -- the turn's locks --------------------------------------------------------------------------

def test_locks_are_taken_in_gpu_order_and_say_who_holds_them(tmp_path):
    first = TurnLocks(str(tmp_path), [3, 1])
    assert first.gpus == [1, 3]
    assert first.try_take(1) and first.try_take(3)
    first.write_holder("sglang-a.service", 4242)
    # The service group's other units may write who holds it, whatever the creator's umask.
    assert stat.S_IMODE(os.stat(str(tmp_path / "gpu-1.lock")).st_mode) == 0o660
    second = TurnLocks(str(tmp_path), [1])
    assert not second.try_take(1)
    assert second.holder(1) == {"unit": "sglang-a.service", "pid": 4242}
    first.release()
    # A finished start is nobody's holder: the next one reads no name until the new holder writes its own.
    assert second.holder(1) is None
    assert second.try_take(1)
    second.release()


class FakeReader(object):
    """GpuReader's read() and compute_processes() from a script: one answer per look, the last repeated."""

    def __init__(self, gpus, processes=()):
        self.gpus = [{"index": i, "memory_used_mib": 0} for i in gpus]
        self.answers = list(processes) or [[]]
        self.looks = 0

    def read(self):
        return list(self.gpus)

    def compute_processes(self):
        answer = self.answers[min(self.looks, len(self.answers) - 1)]
        self.looks += 1
        return answer


class FakeClock(object):
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds


class Notifier(object):
    def __init__(self):
        self.sent = []

    def send(self, *fields):
        self.sent.append(fields)
        return True


def write_proc(root, pid, unit, state="S", flags=0):
    directory = root / str(pid)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "stat").write_text("%d (python) %s 1 %d %d 0 -1 %d 0 0 0 0 10 5 0 0 20 0 1 0 777 0 0\n"
                                    % (pid, state, pid, pid, flags))
    (directory / "cgroup").write_text("0::/system.slice/%s\n" % unit if unit else "0::/\n")


def systemctl(states):
    """A runner answering `systemctl show UNIT -p ...` from {unit: (ActiveState, StatusText)}."""
    def run(argv, timeout):
        assert argv[:2] == ["systemctl", "show"]
        state, status = states.get(argv[2], ("inactive", ""))
        return 0, "ActiveState=%s\nSubState=x\nStatusText=%s\n" % (state, status), ""
    return run


def turns(tmp_path, reader, states=None, directory="turns", timeout=60, stopping_after=None):
    proc = tmp_path / "proc"
    write_proc(proc, LAUNCHER_PID, OWN)
    clock = FakeClock()
    notifier = Notifier()
    logged = []
    subject = GpuTurns(None, str(tmp_path / directory) if directory else "", timeout, notifier, logged.append, 640,
                       reader=reader, runner=systemctl(states or {}), proc_root=str(proc), clock=clock,
                       sleep=clock.sleep, pid=LAUNCHER_PID)
    return subject, proc, clock, notifier, logged


def test_a_replacement_waits_for_the_stopped_instances_memory_then_starts(tmp_path):
    held = [{"index": 0, "pid": 4242, "used_memory_mib": 76000}, {"index": 0, "pid": 4300, "used_memory_mib": 900}]
    reader = FakeReader([0], [held, held, held, []])
    subject, proc, clock, notifier, logged = turns(
        tmp_path, reader, states={"sglang-a.service": ("deactivating", ""), "sglang-n.service": ("active", "ready")})
    write_proc(proc, 4242, "sglang-a.service")
    write_proc(proc, 4300, "sglang-n.service")  # a neighbour on the same GPU: not waited for
    held.append({"index": 0, "pid": 4400, "used_memory_mib": 500})  # gone from /proc since: holds nothing
    assert subject.take(stopping=lambda: False)
    assert subject.own_unit == OWN
    assert clock.now == 3 * gpu_turns.POLL_SECONDS
    status = "starting: waiting for GPU 0's memory to be released by pid 4242 (sglang-a.service, stopping)"
    # Said once (the text did not change within SAY_EVERY), with systemd's start timeout renewed.
    assert notifier.sent == [("STATUS=" + status, "EXTEND_TIMEOUT_USEC=640000000")]
    assert logged[0] == status[len("starting: "):]
    assert logged[-1] == "took its turn on GPU 0 after 3s, no stopped instance's memory left: starting the engine"
    subject.release()


def test_memory_not_released_in_time_fails_naming_the_holders_and_gives_the_turn_back(tmp_path):
    reader = FakeReader([0, 1], [[{"index": 1, "pid": 4242, "used_memory_mib": 76000}]])
    subject, proc, clock, notifier, _logged = turns(tmp_path, reader, timeout=30)
    write_proc(proc, 4242, None, state="D", flags=gpu_turns.procfs.PF_EXITING)
    with pytest.raises(GpuTurnError) as caught:
        subject.take(stopping=lambda: False)
    assert clock.now == 30
    assert "GPU memory still held after 30s" in str(caught.value)
    assert "GPU 1: pid 4242 (no unit, exiting), 76000 MiB" in str(caught.value)
    # Renewed while it waited: every SAY_EVERY seconds the same text again.
    assert len(notifier.sent) == 3
    other = TurnLocks(str(tmp_path / "turns"), [0, 1])
    assert other.try_take(0) and other.try_take(1)
    other.release()


def test_a_start_waits_for_its_turn_while_another_loads_and_holds_the_lower_gpu_meanwhile(tmp_path):
    (tmp_path / "turns").mkdir()
    loading = TurnLocks(str(tmp_path / "turns"), [2])
    assert loading.try_take(2)
    loading.write_holder("sglang-a.service", 4242)
    reader = FakeReader([0, 2])
    subject, _proc, clock, notifier, logged = turns(
        tmp_path, reader, states={"sglang-a.service": ("activating", "loading 45% (29/64 shards)")})

    def stopping():
        # Three polls into the wait: GPU 0 is already this start's, then the other start is ready.
        if clock.now >= 3:
            third = TurnLocks(str(tmp_path / "turns"), [0])
            assert not third.try_take(0)
            third.release()
            loading.release()
        return False

    assert subject.take(stopping=stopping)
    assert notifier.sent[0] == ("STATUS=starting: waiting for its turn on GPU 2: sglang-a.service (pid 4242) is "
                                "starting (loading)", "EXTEND_TIMEOUT_USEC=640000000")
    assert json.loads((tmp_path / "turns" / "gpu-2.lock").read_text()) == {"unit": OWN, "pid": LAUNCHER_PID}
    assert "took its turn on GPU 0,2 after" in logged[-1]
    subject.release()
    again = TurnLocks(str(tmp_path / "turns"), [0, 2])
    assert again.try_take(0) and again.try_take(2)
    again.release()


def test_a_stop_while_waiting_starts_nothing_and_holds_no_turn(tmp_path):
    (tmp_path / "turns").mkdir()
    other = TurnLocks(str(tmp_path / "turns"), [1])
    assert other.try_take(1)
    subject, _proc, clock, _notifier, _logged = turns(tmp_path, FakeReader([0, 1]))
    assert not subject.take(stopping=lambda: clock.now >= 5)
    other.release()
    mine = TurnLocks(str(tmp_path / "turns"), [0])
    assert mine.try_take(0)  # GPU 0, taken while it waited for GPU 1, was given back
    mine.release()


def test_no_gpu_no_wait_and_no_lock_file(tmp_path):
    subject, _proc, clock, notifier, logged = turns(tmp_path, FakeReader([]))
    assert subject.take(stopping=lambda: False)
    assert (clock.now, notifier.sent, logged) == (0, [], [])
    assert not (tmp_path / "turns").exists()


def test_without_a_usable_lock_directory_the_start_goes_without_its_turn(tmp_path):
    (tmp_path / "file").write_text("")
    subject, _proc, _clock, _notifier, logged = turns(tmp_path, FakeReader([0]), directory="file/turns")
    assert subject.take(stopping=lambda: False)
    assert logged[0].startswith("GPU turns: cannot use %s" % (tmp_path / "file" / "turns"))


def test_by_hand_the_launchers_session_is_not_its_unit(tmp_path):
    proc = tmp_path / "proc"
    write_proc(proc, 77, "session-3.scope")
    write_proc(proc, 78, "session-3.scope")
    reader = FakeReader([0], [[{"index": 0, "pid": 78, "used_memory_mib": 100}]])
    subject = GpuTurns(None, "", 60, Notifier(), lambda text: None, 640, reader=reader,
                       runner=systemctl({"session-3.scope": ("active", "")}), proc_root=str(proc),
                       clock=FakeClock(), sleep=lambda s: None, pid=77)
    assert subject.own_unit is None
    assert subject.take(stopping=lambda: False)


# -- the wait module while the launcher waits ---------------------------------------------------

def launcher_unit(status, state="activating", sub="start"):
    return {"ActiveState": state, "SubState": sub, "MainPID": 900, "NRestarts": 0, "ExecMainStatus": 0,
            "ExecMainCode": 0, "Result": "success", "StatusText": status, "Type": "notify", "LoadState": "loaded"}


def test_a_start_waiting_for_its_turn_is_starting_and_never_stalled():
    cfg = config(unit="sglang-b.service", stall_timeout=60)
    trace = Trace(pids=(900,))
    waiting = waiting_status("waiting for its turn on GPU 0: sglang-a.service (pid 4242) is starting (loading)")
    # Twenty minutes in the queue, the same text all along, no engine process (the launcher is left out).
    steps = [trace.step(t, unit=launcher_unit(waiting), alive=False) for t in range(0, 1200, 5)]
    verdicts = replay(cfg, steps)
    t_end, final = verdicts[-1]
    assert t_end == 1195 and not final.terminal
    assert final.phase == "starting"
    assert final.msg.endswith("; the launcher is waiting for its turn on GPU 0: sglang-a.service (pid 4242) "
                              "is starting (loading)")
    # Once it took its turn, silence counts again: the wait's stall clock runs from the look that saw the
    # launcher's status change (a launcher that then shows no engine for stall_timeout is stalled).
    started = launcher_unit("starting the engine")
    after = replay(cfg, steps + [trace.step(t, unit=started, alive=False) for t in range(1200, 1300, 5)])
    assert after[-1][1].phase == "stalled" and after[-1][0] == 1200 + 60


def test_the_same_status_without_a_running_unit_is_not_a_wait():
    cfg = config(unit="sglang-b.service", stall_timeout=60)
    trace = Trace(pids=(900,))
    stale = waiting_status("waiting for GPU 0's memory to be released by pid 4242 (old.service, stopping)")
    _t, final = replay(cfg, [trace.step(0, unit=launcher_unit(stale, state="inactive", sub="dead"), alive=False)])[-1]
    assert final.phase == "not_started" and "the launcher is" not in final.msg


def test_a_start_waiting_for_the_disk_is_starting_and_never_stalled():
    # The negative control of the stall rule for the disk turn (launcher/prefetch_step.py): a start whose
    # prefetch waits twenty minutes behind another start's read is starting, never stalled.
    cfg = config(unit="sglang-b.service", stall_timeout=60)
    trace = Trace(pids=(900,))
    waiting = waiting_status("waiting for the disk: sglang-a.service (pid 4242) is prefetching its model")
    steps = [trace.step(t, unit=launcher_unit(waiting), alive=False) for t in range(0, 1200, 5)]
    t_end, final = replay(cfg, steps)[-1]
    assert t_end == 1195 and not final.terminal and final.phase == "starting"
    assert final.msg.endswith("; the launcher is waiting for the disk: sglang-a.service (pid 4242) is prefetching "
                              "its model")
    started = launcher_unit("starting the engine")
    after = replay(cfg, steps + [trace.step(t, unit=started, alive=False) for t in range(1200, 1300, 5)])
    assert after[-1][1].phase == "stalled" and after[-1][0] == 1200 + 60
