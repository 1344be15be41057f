"""Crash loops: the record of failed starts (host/failed_starts.py), the launcher's guard that counts them
and stops a loop (launcher/crash_loop.py), and the wait's verdict on a unit whose loop was stopped (the
probe reads the record, the classifier words it)."""
import json
import os

import pytest

from ansible_collections.modelwake.serving.plugins.module_utils.host import failed_starts, systemd
from ansible_collections.modelwake.serving.plugins.module_utils.launcher.crash_loop import CrashLoopGuard, root_cause
from ansible_collections.modelwake.serving.plugins.module_utils.launcher.exit_codes import (EXIT_CRASH_LOOP, EXIT_FAILED,
                                                                                           EXIT_STALLED)
from ansible_collections.modelwake.serving.plugins.module_utils.readiness.probe import HostProbe

from tests.helpers.traces import Trace, config, replay

OOM = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.31 GiB. GPU 0 has a total capacity of "
       "95.59 GiB of which 1.02 GiB is free.")
OOM_AGAIN = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.50 GiB. GPU 3 has a total capacity of "
             "95.59 GiB of which 0.87 GiB is free.")
ATTRIBUTE = "AttributeError: type object 'CompressionFormat' has no attribute 'nvfp4_pack_quantized'"
TRACEBACK = ["Traceback (most recent call last):", '  File "/opt/venv/lib/python3.11/site-packages/x.py", line 46, in f']


# -- the signature ----------------------------------------------------------------------------------
@pytest.mark.parametrize("first, second", [
    (OOM, OOM_AGAIN),
    ("RuntimeError: NCCL error in: ../csrc/ProcessGroupNCCL.cpp:1970, pid 4123",
     "RuntimeError: NCCL error in: ../csrc/ProcessGroupNCCL.cpp:1971, pid 88"),
    ("Segmentation fault at 0x7f3a9c0012e0 in worker 2", "Segmentation fault at 0x7f11d2aa0000 in worker 5"),
    ("OSError: [Errno 28] No space left on device: '/var/cache/modelwake/k26/triton/2a9f31c07e44b8d1/x.so'",
     "OSError: [Errno 28] No space left on device: '/var/cache/modelwake/k26/triton/93bb0a7c11f2e4d0/x.so'"),
])
def test_one_cause_with_other_numbers_has_one_signature(first, second):
    assert failed_starts.signature(first) == failed_starts.signature(second)


def test_other_causes_have_other_signatures():
    assert failed_starts.signature(OOM) != failed_starts.signature(ATTRIBUTE)
    assert "Tried to allocate # GiB" in failed_starts.signature(OOM)


def test_the_cause_is_the_root_cause_line_else_the_verdict():
    assert root_cause("failed: the server logged a fatal error: x", [OOM] + TRACEBACK) == OOM
    stalled = "stalled: no progress for 600 s in phase loading"
    assert root_cause(stalled, ["[TP0] Load weight begin"]) == stalled
    assert root_cause(stalled, None) == stalled


# -- the record ---------------------------------------------------------------------------------------
def test_failed_starts_with_one_cause_count_up_and_another_cause_starts_again_at_one():
    record = failed_starts.empty_record()
    record = failed_starts.add_failure(record, OOM, [OOM], 1000.0, 1600.0, EXIT_FAILED)
    record = failed_starts.add_failure(record, OOM_AGAIN, [OOM_AGAIN], 1610.0, 2200.0, EXIT_FAILED)
    assert (record["consecutive"], record["since"], record["failed_starts_total"]) == (2, 1000.0, 2)
    record = failed_starts.add_failure(record, ATTRIBUTE, [ATTRIBUTE], 2210.0, 2215.0, EXIT_FAILED)
    assert (record["consecutive"], record["since"], record["failed_starts_total"]) == (1, 2210.0, 3)
    assert [start["cause"] for start in record["starts"]] == [OOM, OOM_AGAIN, ATTRIBUTE]
    assert record["evidence"] == [ATTRIBUTE]


def test_the_record_stays_bounded_and_the_total_never_drops():
    record = failed_starts.empty_record()
    for n in range(50):
        record = failed_starts.add_failure(record, OOM, [OOM] * 100, float(n), n + 0.5, EXIT_FAILED)
    assert len(record["starts"]) == failed_starts.MAX_ENTRIES
    assert record["starts"][-1]["started"] == 49.0
    assert len(record["evidence"]) == failed_starts.MAX_EVIDENCE
    record = failed_starts.clear_run(record)
    assert (record["consecutive"], record["failed_starts_total"], len(record["starts"])) == (0, 50, 20)


def test_the_loop_message_spans_the_run_and_names_the_last_cause():
    record = failed_starts.empty_record()
    record = failed_starts.add_failure(record, OOM, [], 1000.0, 1800.0, EXIT_FAILED)
    record = failed_starts.add_failure(record, OOM_AGAIN, [], 1810.0, 2600.0, EXIT_FAILED)
    record = failed_starts.add_failure(record, OOM, [], 2610.0, 3460.0, EXIT_FAILED)
    assert failed_starts.loop_message(record) == "crash loop: 3 failed starts in 41m00s, each %s, stopped" % OOM


def test_the_record_round_trips_atomically_and_a_missing_one_is_empty(tmp_path):
    directory = str(tmp_path)
    assert failed_starts.read_record(directory) == failed_starts.empty_record()
    record = failed_starts.add_failure(failed_starts.empty_record(), OOM, [OOM], 1.0, 2.0, EXIT_FAILED)
    failed_starts.write_record(directory, record)
    assert failed_starts.read_record(directory) == record
    assert os.listdir(directory) == [failed_starts.FILE_NAME]  # no temporary file left
    (tmp_path / failed_starts.FILE_NAME).write_text('["not a record"]')
    with pytest.raises(ValueError):
        failed_starts.read_record(directory)


def test_the_state_directory_is_the_units_with_or_without_its_suffix():
    assert systemd.state_dir("sglang-k26.service") == "/var/lib/modelwake/sglang-k26"
    assert systemd.state_dir("sglang-k26") == "/var/lib/modelwake/sglang-k26"


# -- the launcher's guard -------------------------------------------------------------------------------
class Clock(object):
    def __init__(self, now=1764480000.0):
        self.now = now

    def __call__(self):
        return self.now


def guard(directory, limit=3, clock=None, logged=None):
    return CrashLoopGuard(directory, limit, (logged if logged is not None else []).append, clock or Clock())


def fail_once(directory, cause, clock, seconds=600.0, limit=3, logged=None):
    """One launcher run whose start fails after `seconds`, then the restart's RestartSec: its exit status."""
    run = guard(directory, limit, clock, logged)
    clock.now += seconds
    status = run.failed("failed: the server logged a fatal error: %s" % cause, [cause] + TRACEBACK, EXIT_FAILED)
    clock.now += 10
    return status


def test_the_third_failed_start_with_one_cause_stops_the_loop_with_the_evidence_kept(tmp_path):
    directory, clock, logged = str(tmp_path), Clock(), []
    assert fail_once(directory, OOM, clock) == EXIT_FAILED
    assert fail_once(directory, OOM_AGAIN, clock) == EXIT_FAILED
    assert fail_once(directory, OOM, clock, seconds=800.0, logged=logged) == EXIT_CRASH_LOOP
    message = "crash loop: 3 failed starts in 33m40s, each %s, stopped" % OOM
    assert logged[-2] == message
    assert "exiting 7" in logged[-1] and failed_starts.record_path(directory) in logged[-1]
    record = failed_starts.read_record(directory)
    assert record["stopped"]["message"] == message
    assert record["evidence"] == [OOM] + TRACEBACK
    assert record["failed_starts_total"] == 3


def test_another_cause_starts_the_count_again(tmp_path):
    directory, clock = str(tmp_path), Clock()
    assert fail_once(directory, OOM, clock) == EXIT_FAILED
    assert fail_once(directory, OOM, clock) == EXIT_FAILED
    assert fail_once(directory, ATTRIBUTE, clock) == EXIT_FAILED
    assert fail_once(directory, ATTRIBUTE, clock) == EXIT_FAILED
    assert fail_once(directory, ATTRIBUTE, clock) == EXIT_CRASH_LOOP
    assert failed_starts.read_record(directory)["stopped"]["message"].startswith(
        "crash loop: 3 failed starts in 30m20s, each AttributeError")


def test_a_start_that_reaches_ready_clears_the_run_but_not_the_count(tmp_path):
    directory, clock = str(tmp_path), Clock()
    fail_once(directory, OOM, clock)
    fail_once(directory, OOM, clock)
    run = guard(directory, clock=clock)
    run.reached_ready()
    assert run.metrics() == (2, 0)
    assert fail_once(directory, OOM, clock) == EXIT_FAILED  # one in a row, not three
    assert failed_starts.read_record(directory)["consecutive"] == 1


def test_a_start_after_a_stopped_loop_begins_a_new_run(tmp_path):
    directory, clock, logged = str(tmp_path), Clock(), []
    for _ in range(3):
        fail_once(directory, OOM, clock)
    assert guard(directory, clock=clock).metrics() is not None
    # The guard above was the operator's start after the stop: the run begins again.
    assert fail_once(directory, OOM, clock, logged=logged) == EXIT_FAILED
    record = failed_starts.read_record(directory)
    assert (record["consecutive"], record["failed_starts_total"], record["stopped"]) == (1, 4, None)


def test_the_stopped_loop_shows_in_the_metrics_until_the_next_start(tmp_path):
    directory, clock = str(tmp_path), Clock()
    run = None
    for _ in range(3):
        run = guard(directory, clock=clock)
        run.failed("stalled: no progress for 600 s in phase initializing", [], EXIT_STALLED)
    assert run.metrics() == (3, 1)
    assert guard(directory, clock=clock).metrics() == (3, 0)


def test_zero_records_the_failed_starts_and_never_stops(tmp_path):
    directory, clock = str(tmp_path), Clock()
    for _ in range(5):
        assert fail_once(directory, OOM, clock, limit=0) == EXIT_FAILED
    assert failed_starts.read_record(directory)["consecutive"] == 5


def test_without_a_directory_nothing_is_recorded_or_written(tmp_path):
    run = guard(None)
    assert run.failed("failed", [OOM], EXIT_FAILED) == EXIT_FAILED
    assert run.metrics() is None


def test_an_unwritable_directory_is_said_once_and_the_launcher_goes_on_without_the_guard(tmp_path):
    missing = str(tmp_path / "no-such-dir")
    logged = []
    run = guard(missing, logged=logged)
    assert len(logged) == 1 and "cannot be written" in logged[0] and "without crash-loop detection" in logged[0]
    for _ in range(4):
        assert run.failed("failed", [OOM], EXIT_FAILED) == EXIT_FAILED
    assert run.metrics() is None and len(logged) == 1


def test_an_unreadable_record_is_replaced_by_a_new_one(tmp_path):
    (tmp_path / failed_starts.FILE_NAME).write_text("{half a rec")
    logged = []
    run = guard(str(tmp_path), logged=logged)
    assert "unreadable" in logged[0]
    assert run.metrics() == (0, 0)
    assert json.loads((tmp_path / failed_starts.FILE_NAME).read_text())["version"] == failed_starts.VERSION


# -- the wait on a unit whose loop was stopped ----------------------------------------------------------------
UNIT = "sglang-k26.service"


def stopped_unit(status=EXIT_CRASH_LOOP, code=1, active="failed"):
    return {"ActiveState": active, "SubState": "failed" if active == "failed" else "dead", "MainPID": 0,
            "NRestarts": 2, "Type": "notify", "StatusText": "", "Result": "exit-code", "ExecMainStatus": status,
            "ExecMainCode": code, "LoadState": "loaded"}


def stopped_record():
    record = failed_starts.empty_record()
    for start in (1000.0, 1810.0, 2610.0):
        record = failed_starts.add_failure(record, OOM, [OOM] + TRACEBACK, start, start + 790.0, EXIT_FAILED)
    return failed_starts.mark_stopped(record, 3400.0)


def test_a_wait_that_begins_on_a_stopped_loop_names_it_before_the_last_runs_own_error():
    snap = Trace().step(0.0, alive=False, unit=stopped_unit(),
                        context=["[TP0] Scheduler hit an exception: " + OOM] + TRACEBACK)
    snap.crash_loop = stopped_record()
    (_t, verdict), = replay(config(unit=UNIT), [snap])
    assert verdict.phase == "failed" and verdict.terminal
    assert verdict.msg == ("failed: crash loop: 3 failed starts in 40m00s, each %s, stopped (unit %s, exit status 7: "
                           "restarting it would fail the same way)" % (OOM, UNIT))
    assert verdict.evidence == [OOM] + TRACEBACK


def test_an_unreadable_record_still_names_the_stopped_loop():
    snap = Trace().step(0.0, alive=False, unit=stopped_unit())
    snap.crash_loop = {"error": "/var/lib/modelwake/sglang-k26/failed-starts.json: permission denied"}
    (_t, verdict), = replay(config(unit=UNIT), [snap])
    assert verdict.phase == "failed"
    assert verdict.msg.startswith("failed: crash loop: unit %s's launcher stopped a crash loop (exit status 7)" % UNIT)
    assert "permission denied" in verdict.msg


def probe_for(unit):
    """A HostProbe of the unit, without asking systemd (only its record reader is used)."""
    probe = HostProbe.__new__(HostProbe)
    probe.config = config(unit=unit)
    return probe


@pytest.mark.parametrize("unit, reads", [
    (stopped_unit(), True),
    (stopped_unit(active="inactive"), True),
    (stopped_unit(status=3), False),  # an ordinary failed start: no loop
    (stopped_unit(code=2), False),  # killed by signal 7 (SIGBUS), not exit status 7
    (dict(stopped_unit(), ActiveState="activating"), False),  # started again: a new run
])
def test_the_probe_reads_the_record_only_of_a_unit_stopped_with_the_crash_loop_status(tmp_path, monkeypatch, unit, reads):
    monkeypatch.setattr(systemd, "STATE_ROOT", str(tmp_path))
    os.mkdir(str(tmp_path / "sglang-k26"))
    failed_starts.write_record(str(tmp_path / "sglang-k26"), stopped_record())
    found = probe_for(UNIT)._crash_loop(unit)
    assert (found == stopped_record()) if reads else found is None


def test_the_probe_says_why_a_record_could_not_be_read(tmp_path, monkeypatch):
    monkeypatch.setattr(systemd, "STATE_ROOT", str(tmp_path))
    os.mkdir(str(tmp_path / "sglang-k26"))
    (tmp_path / "sglang-k26" / failed_starts.FILE_NAME).write_text("[1]")
    assert "not a failed-starts record" in probe_for(UNIT)._crash_loop(stopped_unit())["error"]


# -- the wait on a unit that systemd restarted: what its run died of ------------------------------------------
def running_unit(restarts, main_pid):
    return dict(stopped_unit(status=0, active="active"), SubState="running", MainPID=main_pid, NRestarts=restarts)


@pytest.mark.parametrize("after", [
    running_unit(restarts=1, main_pid=700),  # Restart= started it again
    dict(stopped_unit(status=EXIT_FAILED, active="activating"), SubState="auto-restart"),  # RestartSec= not over
], ids=["restarted", "auto-restart"])
def test_a_restart_seen_before_the_runs_last_lines_reach_the_journal_names_what_the_launcher_recorded(after):
    # The order a loaded host gives: the launcher recorded the out-of-memory start and exited, systemd restarted
    # the unit, and the look sees the restart while journald has not yet passed on the dead run's traceback.
    trace = Trace(pids=(500, 501))
    before = trace.step(0.0, unit=running_unit(restarts=0, main_pid=500),
                        lines=["server_args=ServerArgs(model_path='/m')"])
    restarted = trace.step(5.0, cpu=1, unit=after, pids=(700,))
    restarted.failed_start = {"cause": OOM, "started": 1000.0, "ended": 1004.0, "status": EXIT_FAILED,
                              "evidence": [OOM] + TRACEBACK}
    verdict = replay(config(unit=UNIT), [before, restarted])[-1][1]
    assert verdict.phase == "failed" and verdict.msg.endswith(": " + OOM), verdict.msg
    assert verdict.evidence == [OOM] + TRACEBACK
    # Without the launcher's record (a unit that runs the engine itself), the same look says what it saw.
    restarted.failed_start = None
    verdict = replay(config(unit=UNIT), [before, restarted])[-1][1]
    assert verdict.phase == "failed" and verdict.msg.endswith("its server crashed"), verdict.msg
    assert OOM not in verdict.evidence


def test_a_restarted_runs_exception_in_the_log_comes_before_the_record():
    trace = Trace(pids=(500,))
    before = trace.step(0.0, unit=running_unit(restarts=0, main_pid=500))
    restarted = trace.step(5.0, cpu=1, unit=running_unit(restarts=1, main_pid=700), pids=(700,),
                           lines=["KeyError: 'model.layers.60.mlp.experts.w1'"])
    restarted.failed_start = {"cause": OOM, "evidence": [OOM]}
    verdict = replay(config(unit=UNIT), [before, restarted])[-1][1]
    assert verdict.phase == "failed" and verdict.msg.endswith(": KeyError: 'model.layers.60.mlp.experts.w1'"), verdict.msg


def test_the_probe_reads_only_a_failed_start_recorded_during_the_wait(tmp_path, monkeypatch):
    monkeypatch.setattr(systemd, "STATE_ROOT", str(tmp_path))
    directory = str(tmp_path / "sglang-k26")
    os.mkdir(directory)
    probe = probe_for(UNIT)
    probe.wait_start_epoch = 2000.0
    earlier = failed_starts.add_failure(failed_starts.empty_record(), ATTRIBUTE, [ATTRIBUTE], 1000.0, 1100.0, EXIT_FAILED)
    failed_starts.write_record(directory, earlier)
    path = os.path.join(directory, failed_starts.FILE_NAME)
    os.utime(path, (1900.0, 1900.0))
    assert probe._failed_start(running_unit(1, 700)) is None  # written before the wait: not even read
    os.utime(path, (2100.0, 2100.0))
    assert probe._failed_start(running_unit(1, 700)) is None  # changed in the wait, but no start ended in it
    failed_starts.write_record(directory, failed_starts.add_failure(earlier, OOM, [OOM] + TRACEBACK, 2001.0, 2004.0,
                                                                    EXIT_FAILED))
    found = probe._failed_start(running_unit(1, 700))
    assert (found["cause"], found["ended"], found["evidence"]) == (OOM, 2004.0, [OOM] + TRACEBACK)
    assert probe._failed_start(None) is None


def test_what_a_deploy_quotes_of_the_last_failed_start_comes_from_the_record():
    record = failed_starts.add_failure(failed_starts.empty_record(), OOM, [OOM], 100.0, 160.0, EXIT_FAILED)
    assert failed_starts.last_failure(json.dumps(record)) == {
        "consecutive": 1, "cause": "Its last start failed: " + OOM}
    record = failed_starts.add_failure(record, OOM_AGAIN, [OOM_AGAIN], 170.0, 230.0, EXIT_FAILED)
    stopped = failed_starts.mark_stopped(record, 231.0)
    assert failed_starts.last_failure(json.dumps(stopped)) == {"consecutive": 2, "cause": stopped["stopped"]["message"]}
    # A start that reached ready ended the run; no record, or not one: nothing to refuse on.
    for text in (json.dumps(failed_starts.clear_run(record)), "", "{not json", "[]", json.dumps(dict(record, version=9))):
        assert failed_starts.last_failure(text) is None, text
