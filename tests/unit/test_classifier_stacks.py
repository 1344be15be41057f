"""The hang that looks like work: the classifier with the ranks' stacks, on replayed looks.

Each case drives the classifier as the waiter does: a look reads the stacks only when
Classifier.stacks_due() says so, and the stacks are what py-spy would show (a signature per
process, its innermost frames, its page-fault count). The shapes are those measured on the
simulated engine with real py-spy (tests/integration/test_stacks_sim.py):
  spin      every busy rank's frames stand still and it faults in no page (a busy-waiting collective)
  repack    the frames stand still too, but each ~2.5 s layer faults in a fresh 32 MiB (8192 pages)
  python    the frames move from one read to the next (a Python-level loop, the simulator's JIT)
"""
import pytest

from ansible_collections.modelwake.serving.plugins.module_utils.readiness.classifier import Classifier
from ansible_collections.modelwake.serving.plugins.module_utils.readiness.snapshot import Snapshot
from ansible_collections.modelwake.serving.plugins.module_utils.readiness.spin import STACKS_CPU_SHARE, SpinTracker

from tests.helpers.traces import SGLANG_PREFIX, config, http

RANKS = (201, 202)
API = 200


def stack(pid, rank, function, signature, faults, state="R"):
    return {"pid": pid, "name": "sglang::scheduler_TP%d" % rank, "rank": rank, "state": state,
            "thread": "MainThread", "frames": [[function, "parallel_state.py", 512], ["forward", "model.py", 88]],
            "signature": signature, "cpu_seconds": 0.0, "faults": faults}


class Ranks(object):
    """Two busy ranks and an idle API process; cumulative per-process CPU and faults."""

    def __init__(self, shape, lines=(), read_cpu_s=0.0):
        self.shape = shape
        self.read_cpu_s = read_cpu_s  # what each stack read cost (HostProbe measures py-spy's CPU)
        self.cpu = dict((pid, 1.0) for pid in RANKS + (API,))
        self.faults = dict((pid, 5000) for pid in RANKS + (API,))
        self.t = None
        self.lines = list(lines)
        self.reads = 0

    def look(self, t, want_stacks, cores_per_rank=1.0, read_rate=0):
        dt = 0.0 if self.t is None else t - self.t
        self.t = t
        for pid in RANKS:
            self.cpu[pid] += cores_per_rank * dt
            if self.shape == "repack":
                self.faults[pid] += int(8192 * dt / 2.5)
        self.reads += int(read_rate * dt)
        process = {"root_pid": API, "alive": True, "pids": sorted(self.cpu),
                   "cpu_seconds": round(sum(self.cpu.values()), 2), "read_bytes": self.reads,
                   "states": dict((str(p), "R" if p in RANKS else "S") for p in self.cpu),
                   "comms": dict((str(p), "python3") for p in self.cpu),
                   "cpu": dict((str(p), round(c, 2)) for p, c in self.cpu.items())}
        sample = None
        if want_stacks:
            moving = self.shape == "python"
            procs = [stack(pid, rank, "all_reduce" if self.shape == "spin" else "repack_marlin_weights",
                           "sig-%d-%s" % (pid, t if moving else "same"), self.faults[pid])
                     for rank, pid in enumerate(RANKS)]
            procs.append({"pid": API, "name": "python3", "rank": None, "state": "S", "thread": "MainThread",
                          "frames": [["select", "selectors.py", 468]], "signature": "api", "cpu_seconds": 0.0,
                          "faults": self.faults[API]})
            sample = {"processes": procs, "unavailable": None, "cpu_s": self.read_cpu_s}
        lines, self.lines = self.lines, []
        return Snapshot(t=t, process=process, log_lines=lines, http=http(), stacks=sample)


def drive(cfg, ranks, until, poll, **look):
    """Looks every `poll` seconds up to `until` or a terminal verdict; returns [(t, verdict, read stacks)]."""
    classifier = Classifier(cfg)
    seen = []
    t = 0
    while t <= until:
        due = classifier.stacks_due(t)
        verdict = classifier.observe(ranks.look(t, due, **look))
        seen.append((t, verdict, due))
        if verdict.terminal:
            break
        t += poll
    return seen


INIT = [SGLANG_PREFIX + "Load weight end. elapsed=12.00 s, type=DeepseekV3ForCausalLM, avail mem=20.00 GB"]


def test_ranks_spinning_in_one_frame_are_stalled_after_stall_timeout_plus_one_read():
    cfg = config(engine="sglang", stall_timeout=60, poll_interval=5)
    seen = drive(cfg, Ranks("spin", INIT), until=600, poll=5)
    t, verdict, _ = seen[-1]
    assert verdict.phase == "stalled"
    # The log's last line came at t=0; t=5 was the first silent look, so t=10 read the stacks and
    # t=15 saw them unchanged: the CPU since t=10 went to frames that stand still, and the stall
    # clock runs from t=10 - stall_timeout + 2 polls after the last other progress.
    assert t == 70
    assert "no progress for 60 s in phase initializing" in verdict.msg
    assert ("the CPU (2.00 cores) goes to frames that have not moved, nor touched new memory, since +10 s: "
            "a busy-wait, not work" in verdict.msg)
    assert "the ranks' stacks: TP0-1 in all_reduce (parallel_state.py:512) for " in verdict.msg
    assert verdict.where.startswith("TP0-1 in all_reduce (parallel_state.py:512) for ")
    assert [s["rank"] for s in verdict.stacks] == [None, 0, 1] and verdict.stacks[1]["same_for"] == 60.0
    # Stacks are read after a silent look only, at every look while silent (stacks_interval 0).
    assert [due for _t, _v, due in seen[:4]] == [False, False, True, True]


def test_a_repack_from_one_call_site_on_fresh_memory_stays_progress():
    cfg = config(engine="sglang", stall_timeout=20, poll_interval=2)
    seen = drive(cfg, Ranks("repack", INIT), until=300, poll=2)
    assert all(verdict.phase == "initializing" for _t, verdict, _ in seen[1:])
    last = seen[-1][1]
    assert last.last_progress["what"].startswith("CPU 2.00 cores")
    # The frames have not changed for the whole phase: `for` counts from the first read.
    assert last.where.startswith("TP0-1 in repack_marlin_weights (parallel_state.py:512) for 4m5")


def test_frames_that_move_are_progress_like_before():
    cfg = config(engine="sglang", stall_timeout=20, poll_interval=2)
    seen = drive(cfg, Ranks("python", INIT), until=200, poll=2)
    assert not any(verdict.terminal for _t, verdict, _ in seen)


def test_without_stacks_cpu_is_progress_as_before():
    cfg = config(engine="sglang", stall_timeout=20, poll_interval=2, py_spy="off")
    seen = drive(cfg, Ranks("spin", INIT), until=200, poll=2)
    assert not any(verdict.terminal for _t, verdict, _ in seen)
    assert not any(due for _t, _v, due in seen)
    assert seen[-1][1].stacks == [] and seen[-1][1].where == ""


def test_a_spin_while_loading_stays_in_loading_and_is_stalled_there():
    cfg = config(engine="sglang", stall_timeout=30, poll_interval=5, expected_bytes=10 * 1024 ** 3)
    ranks = Ranks("spin", [SGLANG_PREFIX + "Load weight begin. avail mem=90.00 GB"])
    classifier = Classifier(cfg)
    verdicts = []
    for t in range(0, 300, 5):
        reading = t < 40  # the reads stop at 40 s; the ranks spin from then on
        due = classifier.stacks_due(t)
        verdict = classifier.observe(ranks.look(t, due and not reading, read_rate=200 * 1024 ** 2 if reading else 0))
        verdicts.append((t, verdict))
        if verdict.terminal:
            break
    t, last = verdicts[-1]
    assert last.phase == "stalled" and "in phase loading" in last.msg
    assert 40 + 30 <= t <= 40 + 30 + 2 * 5


@pytest.mark.parametrize("interval, bound", [(0, 70), (15, 85)])
def test_stacks_interval_spaces_the_reads_and_bounds_the_verdict(interval, bound):
    cfg = config(engine="sglang", stall_timeout=60, poll_interval=5, stacks_interval=interval)
    seen = drive(cfg, Ranks("spin", INIT), until=600, poll=5)
    reads = [t for t, _v, due in seen if due]
    assert all(b - a >= max(interval, 5) for a, b in zip(reads, reads[1:]))
    assert seen[-1][1].phase == "stalled" and seen[-1][0] <= bound


@pytest.mark.parametrize("stall, read_cpu_s, gap", [
    (600, 0.05, 20),  # 50 ms a read: one every 20 s keeps the stacks at 0.25 % of a core
    (60, 0.05, 15),  # but never more than stall_timeout / 4 apart: the spin is still declared on time
    (600, 0.001, 5),  # a cheap read: every silent look, as stacks_interval 0 says
])
def test_costly_stack_reads_are_spaced_to_a_share_of_a_core(stall, read_cpu_s, gap):
    cfg = config(engine="sglang", stall_timeout=stall, poll_interval=5)
    seen = drive(cfg, Ranks("spin", INIT, read_cpu_s=read_cpu_s), until=2000, poll=5)
    reads = [t for t, _v, due in seen if due]
    assert len(reads) >= 3 and set(b - a for a, b in zip(reads, reads[1:])) == {gap}
    assert seen[-1][1].phase == "stalled"
    # The spin's bound grows by the gap at most: stall_timeout + 2 polls + the gap after the first read.
    assert seen[-1][0] <= reads[0] + stall + 2 * 5 + gap
    # However far apart the reads, the verdict says where the ranks were at the latest one.
    assert "; the ranks' stacks: TP0-1 in all_reduce (parallel_state.py:512)" in seen[-1][1].msg, seen[-1][1].msg


@pytest.mark.parametrize("stall", [24, 26, 28, 30, 32, 34])
def test_a_stall_names_the_ranks_also_when_the_latest_read_is_a_gap_old(stall):
    # The real vLLM deploy's stopped worker: ranks that use no CPU, a 2 s poll, reads spaced by their
    # cost up to stall_timeout / 4 apart; the stall falls anywhere between two reads.
    cfg = config(engine="sglang", stall_timeout=stall, poll_interval=2)
    seen = drive(cfg, Ranks("spin", INIT, read_cpu_s=0.05), until=300, poll=2, cores_per_rank=0.0)
    verdict = seen[-1][1]
    assert verdict.phase == "stalled"
    assert "; the ranks' stacks: TP0-1 in all_reduce (parallel_state.py:512)" in verdict.msg, verdict.msg
    assert [s["rank"] for s in verdict.stacks] == [None, 0, 1] and verdict.where.startswith("TP0-1 in all_reduce")


def test_the_look_at_the_stall_reads_the_stacks_when_no_silent_look_came_first():
    # The real vLLM worker stopped after ready: the first look reads the unit's log backlog (news,
    # so that look is not silent) and waits out a 30 s completion timeout, so the next look is
    # already past the stall's moment. That look reads the stacks, and the verdict names the ranks.
    cfg = config(engine="sglang", stall_timeout=20, poll_interval=2)
    ranks = Ranks("spin", INIT)
    classifier = Classifier(cfg)
    first = classifier.observe(ranks.look(0, classifier.stacks_due(0), cores_per_rank=0.0))
    assert first.phase == "initializing" and not classifier.stacks_due(2)  # news: not silent
    assert classifier.stacks_due(30)
    verdict = classifier.observe(ranks.look(30, True, cores_per_rank=0.0))
    assert verdict.phase == "stalled", verdict.msg
    assert "; the ranks' stacks: TP0-1 in all_reduce (parallel_state.py:512)" in verdict.msg, verdict.msg


def test_stacks_read_in_an_earlier_phase_are_not_shown_in_the_next():
    cfg = config(engine="sglang", stall_timeout=600, poll_interval=5, expected_bytes=10 * 1024 ** 3)
    ranks = Ranks("spin", [SGLANG_PREFIX + "Load weight begin. avail mem=90.00 GB"])
    classifier = Classifier(cfg)
    for t in (0, 5, 10, 15):  # a held load: silent, so its stacks are read
        verdict = classifier.observe(ranks.look(t, classifier.stacks_due(t)))
    assert verdict.phase == "loading" and verdict.where.startswith("TP0-1 in all_reduce")
    ranks.lines = list(INIT)  # the load ends; this look is news, so it reads no stacks
    verdict = classifier.observe(ranks.look(20, False))
    assert verdict.phase == "initializing" and verdict.where == "", verdict.where


def test_a_read_that_misses_a_live_process_keeps_what_the_last_one_saw():
    cfg = config(engine="sglang", stall_timeout=60, poll_interval=5)
    ranks = Ranks("spin", INIT)
    classifier = Classifier(cfg)
    for t in range(0, 40, 5):
        snap = ranks.look(t, classifier.stacks_due(t))
        if snap.stacks and t == 25:
            snap.stacks["processes"] = [p for p in snap.stacks["processes"] if p["pid"] != RANKS[1]]  # a timed-out read
        verdict = classifier.observe(snap)
    assert verdict.where.startswith("TP0-1 in all_reduce (parallel_state.py:512) for 25s")


def test_the_tracker_calls_a_process_still_only_while_its_frames_and_its_memory_stand_still():
    tracker = SpinTracker()

    def read(t, signature, faults):
        tracker.fold(t, {"processes": [stack(201, 0, "all_reduce", signature, faults)], "cpu_s": 0.02}, [201], 100)
        return tracker.entries["201"]

    assert read(10.0, "a", 5000)["still"] is False  # first seen: nothing to compare with
    entry = read(20.0, "a", 5050)
    assert entry["still"] is True and entry["since"] == 10.0 and entry["still_since"] == 10.0
    entry = read(30.0, "a", 5200)  # the same frames, 150 fresh pages: at work
    assert entry["still"] is False and entry["since"] == 10.0 and entry["still_since"] == 30.0
    entry = read(40.0, "b", 5200)  # the frames moved
    assert entry["still"] is False and entry["since"] == 40.0 and entry["in_since"] == 10.0  # same function
    read(50.0, "b", 5210)
    assert tracker.moved() == 40.0
    # Only the still process's CPU counts as spun: 3 s of it over 10 s.
    tracker.cpu_prev = {"201": 100.0, "200": 50.0}
    assert tracker.spinning_cpu_rate({"201": 103.0, "200": 59.0}, 10.0) == pytest.approx(0.3)
    assert tracker.spinning_cpu_rate({"201": 104.0}, None) == 0.0 and tracker.cpu_prev == {"201": 104.0}
    # A read that cost 0.02 s of CPU is spaced 8 s from the next one, within a quarter of stall_timeout.
    assert tracker.gap(0.0, 600) == pytest.approx(0.02 / STACKS_CPU_SHARE)
    assert tracker.gap(0.0, 20) == 5.0 and tracker.gap(30.0, 600) == 30.0
