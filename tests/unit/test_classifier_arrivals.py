"""The classifier on the ways a model arrives, on replayed looks: hub downloads, streamed loads,
RDMA loads, Python at work on one hot line, a rank that dies while the others wait, a saturated host.

The shapes are those measured on live processes (tests/integration/test_arrivals.py,
tests/unit/test_stacks_shapes.py): a download grows `blobs/*.incomplete` and the written counters
with rchar flat; a streamed load grows rchar with read_bytes flat; py-spy finds a Python hot loop
active with the GIL and its locals changing, a native busy-wait without the GIL.
"""
import pytest

from ansible_collections.modelwake.serving.plugins.module_utils.readiness.classifier import Classifier
from ansible_collections.modelwake.serving.plugins.module_utils.readiness.snapshot import Snapshot
from ansible_collections.modelwake.serving.plugins.module_utils.readiness.status import format_status

from tests.helpers.traces import MIB, SGLANG_PREFIX, config, http, replay
from tests.unit.test_classifier_stacks import INIT, Ranks, drive

LOAD_BEGIN = SGLANG_PREFIX + "Load weight begin. avail mem=90.00 GB"
BLOB = "/root/.cache/huggingface/hub/models--org--k26/blobs/4f1e.incomplete"


class Arrival(object):
    """One process tree whose counters grow by the rates of each step, as /proc and the hub cache show."""

    def __init__(self, pids=(100, 101)):
        self.pids = list(pids)
        self.t = None
        self.counters = {"cpu_seconds": 2.0, "read_bytes": 0, "rchar": 0, "wchar": 0, "write_bytes": 0}
        self.partial = 0
        self.ib = 0

    def look(self, t, lines=(), download=0, stream=0, ib=0, cpu=0.0, partial_present=True, weight_files_open=0):
        """Rates in bytes/s since the previous look: download (into the .incomplete file, written),
        stream (read(2) from a socket), ib (received by the host's HCAs)."""
        dt = 0 if self.t is None else t - self.t
        self.t = t
        self.counters["cpu_seconds"] += cpu * dt
        self.partial += int(download * dt)
        self.counters["wchar"] += int(download * dt)
        self.counters["write_bytes"] += int(download * dt)
        self.counters["rchar"] += int(stream * dt)
        self.ib += int(ib * dt)
        process = dict(self.counters, root_pid=self.pids[0], alive=True, pids=list(self.pids),
                       weight_files_open=weight_files_open if stream else None,
                       states=dict((str(p), "S") for p in self.pids), comms=dict((str(p), "python3") for p in self.pids))
        files = [{"repo": "org/k26", "blob": "4f1e.incomplete", "file": None, "bytes": self.partial,
                  "path": BLOB}] if partial_present else []
        downloads = {"caches": ["/root/.cache/huggingface/hub"], "files": files,
                     "bytes": self.partial if partial_present else 0, "expected": None}
        return Snapshot(t=t, process=process, log_lines=list(lines), http=http(), downloads=downloads,
                        ib_rcv_bytes=self.ib)


def test_a_slow_download_is_loading_with_its_source_and_never_stalled():
    # 100 KiB/s for 20 minutes under a 60-s stall_timeout: every byte counts, even below read_threshold.
    cfg = config(engine="sglang", stall_timeout=60, poll_interval=5)
    arrival = Arrival()
    looks = [arrival.look(0, lines=[LOAD_BEGIN])] + [arrival.look(t, download=100 * 1024) for t in range(5, 1200, 5)]
    seen = replay(cfg, looks)
    assert [v.phase for _t, v in seen[1:]] == ["loading"] * (len(seen) - 1)
    last = seen[-1][1]
    assert last.source["kind"] == "download" and last.source["file"] == "org/k26 blob 4f1e"
    assert last.source["bytes"] == arrival.partial and last.source["rate"] == pytest.approx(100 * 1024, rel=0.02)
    assert last.last_progress["what"].startswith("download +0.5 MiB (org/k26 blob 4f1e)")
    assert format_status(last, 1200).startswith("loading (downloading org/k26 blob 4f1e: ")


def test_a_download_that_stops_is_stalled_from_its_last_byte_and_names_the_file():
    cfg = config(engine="sglang", stall_timeout=60, poll_interval=5)
    arrival = Arrival()
    looks = [arrival.look(0, lines=[LOAD_BEGIN])] + [arrival.look(t, download=4 * MIB) for t in range(5, 45, 5)]
    looks += [arrival.look(t) for t in range(45, 300, 5)]  # the socket stays open; no byte comes
    seen = replay(cfg, looks)
    t, verdict = seen[-1]
    assert verdict.phase == "stalled" and t == 100  # the last byte came at t=40
    assert "last progress: download +20.0 MiB (org/k26 blob 4f1e) at +40 s" in verdict.msg, verdict.msg
    assert ("waiting on the network: the download of org/k26 blob 4f1e stopped at 160.0 MiB, no byte for 60 s"
            in verdict.msg), verdict.msg


def test_a_finished_download_is_not_a_stall_of_the_network():
    # The .incomplete is renamed when done: a later stall (loading from the cache) blames nothing on the network.
    cfg = config(engine="sglang", stall_timeout=30, poll_interval=5)
    arrival = Arrival()
    looks = [arrival.look(0, lines=[LOAD_BEGIN])] + [arrival.look(t, download=4 * MIB) for t in range(5, 25, 5)]
    looks += [arrival.look(t, partial_present=False) for t in range(25, 200, 5)]
    _t, verdict = replay(cfg, looks)[-1]
    assert verdict.phase == "stalled" and "waiting on the network" not in verdict.msg


def test_a_streamed_load_reads_a_socket_and_is_progress_with_no_log():
    cfg = config(stall_timeout=30, poll_interval=5)  # no log followed: the counters alone
    arrival = Arrival()
    looks = [arrival.look(0)] + [arrival.look(t, stream=50 * MIB) for t in range(5, 300, 5)]
    seen = replay(cfg, looks)
    assert not [v for _t, v in seen if v.terminal]
    last = seen[-1][1]
    assert last.phase == "loading" and last.source["kind"] == "stream"
    assert last.source["rate"] == pytest.approx(50 * MIB, rel=0.02)
    assert last.last_progress["what"].startswith("socket reads +250.0 MiB (rchar beyond read_bytes)")


def test_a_disk_read_through_read_2_is_not_taken_for_a_stream():
    cfg = config(stall_timeout=30, poll_interval=5)
    arrival = Arrival()
    looks = [arrival.look(0)]
    for t in range(5, 60, 5):
        arrival.counters["read_bytes"] += 5 * 50 * MIB  # the same bytes in both counters: a file
        looks.append(arrival.look(t, stream=50 * MIB))
    last = replay(cfg, looks)[-1][1]
    assert last.source is None and last.last_progress["what"].startswith("read_bytes +250.0 MiB")


def test_reads_beyond_the_disk_with_a_weight_file_open_are_the_page_cache_not_a_stream():
    # A local model already in the page cache, read with read(2): rchar grows, read_bytes does not.
    cfg = config(stall_timeout=30, poll_interval=5)
    arrival = Arrival()
    looks = [arrival.look(0)] + [arrival.look(t, stream=50 * MIB, weight_files_open=2) for t in range(5, 120, 5)]
    seen = replay(cfg, looks)
    assert not [v for _t, v in seen if v.terminal]
    last = seen[-1][1]
    assert last.source is None and last.phase == "loading"
    assert last.last_progress["what"].startswith("reads +250.0 MiB from the page cache")


def test_reads_after_a_download_are_the_downloaded_files_not_a_stream():
    # The files just written are in the page cache: loading them grows rchar, not read_bytes.
    cfg = config(engine="sglang", stall_timeout=30, poll_interval=5)
    arrival = Arrival()
    looks = [arrival.look(0, lines=[LOAD_BEGIN])] + [arrival.look(t, download=4 * MIB) for t in range(5, 25, 5)]
    looks += [arrival.look(t, stream=50 * MIB, partial_present=False) for t in range(25, 60, 5)]
    seen = replay(cfg, looks)
    assert not [v for _t, v in seen if v.terminal]
    last = seen[-1][1]
    assert last.last_progress["what"].startswith("reads +250.0 MiB from the page cache")
    assert last.source is None  # downloaded: no longer "downloading" in STATUS=


def test_infiniband_bytes_are_progress_while_loading_only():
    cfg = config(engine="sglang", stall_timeout=30, poll_interval=5)
    arrival = Arrival()
    looks = [arrival.look(0, lines=[LOAD_BEGIN])] + [arrival.look(t, ib=2000 * MIB) for t in range(5, 100, 5)]
    # Once loaded, the HCAs count other jobs' traffic too: no longer this start's progress.
    looks.append(arrival.look(100, ib=2000 * MIB, lines=[SGLANG_PREFIX + "Load weight end. elapsed=12.00 s"]))
    looks += [arrival.look(t, ib=2000 * MIB) for t in range(105, 300, 5)]
    seen = replay(cfg, looks)
    loading = [v for t, v in seen if t < 100]
    assert [v.phase for v in loading[1:]] == ["loading"] * (len(loading) - 1)
    assert loading[-1].source["kind"] == "infiniband"
    assert loading[-1].last_progress["what"].startswith("InfiniBand received +10000.0 MiB")
    t, verdict = seen[-1]
    assert verdict.phase == "stalled" and t == 130 and verdict.source is None


# -- Python at work, a native busy-wait ----------------------------------------------------------

class Sampled(Ranks):
    """Ranks whose stack reads carry three quick samples: the GIL and locals as py-spy gives them."""

    def __init__(self, shape, owns_gil, locals_moved, lines=()):
        Ranks.__init__(self, "spin", lines)
        self.owns_gil = owns_gil
        self.locals_moved = locals_moved
        self.function = shape

    def look(self, t, want_stacks, **kwargs):
        snap = Ranks.look(self, t, want_stacks, **kwargs)
        for proc in (snap.stacks or {}).get("processes") or []:
            if proc["rank"] is not None:
                proc["frames"][0][0] = self.function
                proc.update(samples=3, owns_gil=self.owns_gil, active=True, line_moved=False,
                            gil_active_samples=3 if self.owns_gil else 0, locals_moved=self.locals_moved)
        return snap


def test_python_on_one_hot_line_holding_the_gil_with_moving_locals_is_work():
    cfg = config(engine="sglang", stall_timeout=20, poll_interval=2)
    seen = drive(cfg, Sampled("python_work", owns_gil=True, locals_moved=True, lines=INIT), until=300, poll=2)
    assert not [v for _t, v, _due in seen if v.terminal]
    assert not [v for _t, v, _due in seen if "busy-wait" in v.msg]
    assert seen[-1][1].last_progress["what"].startswith("CPU 2.00 cores")


@pytest.mark.parametrize("owns_gil,locals_moved", [(False, False), (True, False), (True, None)],
                         ids=["native-without-gil", "native-keeping-the-gil", "no-locals-read"])
def test_a_busy_wait_in_one_native_call_is_still_stalled(owns_gil, locals_moved):
    cfg = config(engine="sglang", stall_timeout=60, poll_interval=5)
    seen = drive(cfg, Sampled("all_reduce", owns_gil=owns_gil, locals_moved=locals_moved, lines=INIT), until=600, poll=5)
    t, verdict, _ = seen[-1]
    # As without the GIL evidence: stall_timeout after the first read that saw it stand still, plus a poll.
    assert verdict.phase == "stalled" and t == 70
    assert "a busy-wait, not work" in verdict.msg


def test_on_a_saturated_host_a_stall_says_so_and_never_says_busy_wait():
    cfg = config(engine="sglang", stall_timeout=60, poll_interval=5)
    ranks = Sampled("all_reduce", owns_gil=False, locals_moved=False, lines=INIT)
    classifier = Classifier(cfg)
    t = 0
    while True:
        snap = ranks.look(t, classifier.stacks_due(t))
        snap.load = {"runnable": 9, "load1": 8.7, "cores": 2}
        verdict = classifier.observe(snap)
        if verdict.terminal:
            break
        t += 5
    assert verdict.phase == "stalled"
    assert "busy-wait" not in verdict.msg
    assert "the host's CPUs are saturated (9 runnable, load 8.7 on 2 cores): the ranks may be starved" in verdict.msg


# -- a rank dies ----------------------------------------------------------------------------------

class Tree(object):
    """An SGLang tree at TP 3: the launcher (100) and its schedulers TP0-2 (101-103)."""

    def __init__(self):
        self.states = {100: "S", 101: "S", 102: "S", 103: "S"}
        self.exits = {}
        self.cpu = 3.0
        self.cpu_per_look = 0.5

    def look(self, t, lines=()):
        self.cpu += self.cpu_per_look
        live = sorted(self.states)
        process = {"root_pid": 100, "alive": True, "pids": live, "cpu_seconds": self.cpu, "read_bytes": 0,
                   "states": dict((str(p), s) for p, s in self.states.items()),
                   "comms": dict((str(p), "python3" if p == 100 else "sglang::schedul") for p in live),
                   "ranks": dict((str(p), p - 101) for p in live if p != 100 and self.states[p] != "Z"),
                   "exits": dict((str(p), status) for p, status in self.exits.items())}
        return Snapshot(t=t, process=process, log_lines=list(lines), http=http())


def test_a_rank_dead_of_an_exception_is_named_with_its_exit_and_the_ranks_left_waiting():
    cfg = config(engine="sglang", stall_timeout=600, poll_interval=5)
    tree = Tree()
    looks = [tree.look(0, lines=[INIT[0]])]
    tree.states[103] = "Z"
    tree.exits[103] = 1 << 8
    header = "[2026-05-25 19:06:20 TP2] Scheduler hit an exception: Traceback (most recent call last):"
    looks.append(tree.look(5, lines=[header, '  File "/sglang/srt/managers/scheduler.py", line 2310, in run_scheduler_process',
                                     "RuntimeError: CUDA error: an illegal memory access was encountered"]))
    _t, verdict = replay(cfg, looks)[-1]
    assert verdict.phase == "failed"
    assert verdict.msg.startswith("failed: the server logged a fatal error: RuntimeError: CUDA error: an illegal memory")
    assert ("; rank TP2 (pid 103) died (exit status 1); still alive: pid 100 (python3), TP0 (pid 101), TP1 (pid 102): "
            "they wait for it and cannot go on without it" in verdict.msg), verdict.msg
    assert verdict.evidence[0].startswith("RuntimeError: CUDA error") and header in verdict.evidence


def test_a_rank_killed_without_a_word_fails_one_look_later_when_the_engine_says_nothing():
    cfg = config(engine="sglang", stall_timeout=600, poll_interval=5)
    tree = Tree()
    looks = [tree.look(0, lines=[INIT[0]]), tree.look(5)]
    tree.states[103] = "Z"
    tree.exits[103] = 9  # SIGKILL, as the OOM killer sends it
    looks += [tree.look(10), tree.look(15)]
    seen = replay(cfg, looks)
    assert [v.phase for _t, v in seen] == ["initializing", "initializing", "initializing", "failed"]
    verdict = seen[-1][1]
    assert verdict.msg.startswith("failed: rank TP2 (pid 103) died (killed by signal 9 (SIGKILL)); still alive: ")
    assert "15 s into the wait, in phase initializing, with no error in the log" in verdict.msg


def test_a_rank_death_the_engine_reports_at_the_next_look_keeps_the_engines_words():
    # The parent noticed and says which rank died (SGLang's watchdog): its line is the cause.
    cfg = config(engine="sglang", stall_timeout=600, poll_interval=5)
    tree = Tree()
    looks = [tree.look(0, lines=[INIT[0]])]
    del tree.states[101]  # rank 0, killed and reaped by its parent
    looks.append(tree.look(5))
    looks.append(tree.look(10, lines=["[2026-05-25 19:06:30] Rank 0 scheduler is dead. Please check if there are "
                                      "relevant logs."]))
    looks.append(tree.look(15))  # a fatal line with no exception in it waits one look for its traceback
    seen = replay(cfg, looks)
    t, verdict = seen[-1]
    assert t == 15 and verdict.phase == "failed"
    assert verdict.msg.startswith("failed: the server logged a fatal error: [2026-05-25 19:06:30] Rank 0 scheduler is dead")
    assert "rank TP0 (pid 101) died (exit status unknown: reaped)" in verdict.msg
    assert "Rank 0 scheduler is dead" in verdict.evidence[0]


def test_a_reaped_rank_with_its_siblings_parked_fails_after_the_quiet_bound():
    # Gone from /proc altogether (its parent reaped it): no exit status proves a death, so the rank's end
    # fails the start only once nothing at all moved for rules.RANK_GONE_QUIET seconds after it.
    cfg = config(engine="sglang", stall_timeout=600, poll_interval=5)
    tree = Tree()
    looks = [tree.look(0, lines=[INIT[0]])]
    del tree.states[102]
    tree.cpu_per_look = 0.0  # the ranks left are parked: no CPU, no log, no reads
    looks += [tree.look(t) for t in range(5, 35, 5)]
    seen = replay(cfg, looks)
    assert [v.phase for _t, v in seen] == ["initializing"] * 5 + ["failed"], [v.msg for _t, v in seen]
    t, verdict = seen[-1]
    assert t == 25 and verdict.rule == "rank_gone_quiet"
    assert verdict.msg.startswith("failed: rank TP1 (pid 102) is gone (exit status unknown: reaped) at +5 s, and "
                                  "nothing has moved since"), verdict.msg
    assert "for 20 s: the ranks left wait for it; still alive: pid 100 (python3), TP0 (pid 101), TP2 (pid 103)" in verdict.msg


def test_a_reaped_rank_after_which_the_start_went_on_is_no_failure_in_a_later_silence():
    # The end is a note once anything moved after it; a later silence is the stall rule's, not a death.
    cfg = config(engine="sglang", stall_timeout=600, poll_interval=5)
    tree = Tree()
    looks = [tree.look(0, lines=[INIT[0]])]
    del tree.states[102]
    looks += [tree.look(t) for t in (5, 10, 15)]  # the start goes on
    tree.cpu_per_look = 0.0
    looks += [tree.look(t) for t in range(20, 120, 5)]  # then a long silence, well under stall_timeout
    seen = replay(cfg, looks)
    assert set(v.phase for _t, v in seen) == {"initializing"}, [v.msg for _t, v in seen if v.phase != "initializing"]


def test_a_reaped_rank_while_the_start_goes_on_is_a_note_not_a_failure():
    cfg = config(engine="sglang", stall_timeout=600, poll_interval=5)
    tree = Tree()
    looks = [tree.look(0, lines=[INIT[0]])]
    del tree.states[102]
    looks += [tree.look(t) for t in range(5, 65, 5)]  # the tree's CPU keeps working
    seen = replay(cfg, looks)
    assert set(v.phase for _t, v in seen) == {"initializing"}
    assert "rank TP1 (pid 102) is gone (exit status unknown: reaped) at +5 s; the start went on" in seen[-1][1].evidence


def test_a_burst_of_cached_reads_is_not_a_stream_and_a_stream_that_ended_is_no_longer_the_source():
    # Python's imports read a few MiB from the page cache in one look, no weight file open.
    cfg = config(stall_timeout=60, poll_interval=5)
    arrival = Arrival()
    looks = [arrival.look(0), arrival.look(5, stream=MIB), arrival.look(10, cpu=0.5)]
    looks += [arrival.look(t, stream=10 * MIB) for t in range(15, 40, 5)]
    looks += [arrival.look(t, cpu=0.5) for t in range(40, 60, 5)]
    seen = dict(replay(cfg, looks))
    assert seen[5].source is None and seen[5].last_progress["what"].startswith("reads +5.0 MiB from the page cache")
    assert seen[15].source is None  # the first look of a stream could still be a burst
    assert seen[20].source["kind"] == "stream" and seen[35].source["kind"] == "stream"
    assert seen[55].source is None  # nothing has come over the socket for four looks
