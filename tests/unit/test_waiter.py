"""The polling core with a fake clock and sleep: a 20-minute start replayed in milliseconds."""
import json

import pytest

from ansible_collections.modelwake.serving.plugins.module_utils.readiness.waiter import wait_for_ready

from tests.helpers.traces import MIB, FakeClock, ReplayProbe, Trace, config, http, vllm_prefix


def twenty_minute_start(trace, t):
    worker = vllm_prefix("Worker", 300)
    if t == 0:
        return trace.step(t, cpu=1.0, lines=[vllm_prefix("APIServer", 100) + "vLLM API server version 0.32.0"])
    if t < 60:
        return trace.step(t, cpu=1.0, lines=[worker + "Starting to load model /m..."] if t == 30 else [])
    if t < 900:
        return trace.step(t, cpu=0.9, read=500 * MIB)  # silent loading
    if t < 1200:
        return trace.step(t, cpu=1.5)  # silent compilation
    return trace.step(t, cpu=0.3, lines=["INFO:     Application startup complete."],
                      http_result=http(200, models=200, completion=200, ready=True, model="m"))


def test_twenty_minute_start_replayed_without_real_sleeping(tmp_path):
    clock = FakeClock()
    probe = ReplayProbe(clock, twenty_minute_start)
    progress = tmp_path / "progress.jsonl"
    seen = []
    cfg = config(engine="vllm", timeout=3600, stall_timeout=300, poll_interval=5, progress_path=str(progress))
    result = wait_for_ready(cfg, probe, clock=clock, sleep=clock.sleep, on_snapshot=lambda s, v: seen.append(v.phase))
    assert result["phase"] == "ready" and result["failed"] is False
    assert result["elapsed"] == 1200
    assert len(probe.looks) == 241 and set(clock.sleeps) == {5}
    assert [p["phase"] for p in result["phases"]] == ["starting", "loading", "initializing", "ready"]
    assert result["bytes_read"] == 500 * MIB * 840
    assert "terminal" not in result
    lines = progress.read_text().splitlines()
    assert len(lines) == 241 == len(seen)
    last = json.loads(lines[-1])
    assert last["verdict"]["phase"] == "ready" and last["snapshot"]["t"] == 1200
    # The probe's budget: the time left, and never past the stall's moment (last progress at 0 + 300 s).
    assert probe.looks[1] == (5.0, 295.0)


def test_deadline_not_a_counter_a_slow_probe_eats_into_it():
    clock = FakeClock()
    probe = ReplayProbe(clock, lambda trace, t: trace.step(t, cpu=1.0), cost=7.0)
    result = wait_for_ready(config(engine="vllm", timeout=100, poll_interval=30), probe, clock=clock, sleep=clock.sleep)
    assert result["phase"] == "timeout" and result["failed"] is True
    # Looks start every 30 s (start to start, each takes 7 s) and the last one when the deadline came.
    assert [t for t, _r in probe.looks] == [0.0, 30.0, 60.0, 90.0, 100.0]
    assert clock.sleeps == [23.0, 23.0, 23.0, 3.0]
    assert result["elapsed"] == 107
    assert result["msg"].startswith("timeout: not ready after 100 s; in phase starting since +0 s")


@pytest.mark.parametrize("costs,looks,sleeps", [
    # Each look takes 2 s: the next still starts 5 s after the previous one started.
    ([2.0], [0.0, 5.0, 10.0, 15.0, 20.0], [3.0, 3.0, 3.0, 3.0]),
    # A look that overran (a hung completion of 12 s) is followed at once, then the rhythm resumes.
    ([0.5, 12.0, 0.5], [0.0, 5.0, 17.0, 22.0], [4.5, 0.0, 4.5]),
])
def test_looks_start_every_poll_interval_however_long_a_look_takes(costs, looks, sleeps):
    clock = FakeClock()
    plan = list(costs)

    def story(trace, t):
        clock.now += plan.pop(0) if len(plan) > 1 else plan[0]  # the last cost repeats
        return trace.step(t, cpu=1.0)

    probe = ReplayProbe(clock, story)
    result = wait_for_ready(config(engine="vllm", timeout=40, poll_interval=5), probe,
                            clock=clock, sleep=clock.sleep)
    assert [t for t, _r in probe.looks][:len(looks)] == looks
    assert clock.sleeps[:len(sleeps)] == sleeps
    assert result["phase"] == "timeout"


class HungCompletionProbe(object):
    """A server that listens from `hang_t` on, /health 200, while its completion hangs: each look
    lasts as long as HostProbe would wait for the completion (the budget the waiter hands it)."""

    def __init__(self, clock, cfg, hang_t, busy):
        self.clock, self.cfg, self.hang_t, self.busy = clock, cfg, hang_t, busy
        self.trace = Trace(pids=(100, 200, 300))
        self.budgets = []

    def snapshot(self, t, remaining=None, stacks=False):
        if t < self.hang_t:
            return self.trace.step(t, cpu=1.0, lines=[vllm_prefix("Worker", 300) + "Starting to load model /m..."]
                                   if t == 0 else [])
        budget = self.cfg.completion_timeout if remaining is None else min(self.cfg.completion_timeout, remaining)
        self.budgets.append(budget)
        self.clock.now += budget
        return self.trace.step(t, cpu=1.0 if self.busy else 0.0,
                               http_result=http(200, models=200, completion="timeout", model="m"))


@pytest.mark.parametrize("stall,poll,completion,verdict_at", [
    (10, 1, 30, 31),  # the bench's hang after ready: the first attempt is cut at the stall's moment
    (10, 1, 3, 31),
    (600, 5, 30, 625),  # the defaults
])
def test_a_hung_completion_costs_one_attempt_at_most_then_the_stall_comes_on_time(stall, poll, completion, verdict_at):
    clock = FakeClock()
    cfg = config(engine="vllm", timeout=3600, stall_timeout=stall, poll_interval=poll, completion_timeout=completion)
    probe = HungCompletionProbe(clock, cfg, hang_t=20, busy=False)
    result = wait_for_ready(cfg, probe, clock=clock, sleep=clock.sleep)
    assert result["phase"] == "stalled" and result["elapsed"] == verdict_at
    assert verdict_at <= 20 + stall + 2 * poll  # the documented bound, completion_timeout or not
    assert probe.budgets[0] <= min(completion, stall) and set(probe.budgets[1:]) == {min(completion, poll)}
    assert result["evidence"][0].startswith("POST /v1/completions (model 'm'): timeout")


class StoppedServerProbe(object):
    """A server stopped (SIGSTOP) before the wait began: it accepts and never answers. Each look lasts
    what HostProbe waits then: the look's one HTTP budget, max(5 s, completion_timeout), within the
    waiter's; `completion_first` adds the case where /health answers and the completion hangs."""

    def __init__(self, clock, cfg, completion_first=False):
        self.clock, self.cfg, self.completion_first = clock, cfg, completion_first
        self.trace = Trace(pids=(100, 200, 300))
        self.budgets = []

    def snapshot(self, t, remaining=None, stacks=False):
        limit = max(5.0, self.cfg.completion_timeout)
        budget = limit if remaining is None else min(limit, remaining)
        self.budgets.append(budget)
        self.clock.now += budget
        if self.completion_first:
            answers = http(200, completion="timeout", model="m")
        else:
            answers = http("timeout")
        return self.trace.step(t, cpu=0.0, states={300: "T", 200: "T", 100: "T"}, http_result=answers)


@pytest.mark.parametrize("completion_first", [False, True])
def test_a_server_stopped_before_the_wait_is_stalled_within_the_stall_bound_and_two_polls(completion_first):
    clock = FakeClock()
    cfg = config(engine="vllm", timeout=3600, stall_timeout=15, poll_interval=1, completion_timeout=30)
    probe = StoppedServerProbe(clock, cfg, completion_first)
    result = wait_for_ready(cfg, probe, clock=clock, sleep=clock.sleep)
    assert result["phase"] == "stalled"
    assert result["elapsed"] <= 15 + 2 * 1, (result["elapsed"], probe.budgets)
    # Even the first look, before any stall moment is known, ends by the earliest one.
    assert probe.budgets[0] <= 15


def test_a_busy_server_whose_completion_is_slow_still_gets_full_attempts():
    clock = FakeClock()
    cfg = config(engine="vllm", timeout=200, stall_timeout=60, poll_interval=5, completion_timeout=30)
    probe = HungCompletionProbe(clock, cfg, hang_t=20, busy=True)
    result = wait_for_ready(cfg, probe, clock=clock, sleep=clock.sleep)
    assert result["phase"] == "timeout"  # never stalled: the CPU works
    # A timed-out attempt is followed by a short one; the CPU seen then gives the next its full time.
    assert probe.budgets[:6] == [30, 5, 30, 5, 30, 5]


def test_hang_fails_as_stalled_before_the_deadline():
    clock = FakeClock()

    def story(trace, t):
        return trace.step(t, cpu=1.0 if t <= 50 else 0.0, states={300: "T"} if t > 50 else None)

    probe = ReplayProbe(clock, story)
    result = wait_for_ready(config(engine="vllm", timeout=3600, stall_timeout=120, poll_interval=5),
                            probe, clock=clock, sleep=clock.sleep)
    assert result["phase"] == "stalled" and result["failed"] is True
    assert result["elapsed"] == 170
    assert "no progress for 120 s" in result["msg"] and "process 300 state T (stopped)" in result["msg"]


@pytest.mark.parametrize("stall, last_looks", [
    (120, [155.0, 160.0, 165.0, 170.0]),  # a multiple of the poll: the grid's own look is the stall's
    (17, [55.0, 60.0, 65.0, 67.01]),  # not one: one look more, at the last progress (50) + 17 s
])
def test_one_look_falls_where_stall_timeout_runs_out(stall, last_looks):
    clock = FakeClock()
    probe = ReplayProbe(clock, lambda trace, t: trace.step(t, cpu=1.0 if t <= 50 else 0.0))
    result = wait_for_ready(config(engine="vllm", timeout=3600, stall_timeout=stall, poll_interval=5),
                            probe, clock=clock, sleep=clock.sleep)
    assert result["phase"] == "stalled"
    assert result["elapsed"] == 50 + stall  # not up to a poll later
    assert [round(t, 2) for t, _r in probe.looks[-4:]] == last_looks


def test_timeout_zero_looks_once_and_never_fails():
    clock = FakeClock()
    probe = ReplayProbe(clock, lambda trace, t: trace.step(t, lines=["[2026-05-25 19:06:14 TP0] Load weight begin."]))
    result = wait_for_ready(config(engine="sglang", timeout=0), probe, clock=clock, sleep=clock.sleep)
    assert result["phase"] == "loading" and result["failed"] is False and result["elapsed"] == 0
    assert len(probe.looks) == 1 and probe.looks[0] == (0.0, None) and clock.sleeps == []


def test_timeout_zero_reports_a_dead_server_as_failed_without_failing_the_task():
    clock = FakeClock()
    probe = ReplayProbe(clock, lambda trace, t: trace.step(t, alive=False))
    result = wait_for_ready(config(timeout=0), probe, clock=clock, sleep=clock.sleep)
    assert result["phase"] == "failed" and result["failed"] is False


def test_unwritable_progress_path_is_a_warning_not_the_end(tmp_path):
    clock = FakeClock()
    probe = ReplayProbe(clock, lambda trace, t: trace.step(t))
    cfg = config(timeout=0, progress_path=str(tmp_path / "missing-dir" / "p.jsonl"))
    result = wait_for_ready(cfg, probe, clock=clock, sleep=clock.sleep)
    assert "could not be written" in result["warnings"][0]


def test_unreadable_signals_become_warnings_once():
    clock = FakeClock()

    def story(trace, t):
        snap = trace.step(t, cpu=1.0)
        snap.errors = ["journalctl failed (rc 1): No journal files were opened due to insufficient permissions."]
        return snap

    result = wait_for_ready(config(timeout=20, poll_interval=5), ReplayProbe(clock, story), clock=clock, sleep=clock.sleep)
    assert result["phase"] == "timeout"
    assert result["warnings"] == ["journalctl failed (rc 1): No journal files were opened due to insufficient permissions."]
