"""The phase classifier: snapshots in, a verdict out. Pure: no I/O, no clock, no sleeping.

"Why did it say stalled?" is answered here. The rules, in order:
1. failed   a fatal NVIDIA Xid in the kernel log on a watched GPU (readiness/xid.py: the GPU or
            its driver failed; a benign one, or one on a GPU the wait does not watch, is only
            quoted in the evidence); a crash signature in the log (root-cause line as evidence: when no line names the
            cause yet, one more look waits for the traceback); the process gone (pid
            mode) or the unit failed, stopped after running, restarted (NRestarts up, MainPID
            changed, SubState auto-restart: a crash that exits 0 is still a crash); vLLM's
            /health 503 (dead engine); the URL's port held by a process outside the server.
2. ready    the ready check passed while the server's own processes are alive.
3. stalled  no progress on ANY signal for stall_timeout seconds, never earlier.
4. timeout  the overall deadline passed first.
5. otherwise the current phase: the latest log marker, refined by evidence (disk reads or GPU
            memory rising = loading even when the log is silent; reading over and CPU busy =
            initializing; the port answering = initializing).
Progress is any of: tree CPU above cpu_threshold cores, read_bytes up by read_threshold, GPU
memory changed by gpu_memory_threshold MiB (NOT utilisation: a hung NCCL collective spins the
GPUs at 100 %), new log lines other than hang-time chatter, the process tree changing, the
phase changing, an HTTP answer changing, systemd's StatusText changing. A notify unit whose launcher
says it waits before it starts the engine (its turn on the GPUs, a stopped instance's memory:
status.status_waiting) is starting, never stalled: the launcher bounds that wait itself.

The hang that looks like work: CPU is progress only while it goes to code that moves. When the
ranks' stacks are read (py-spy, during silent looks), a busy process whose every Python frame is
where it was at the previous read, and which faulted in fewer than fault_threshold pages since,
is spinning (a busy-waiting collective: one core per rank, no memory touched); its CPU does not
count, and the CPU it burnt since its stack was first seen there is taken back, so the stall
clock runs from the last read that saw it move. Legitimate silent work from one call site (a
layer-by-layer repack, one JIT'd kernel per layer) looks the same from one read to the next but
works on fresh buffers: its page faults keep it progress. Without stacks, CPU counts as before.
"""
import copy
import dataclasses
from typing import Any, Dict, List, Optional
from urllib.parse import urlparse

from ..common.formatting import exit_words, http_result, mib as _mib
from . import bottleneck, engines, xid
from .peers import PeerTracker
from .phases import FAILED, INITIALIZING, LOADING, NOT_STARTED, PHASES, READY, STALLED, STARTING, TIMEOUT
from .spin import SpinTracker
from .stack_summary import summarize
from .transfers import DOWNLOAD, INFINIBAND, STREAM, WRITTEN, TransferTracker
from .status import status_news, status_phase, status_waiting
from .verdict import Verdict, window_rate, windowed

TAIL_LINES = 200


def _rank(phase):
    return PHASES.index(phase) if phase in PHASES else -1


def _later(a, b):
    return a if _rank(a) >= _rank(b) else b


STATE_WORDS = {"T": "stopped", "t": "stopped by a tracer", "D": "in uninterruptible disk sleep", "Z": "a zombie"}


@dataclasses.dataclass
class ClassifierState(object):
    """What the classifier remembers from one look to the next. Times (`*_t`, `start`) are the wait's:
    seconds since its first look; t0 and t_prev are snapshot clocks."""
    engine: str  # sglang or vllm; auto until a log line tells which
    t0: Optional[float] = None  # the first look's snapshot clock
    t_prev: Optional[float] = None  # the previous look's snapshot clock
    phase: Optional[str] = None  # the latest verdict's phase
    phases: List[Dict[str, Any]] = dataclasses.field(default_factory=list)  # [{phase, start, duration}]

    # The current run's log: lines before a run-start marker belong to an earlier run.
    marker_phase: Optional[str] = None  # the furthest phase the run's log markers reached
    marker_line: Optional[str] = None  # the line of the latest marker (a verdict's evidence)
    ready_hint: bool = False  # the engine logged that it is ready (the ready check still decides)
    tail: List[str] = dataclasses.field(default_factory=list)  # the run's last TAIL_LINES lines
    fatal: Optional[str] = None  # the run's first crash line
    fatal_waited: bool = False  # one more look was given to the traceback that names its cause
    rank_death_waited: bool = False  # one more look was given to the engine's own word on a dead rank
    listen_url: Optional[str] = None  # where the server logged that it listens
    status_phase: Optional[str] = None  # the phase a notify unit's launcher names in its STATUS=
    launcher_waiting: Optional[str] = None  # what the launcher waits for before it starts the engine (its turn)

    # Loading.
    shards: Optional[List[int]] = None  # [n, N] from the engine's progress bar
    load_t: Optional[float] = None  # when loading began
    load_read0: Optional[int] = None  # read_bytes before loading began (imports, libraries: no weights)
    read_samples: List[List[float]] = dataclasses.field(default_factory=list)  # [t, read_bytes] over RATE_WINDOW
    last_read_t: Optional[float] = None  # the latest look that read at least read_threshold bytes
    rchar_samples: List[List[float]] = dataclasses.field(default_factory=list)  # [t, rchar] over RATE_WINDOW
    # Since when the load has run far below the disk's measured rate (readiness/bottleneck.py).
    slow_load: bottleneck.SlowLoadWindow = dataclasses.field(default_factory=bottleneck.SlowLoadWindow)
    disk_loading_seen: bool = False  # some look did

    # The previous look's signals, to tell what changed.
    cpu_prev: Optional[float] = None  # the tree's CPU seconds
    read_prev: Optional[int] = None  # the tree's read_bytes
    gpu_prev: Dict[str, int] = dataclasses.field(default_factory=dict)  # str(GPU index) -> memory used, MiB
    http_prev: Optional[str] = None  # the HTTP answers in short (_http_signature)
    status_prev: Optional[str] = None  # the news in systemd's StatusText (status_news)
    pids_prev: Optional[List[int]] = None  # the server's processes

    # Progress.
    last_progress_t: Optional[float] = None  # the latest look that saw progress
    last_progress: Optional[str] = None  # what it saw, in words
    noncpu_progress_t: Optional[float] = None  # the latest look that saw progress other than CPU
    noncpu_progress: Optional[str] = None  # what it saw
    silent: bool = False  # the last look saw nothing move but (maybe) CPU: time to read the stacks
    spin_note: Optional[str] = None  # the busy-wait found at the last look, for messages
    completion_hung: bool = False  # the last look's completion timed out (see Classifier.completion_hung)

    # A systemd unit.
    main_pid: Optional[int] = None  # its MainPID once seen running
    nrestarts: Optional[int] = None  # its NRestarts at the first look
    seen_running: bool = False  # seen active, activating or reloading

    stacks: SpinTracker = dataclasses.field(default_factory=SpinTracker)  # the ranks' stacks
    transfers: TransferTracker = dataclasses.field(default_factory=TransferTracker)  # downloads, streams, RDMA
    # The ranks seen alive, by str(pid): {"rank", "comm"}, to name the one that dies.
    ranks_seen: Dict[str, Dict[str, Any]] = dataclasses.field(default_factory=dict)
    peers: PeerTracker = dataclasses.field(default_factory=PeerTracker)  # a multi-node group's other nodes
    xids: List[Dict[str, Any]] = dataclasses.field(default_factory=list)  # the kernel's Xid lines seen (Snapshot.xids)

    def new_run(self, line):
        """A run-start marker (`line`): what the log said of an earlier run no longer counts."""
        self.tail = []
        self.fatal = None
        self.fatal_waited = False
        self.shards = None
        self.marker_phase = STARTING
        self.marker_line = line
        self.ready_hint = False


class Classifier(object):
    def __init__(self, config):
        self.config = config
        self.state = ClassifierState(engine=config.engine)

    @property
    def completion_hung(self):
        """The last look's completion timed out, and it was the first to, or nothing moved since
        the one before: the next look may ask with a short timeout."""
        return bool(self.state.completion_hung)

    def stall_due(self):
        """The wait's clock (a snapshot's `t`) from which a look that sees nothing new declares the
        stall; None before the first look. The waiter puts a look there."""
        st = self.state
        if st.t0 is None or st.last_progress_t is None:
            return None
        return st.t0 + st.last_progress_t + self.config.stall_timeout

    def stacks_due(self, t):
        """Whether the look at `t` should read the ranks' stacks: the last look saw nothing move
        but (maybe) CPU, and the latest read is old enough: stacks_interval (0: every such look), or
        longer where the last read cost enough CPU to need it (spin.STACKS_CPU_SHARE); and the look at
        the stall's moment, when no recent read would name the ranks in its verdict."""
        st = self.state
        cfg = self.config
        if cfg.py_spy == "off" or st.t0 is None:
            return False
        # The look that may declare the stall reads them unless a recent read would be shown: a
        # "stalled" says where the ranks are also when no silent look came first (the first look's
        # log backlog was news, then its hung completion held it past the stall's moment).
        stall_due = self.stall_due()
        if stall_due is not None and t >= stall_due and not self._recent_stacks(t - st.t0):
            return True
        if not st.silent:
            return False
        last = st.stacks.read_t
        if last is None:
            return True
        return (t - st.t0) - last >= self._stacks_gap() * 0.9

    def _stacks_gap(self):
        return self.state.stacks.gap(self.config.stacks_interval, self.config.stall_timeout)

    # -- logs ---------------------------------------------------------------------------
    def _read_logs(self, lines, context):
        """Fold log lines into the state; return how many count as progress."""
        st = self.state
        # In a first read that may hold earlier runs, a crash line counts only after the
        # marker that starts a run (the current one, as far as the read shows).
        run_seen = not context
        progress = 0
        for line in lines:
            if st.engine == "auto":
                st.engine = engines.detect_engine(line) or "auto"
            kind, hint = engines.classify_line(st.engine, line)
            if kind == "probe":
                continue
            if kind == "run_start":
                run_seen = True
                st.new_run(line)
            st.tail = (st.tail + [line])[-TAIL_LINES:]
            if engines.listen_url(line):
                st.listen_url = engines.listen_url(line)
            if kind == "fatal" and run_seen and st.fatal is None:
                st.fatal = line
            if kind == "heartbeat":
                continue
            shards = engines.shard_progress(line)
            if shards is not None:
                if list(shards) != st.shards and not context:
                    progress += 1  # a redraw of the same n/N is no news
                st.shards = list(shards)
                hint = LOADING
                kind = "marker"
            elif not context:
                progress += 1
            if kind == "marker":
                if hint == engines.READY_HINT:
                    st.ready_hint = True
                    hint = INITIALIZING
                st.marker_phase = _later(hint, st.marker_phase or STARTING)
                st.marker_line = line
        return progress

    # -- the verdict --------------------------------------------------------------------
    def observe(self, snap):
        st = self.state
        cfg = self.config
        first = st.t0 is None
        if first:
            st.t0 = snap.t
        t = snap.t - st.t0
        proc = snap.process or {}
        if getattr(snap, "earlier_run", None):
            return self._earlier_run_stopping(t, snap)
        events = []

        st.xids = (st.xids + list(getattr(snap, "xids", None) or []))[-XIDS_KEPT:]
        self._read_logs(snap.log_context, context=True)
        new_lines = self._read_logs(snap.log_lines, context=False)
        if new_lines:
            events.append("%d new log line%s" % (new_lines, "" if new_lines == 1 else "s"))

        cpu_rate = self._cpu_rate(snap, proc)
        self._read_stacks(t, snap)
        spinning = self._spinning_cpu_rate(snap, proc)
        work_rate = None if cpu_rate is None else max(0.0, cpu_rate - spinning)
        if work_rate is not None and work_rate >= cfg.cpu_threshold:
            events.append("CPU %.2f cores" % work_rate)
        read_delta = self._read_delta(snap, proc)
        if read_delta is not None and read_delta >= cfg.read_threshold:
            events.append("read_bytes +%s" % _mib(read_delta))
            st.last_read_t = t
            st.disk_loading_seen = True
        arriving = self._transfer_events(t, snap, proc, events)
        gpu_changes = {}
        for gpu in snap.gpus:
            key = str(gpu["index"])
            prev = st.gpu_prev.get(key)
            used = gpu.get("memory_used_mib")
            if prev is not None and used is not None and abs(used - prev) >= cfg.gpu_memory_threshold:
                gpu_changes[key] = used - prev
            if used is not None:
                st.gpu_prev[key] = used
        if gpu_changes:
            biggest = max(gpu_changes.values(), key=abs)
            events.append("GPU memory %+d MiB on GPU %s" % (biggest, ",".join(sorted(gpu_changes, key=int))))
        gpu_rising = any(change > 0 for change in gpu_changes.values())
        pids = sorted(proc.get("pids") or [])
        if st.pids_prev is not None and pids != st.pids_prev:
            events.append("process tree changed (%d processes)" % len(pids))
        st.pids_prev = pids
        http_sig = self._http_signature(snap.http)
        if st.http_prev is not None and http_sig != st.http_prev:
            events.append("HTTP now %s" % http_sig)
        st.http_prev = http_sig
        status_text = (snap.unit or {}).get("StatusText")
        # Only the launcher's news is progress, not its stacks' age ("| TP0-7 in f (x.py:1) for 40s").
        news = status_news(status_text)
        if st.status_prev is not None and news != st.status_prev:
            events.append("systemd status %r" % status_text)
        st.status_prev = news
        st.status_phase = status_phase(status_text)
        # A launcher that waits for its turn on the GPUs (or a stopped instance's memory) has no engine
        # yet: its own clock bounds that wait, the other start's verdict ends it. Not a stall.
        starting_unit = (snap.unit or {}).get("ActiveState") == "activating"
        st.launcher_waiting = status_waiting(status_text) if starting_unit else None
        if st.launcher_waiting:
            events.append("the launcher is %s" % st.launcher_waiting)

        events += self._track_peers(t, snap.peers)

        self._track_reads(t, proc.get("read_bytes"), proc.get("rchar"))
        alive = self._alive(snap, proc)
        dead_ranks = self._track_ranks(proc)
        verdict = self._failure(snap, t, proc, alive, dead_ranks)
        if verdict is None:
            phase = self._phase(t, alive, read_delta, gpu_rising or arriving, work_rate, snap.http)
            if phase != st.phase:
                if st.phase is not None:
                    events.append("phase %s -> %s" % (st.phase, phase))
            if first or events:
                st.last_progress_t = t
                st.last_progress = "; ".join(events[:4]) if events else "first look"
            noncpu = [event for event in events if not event.startswith("CPU ")]
            if first or noncpu:
                st.noncpu_progress_t = t
                st.noncpu_progress = st.last_progress
            st.silent = not noncpu
            st.spin_note = None
            if spinning >= cfg.cpu_threshold and (work_rate or 0.0) < cfg.cpu_threshold:
                self._take_back_spun_cpu()
                st.spin_note = ("; the CPU (%.2f cores) goes to frames that have not moved, nor touched new "
                                "memory, since +%s" % (spinning, self._secs(st.stacks.moved())))
                # On a saturated host a rank may be starved rather than spinning: never call that a busy-wait.
                st.spin_note += ": a busy-wait, not work" if not _saturated(snap.load) else ""
            # A completion that timed out once is asked again with a short timeout (the waiter's
            # choice) while nothing else moves: a hung engine costs one full completion_timeout,
            # not one per look. Any progress, or an answer, gives the next one its full time again.
            timed_out = ((snap.http or {}).get("completion") or {}).get("kind") == "timeout"
            st.completion_hung = timed_out and not (st.completion_hung and events)
            verdict = self._verdict_for(phase, t, snap, proc, alive, cpu_rate)
        self._enter(verdict.phase, t)
        st.t_prev = snap.t
        return self._fill(verdict, t, snap, proc)

    def _earlier_run_stopping(self, t, snap):
        """A look while the run a restart replaces still stops (its drain serves on for up to
        model_service_drain_seconds): this start has not begun. Nothing of the stopping run is its
        story, and the wait for it is no stall: systemd bounds the stop (TimeoutStopSec)."""
        st = self.state
        earlier = snap.earlier_run
        st.last_progress_t = t
        st.last_progress = "the earlier run stopping"
        verdict = Verdict(NOT_STARTED, "not_started: the earlier run of %s (pid %s) is still stopping (%s); this "
                          "start begins when it ends" % (self.config.unit, earlier.get("pid") or "?", earlier.get("state")))
        self._enter(NOT_STARTED, t)
        st.t_prev = snap.t
        verdict = self._fill(verdict, t, snap, {})
        verdict.pid = None  # the stopping run's pid is not this start's
        return verdict

    # -- the ranks' stacks ----------------------------------------------------------------
    def _read_stacks(self, t, snap):
        """Fold a look's stack read, if it made one, into the record of who stands still."""
        sample = getattr(snap, "stacks", None)
        if sample is not None:
            alive = (snap.process or {}).get("pids") or []
            self.state.stacks.fold(t, sample, alive, self.config.fault_threshold)

    def _spinning_cpu_rate(self, snap, proc):
        """Cores burnt since the previous look by processes whose stacks stand still."""
        t_prev = self.state.t_prev
        elapsed = None if t_prev is None else snap.t - t_prev
        return self.state.stacks.spinning_cpu_rate(proc.get("cpu") or {}, elapsed)

    def _take_back_spun_cpu(self):
        """The tree's CPU went to frames that stand still: the progress it was counted as since
        the busy processes were last seen moving is taken back."""
        st = self.state
        moved = st.stacks.moved()
        floor = max(st.noncpu_progress_t or 0.0, moved)
        if st.last_progress_t is not None and st.last_progress_t > floor:
            st.last_progress_t = floor
            if floor == moved and moved > (st.noncpu_progress_t or 0.0):
                st.last_progress = "the busy ranks' stacks last moved or touched new memory"
            else:
                st.last_progress = st.noncpu_progress

    def _cpu_rate(self, snap, proc):
        st = self.state
        cpu = proc.get("cpu_seconds")
        rate = None
        if cpu is not None and st.cpu_prev is not None and st.t_prev is not None and snap.t > st.t_prev:
            rate = max(0.0, cpu - st.cpu_prev) / (snap.t - st.t_prev)
        if cpu is not None:
            st.cpu_prev = cpu
        return rate

    def _read_delta(self, snap, proc):
        st = self.state
        rbytes = proc.get("read_bytes")
        delta = None
        if rbytes is not None and st.read_prev is not None:
            delta = max(0, rbytes - st.read_prev)
        if rbytes is not None:
            st.read_prev = rbytes
        return delta

    def _track_reads(self, t, rbytes, rchar=None):
        if rchar is not None:
            self.state.rchar_samples = windowed(self.state.rchar_samples, t, rchar)
        if rbytes is None:
            return
        self.state.read_samples = windowed(self.state.read_samples, t, rbytes)

    def _bottleneck(self, t, verdict):
        """The slow-load line while loading runs far below the disk's measured rate for a while, else "".

        The load's rate is what the tree reads: from the disk (read_bytes) or with read() calls
        (rchar, which also counts reads served by the page cache), whichever is more. Which of the
        two moves tells the cause (bottleneck.cause); weights from the network are not the disk's.
        """
        st = self.state
        cfg = self.config
        # Rates over the window since loading began: the imports before it are no part of the load.
        began = st.load_t if st.load_t is not None else t
        read_bytes_rate = window_rate([sample for sample in st.read_samples if sample[0] >= began])
        rchar_rate = window_rate([sample for sample in st.rchar_samples if sample[0] >= began])
        loading = verdict.phase == LOADING and verdict.source is None and read_bytes_rate is not None
        load_rate = max(read_bytes_rate or 0.0, rchar_rate or 0.0) if loading else None
        slow_for = st.slow_load.observe(t, load_rate, cfg.disk_rate)
        if not loading:
            return ""
        return bottleneck.diagnose(load_rate, cfg.disk_rate, st.engine, read_bytes_rate=read_bytes_rate,
                                   rchar_rate=rchar_rate, slow_for=slow_for,
                                   tensor_parallel=cfg.tensor_parallel) or ""

    @staticmethod
    def _http_signature(http):
        if not http:
            return None
        parts = []
        for name in ("health", "models", "completion"):
            result = http.get(name)
            if result:
                parts.append("/%s %s" % (name, result["code"] if result["kind"] == "status" else result["kind"]))
        return ", ".join(parts)

    def _alive(self, snap, proc):
        if self.config.unit:
            unit = snap.unit or {}
            return unit.get("ActiveState") in ("active", "activating", "reloading") and bool(proc.get("alive", True))
        return bool(proc.get("alive"))

    # -- the other nodes of a multi-node group --------------------------------------------
    def _track_peers(self, t, connections):
        """A node joining is progress (see peers.py for joining and leaving)."""
        if not self.config.peers or connections is None:
            return []
        return ["node %s joined" % name for name in self.state.peers.observe(t, self.config.peers, connections)]

    def _peer_name(self, name):
        return "node %s (%s)" % (name, ", ".join(self.config.peers[name]))

    def _peer_notes(self):
        """What keeps the group from completing, for any verdict's message ("" when nothing)."""
        notes = []
        for name, peer in sorted(self.state.peers.nodes.items()):
            if peer.left_t is not None:
                notes.append("%s left the group at +%s" % (self._peer_name(name), self._secs(peer.left_t)))
            elif peer.joined_t is None:
                notes.append("%s has not joined the group (no connection on the dist-init port %d)"
                             % (self._peer_name(name), self.config.peer_port))
        return "".join("; " + note for note in notes)

    def _peer_left(self):
        left = self.state.peers.first_left()
        if left is None:
            return None
        when, name = left
        return Verdict(FAILED, "failed: %s left the group at +%s: its connections to the dist-init port %d closed, "
                       "and the nodes left wait in a collective that cannot complete without it; restart every "
                       "node of the group together" % (self._peer_name(name), self._secs(when), self.config.peer_port),
                       evidence=self._crash_evidence(), terminal=True)

    # -- failures -----------------------------------------------------------------------
    def _failure(self, snap, t, proc, alive, dead_ranks=()):
        st = self.state
        cfg = self.config
        holder = self._foreign_listener(snap, proc)
        # A server that died of "Address already in use" is best told who holds the port.
        held = ("; port %d is held by another process (pid %d, %s)" % (cfg.port(), holder["pid"], holder.get("comm") or "?")
                if holder else "")
        # Before the log's crash line: a GPU fault makes the engine fail too, and the fault is the cause.
        verdict = self._xid_failure()
        if verdict is not None:
            return verdict
        if cfg.unit and snap.crash_loop is not None:
            # Before the last run's own fatal line: the loop, not its last start, is the news.
            return self._crash_loop(snap)
        if st.fatal is not None:
            cause = engines.root_cause(st.tail, st.fatal)
            if cause[0] == st.fatal and alive and not st.fatal_waited:
                # No line names the cause yet: its traceback may arrive with the next look.
                st.fatal_waited = True
                return None
            if st.fatal not in cause:
                # The line that says which process failed (`[... TP2] Scheduler hit an exception:`).
                cause = cause[:1] + [st.fatal] + cause[1:]
            return Verdict(FAILED, "failed: the server logged a fatal error: %s%s%s"
                           % (cause[0].strip(), self._rank_death_note(dead_ranks, proc), held),
                           evidence=cause, terminal=True)
        if cfg.unit:
            verdict = self._unit_failure(snap, t)
            if verdict is not None:
                return verdict
        elif not alive:
            pid = proc.get("root_pid") or cfg.pid
            evidence = self._crash_evidence()
            # The exception it died of belongs in the message, not only in the evidence.
            cause = (": %s" % evidence[0].strip()[:300]
                     if evidence and engines.EXCEPTION_LINE.search(evidence[0]) else "")
            return Verdict(FAILED, "failed: process %s exited %s into the wait, in phase %s%s%s"
                           % (pid, self._secs(t), st.phase or STARTING, cause, held),
                           evidence=evidence, terminal=True)
        if dead_ranks and alive:
            # A rank died without a word in the log (the OOM killer): the others wait for it forever.
            # Its parent may still say which and why (SGLang's `Rank 0 scheduler is dead`), or exit:
            # one more look waits for that, as for a fatal line's traceback.
            if not st.rank_death_waited:
                st.rank_death_waited = True
                return None
            return Verdict(FAILED, "failed: %s %s into the wait, in phase %s, with no error in the log%s"
                           % (self._rank_death_note(dead_ranks, proc)[2:], self._secs(t), st.phase or STARTING, held),
                           evidence=self._crash_evidence(), terminal=True)
        # After this node's own end: a node whose engine died sees its connection gone too.
        left = self._peer_left()
        if left is not None:
            return left
        health = (snap.http or {}).get("health") or {}
        if st.engine == "vllm" and health.get("kind") == "status" and health.get("code") == 503:
            return Verdict(FAILED, "failed: vLLM's /health answers 503: its engine core is dead",
                           evidence=self._crash_evidence(), terminal=True)
        ours = proc.get("pids") or []
        if holder and ours:
            return Verdict(FAILED, "failed: port %d is held by another process (pid %d, %s), not by the "
                           "server's processes %s: stop it or change the port"
                           % (cfg.port(), holder["pid"], holder.get("comm") or "?", sorted(ours)[:8]),
                           evidence=self._crash_evidence(), terminal=True)
        return None

    def _xid_watched(self, record):
        """Whether an Xid names a GPU of this wait: any GPU when all are watched; with `gpus` given,
        only those (another GPU of a shared host may be another model's)."""
        if self.config.gpus is None:
            return True
        return record.get("gpu") is not None and record["gpu"] in self.config.gpus

    def _xid_failure(self):
        for record in self.state.xids:
            if xid.is_fatal(record["code"]) and self._xid_watched(record):
                meaning, _severity, action = xid.describe(record["code"])
                return Verdict(FAILED, "failed: %s reported Xid %d (%s): a fault of the GPU or its driver, not "
                               "of the engine; %s" % (_xid_gpu(record), record["code"], meaning, action),
                               evidence=[record["line"]] + self._crash_evidence(), terminal=True)
        return None

    def _xid_quotes(self):
        """The Xid lines that did not fail the wait, in words, for any verdict's evidence."""
        quotes = []
        for record in self.state.xids:
            meaning, severity, _action = xid.describe(record["code"])
            if severity == xid.FATAL and self._xid_watched(record):
                continue  # the failure's own evidence
            why = "not a watched GPU" if severity == xid.FATAL else severity
            quotes.append("kernel: %s [Xid %d on %s: %s; %s]"
                          % (record["line"], record["code"], _xid_gpu(record), meaning, why))
        return quotes[-XIDS_QUOTED:]

    def _track_ranks(self, proc):
        """The ranks seen alive at an earlier look that are gone now or zombies: [(str(pid), seen)]."""
        st = self.state
        states = proc.get("states") or {}
        comms = proc.get("comms") or {}
        living = set(key for key, state in states.items() if state not in ("Z", "X"))
        dead = [(key, seen) for key, seen in sorted(st.ranks_seen.items()) if key not in living]
        for key, rank in (proc.get("ranks") or {}).items():
            if key in living:
                st.ranks_seen[key] = {"rank": rank, "comm": comms.get(key)}
        return dead

    def _rank_death_note(self, dead_ranks, proc):
        """`; rank TP2 (pid 4242) died (exit status 1); still alive: ...`, or "" when no rank died."""
        if not dead_ranks:
            return ""
        exits = proc.get("exits") or {}
        died = ["rank TP%s (pid %s) died (%s)" % (seen["rank"], key, exit_words(exits.get(key)))
                for key, seen in dead_ranks]
        states = proc.get("states") or {}
        ranks = proc.get("ranks") or {}
        comms = proc.get("comms") or {}
        alive = ["TP%s (pid %s)" % (ranks[key], key) if key in ranks else "pid %s (%s)" % (key, comms.get(key) or "?")
                 for key in sorted(states, key=int) if states[key] not in ("Z", "X")]
        note = "; " + "; ".join(died)
        if alive:
            note += "; still alive: %s: they wait for it and cannot go on without it" % ", ".join(alive[:12])
        return note

    def _transfer_events(self, t, snap, proc, events):
        """Weights arriving by the network (a hub download, a streamed or an RDMA load): progress
        events; True when bytes of the weights arrived at this look."""
        st = self.state
        threshold = self.config.read_threshold
        transfers = st.transfers
        growth = transfers.fold(t, proc, snap.downloads, snap.ib_rcv_bytes)
        arriving = False
        # Any byte landing in a partial download is progress: a slow link must not look hung.
        if growth[DOWNLOAD]:
            download = transfers.download or {}
            events.append("download +%s (%s)" % (_mib(growth[DOWNLOAD]), _download_name(download)))
            transfers.arrived(t, DOWNLOAD)
            arriving = True
        elif growth[WRITTEN] is not None and growth[WRITTEN] >= threshold:
            events.append("written +%s" % _mib(growth[WRITTEN]))
        beyond_disk = growth[STREAM] is not None and growth[STREAM] >= threshold
        no_weight_file = proc.get("weight_files_open") == 0 and not transfers.downloaded()
        transfers.socket_looks = transfers.socket_looks + 1 if beyond_disk and no_weight_file else 0
        if beyond_disk:
            # A stream reads a socket, look after look, with no weight file open. Weight files open
            # (or just downloaded), or a burst such as Python's imports: the page cache.
            if transfers.socket_looks >= STREAM_LOOKS:
                events.append("socket reads +%s (rchar beyond read_bytes)" % _mib(growth[STREAM]))
                transfers.arrived(t, STREAM)
                arriving = True
            else:
                events.append("reads +%s from the page cache (rchar beyond read_bytes)" % _mib(growth[STREAM]))
                # Weights read back from the cache are loading; with no weight file open it may be
                # Python's imports: progress, but no sign of loading.
                arriving = arriving or bool(proc.get("weight_files_open")) or transfers.downloaded()
        # Received over InfiniBand: the host's ports count for every job, so only while loading.
        if growth[INFINIBAND] is not None and growth[INFINIBAND] >= threshold and st.phase in (STARTING, LOADING):
            events.append("InfiniBand received +%s" % _mib(growth[INFINIBAND]))
            transfers.arrived(t, INFINIBAND)
            arriving = True
        if arriving:
            st.last_read_t = t
            st.disk_loading_seen = True
        return arriving

    def _network_note(self, snap, t):
        """Why a stall looks like the network's: a download that stopped, for which file."""
        transfers = self.state.transfers
        files = (snap.downloads or {}).get("files") or []
        if not files or transfers.download is None:
            return ""
        download = transfers.download
        return ("; waiting on the network: the download of %s stopped at %s, no byte for %s"
                % (_download_name(download), _mib(download.get("bytes") or 0),
                   self._secs(t - (transfers.download_t or 0.0))))

    def _foreign_listener(self, snap, proc):
        """The first process outside the server's tree that listens on the URL's port, or None."""
        if not snap.listeners or not self.config.url_is_local():
            return None
        ours = set(proc.get("pids") or [])
        foreign = [o for o in snap.listeners if o.get("pid") is not None and o["pid"] not in ours]
        return foreign[0] if foreign else None

    def _unit_failure(self, snap, t):
        st = self.state
        unit = snap.unit
        if unit is None:
            return None
        name = self.config.unit
        if unit.get("LoadState") == "not-found":
            return Verdict(FAILED, "failed: unit %s does not exist" % name, terminal=True)
        running = unit.get("ActiveState") in ("active", "activating", "reloading")
        main_pid = unit.get("MainPID") or 0
        restarts = unit.get("NRestarts")
        if st.nrestarts is None and restarts is not None:
            st.nrestarts = restarts
        detail = "ActiveState=%s, SubState=%s, Result=%s, exit status %s" % (
            unit.get("ActiveState"), unit.get("SubState"), unit.get("Result"), unit.get("ExecMainStatus"))
        if unit.get("StatusText"):
            # A notify unit's last word, e.g. its launcher's "stalled: no progress for 600 s ...".
            detail += '; status "%s"' % unit["StatusText"][:300]
        if restarts is not None and st.nrestarts is not None and restarts > st.nrestarts:
            return Verdict(FAILED, "failed: unit %s restarted %d time(s) during the wait (NRestarts %s -> %s; %s): "
                           "its server crashed" % (name, restarts - st.nrestarts, st.nrestarts, restarts, detail),
                           evidence=self._crash_evidence(), terminal=True)
        if st.main_pid and main_pid and main_pid != st.main_pid:
            return Verdict(FAILED, "failed: unit %s's main process changed from %s to %s %s into the wait: "
                           "the server restarted (%s)" % (name, st.main_pid, main_pid, self._secs(t), detail),
                           evidence=self._crash_evidence(), terminal=True)
        if unit.get("SubState") == "auto-restart":
            return Verdict(FAILED, "failed: unit %s's process exited and systemd waits to restart it (%s)"
                           % (name, detail), evidence=self._crash_evidence(), terminal=True)
        if unit.get("ActiveState") == "failed":
            return Verdict(FAILED, "failed: unit %s failed (%s)" % (name, detail),
                           evidence=self._crash_evidence(), terminal=True)
        if not running and st.seen_running:
            return Verdict(FAILED, "failed: unit %s stopped %s into the wait (%s); a crash can exit 0"
                           % (name, self._secs(t), detail), evidence=self._crash_evidence(), terminal=True)
        if running:
            st.seen_running = True
            if main_pid and not st.main_pid:
                st.main_pid = main_pid
        return None

    def _crash_evidence(self):
        return engines.crash_evidence(self.state.tail)

    def _crash_loop(self, snap):
        """The verdict on a unit whose launcher stopped a crash loop (exit status 7), from its record."""
        record = snap.crash_loop
        stopped = record.get("stopped") or {}
        if stopped.get("message"):
            return Verdict(FAILED, "failed: %s (unit %s, exit status %s: restarting it would fail the same way)"
                           % (stopped["message"], self.config.unit, snap.unit.get("ExecMainStatus")),
                           evidence=list(record.get("evidence") or []) or self._crash_evidence(), terminal=True)
        why = record.get("error") or "it names no stopped loop"
        return Verdict(FAILED, "failed: crash loop: unit %s's launcher stopped a crash loop (exit status %s), but its "
                       "record of failed starts says no more (%s); see its journal"
                       % (self.config.unit, snap.unit.get("ExecMainStatus"), why),
                       evidence=self._crash_evidence(), terminal=True)

    # -- phases -------------------------------------------------------------------------
    def _phase(self, t, alive, read_delta, gpu_rising, cpu_rate, http):
        st = self.state
        cfg = self.config
        if not alive:
            return STARTING if st.launcher_waiting else NOT_STARTED
        phase = st.marker_phase or STARTING
        if st.status_phase:
            # A notify unit's launcher names the phase in its STATUS=: as good as a log marker.
            phase = _later(phase, st.status_phase)
        reading = read_delta is not None and read_delta >= cfg.read_threshold
        if phase == STARTING and (reading or gpu_rising) and self._silent_load_possible():
            phase = LOADING  # the log is silent, the disk or the GPUs are not
        if st.phase in PHASES:
            # The phases only move forward: a server that really restarts is a failure (a new
            # MainPID, NRestarts up, the watched pid gone), so a late run-start line is not one.
            phase = _later(phase, st.phase)
        if phase == LOADING and st.load_t is None:
            st.load_t = t
            # What the tree had read before loading began (imports, libraries) is not weights.
            st.load_read0 = None if st.read_prev is None else st.read_prev - (read_delta or 0)
        if phase == LOADING and self._load_done(t, cpu_rate):
            phase = INITIALIZING
        if http and http.get("listening"):
            phase = _later(phase, INITIALIZING)  # the port answers only after loading
        return phase

    def _silent_load_possible(self):
        """Whether disk reads or GPU memory may stand for loading that the log does not announce."""
        st = self.state
        if not (self.config.unit or self.config.log_path or self.config.follows_log):
            return True  # no log: only the disk and the GPUs can tell
        # Before the engine's first line of this run, its processes import Python and set up
        # CUDA (busy CPU, reads from a cold page cache): that is starting, not loading.
        return st.marker_phase is not None and st.engine not in engines.LOGS_LOAD_START

    def _load_done(self, t, cpu_rate):
        st = self.state
        cfg = self.config
        shards = st.shards
        if shards and shards[0] >= shards[1] > 0:
            return True
        rbytes = st.read_prev
        # The model's size read since loading began, and loading shown for a look at least: the
        # reads of the look it began in can still be imports, larger than a small model.
        if (cfg.expected_bytes and rbytes is not None and st.load_read0 is not None
                and st.phase == LOADING and rbytes - st.load_read0 >= cfg.expected_bytes):
            return True
        # Reading from disk happened and stopped a while ago, and the CPU still works: the
        # silent CPU-bound initialisation (kernel JIT, graph capture) has begun.
        return bool(st.disk_loading_seen and st.last_read_t is not None
                    and t - st.last_read_t >= cfg.load_quiet_window
                    and cpu_rate is not None and cpu_rate >= cfg.cpu_threshold)

    def _verdict_for(self, phase, t, snap, proc, alive, cpu_rate):
        st = self.state
        cfg = self.config
        http = snap.http or {}
        # A Type=notify unit is ready for systemd (and units ordered After= it) only once its
        # launcher sent READY=1; until then `ready` here would run ahead of `systemctl start`.
        awaiting_notify = self._awaiting_ready_notification(snap.unit)
        if http.get("ready") and alive and not awaiting_notify:
            return Verdict(READY, "ready after %s: %s" % (self._secs(t), self._ready_reason(http)),
                           evidence=[st.marker_line] if st.marker_line else [], terminal=False)
        quiet = t - st.last_progress_t
        notes = self._http_notes(http) + self._peer_notes()
        where = (st.spin_note or "") + self._where_note(t)
        if quiet >= cfg.stall_timeout or (cfg.timeout and t >= cfg.timeout):
            notes += self._network_note(snap, t) + _saturation_note(snap.load)
        if quiet >= cfg.stall_timeout:
            return Verdict(STALLED, "stalled: no progress for %s in phase %s (last progress: %s at +%s; %s)%s%s"
                           % (self._secs(quiet), phase, st.last_progress, self._secs(st.last_progress_t),
                              self._picture(snap, proc, cpu_rate), notes, where),
                           evidence=self._hang_evidence(http), terminal=True)
        if cfg.timeout and t >= cfg.timeout:
            return Verdict(TIMEOUT, "timeout: not ready after %s; in phase %s since +%s, last progress %s ago (%s); %s%s%s"
                           % (self._secs(t), phase, self._secs(self._phase_start(phase, t)),
                              self._secs(quiet), st.last_progress, self._picture(snap, proc, cpu_rate), notes, where),
                           evidence=self._hang_evidence(http), terminal=True)
        msg = "%s since +%s: %s" % (phase, self._secs(self._phase_start(phase, t)), self._picture(snap, proc, cpu_rate))
        if http.get("ready") and awaiting_notify:
            msg += "; the completion answers, the unit waits for its launcher's READY=1"
        if st.ready_hint:
            msg += "; the engine logged that it is ready but the %s check does not pass yet" % cfg.ready_check
        if st.launcher_waiting:
            msg += "; the launcher is %s" % st.launcher_waiting
        return Verdict(phase, msg + notes, evidence=[st.marker_line] if st.marker_line else [])

    def _recent_stacks(self, t):
        """The latest stack read's entries, when it is recent enough to say where the ranks are."""
        st = self.state
        stacks = st.stacks
        if stacks.read_t is None or not stacks.entries:
            return []
        # Reads are spaced by _stacks_gap() and fall on looks: the latest is that old plus up to a
        # poll, and one more poll while the look that reads it runs.
        # A read of an earlier phase says where the ranks were, not where they are. The verdict that
        # ends a phase (stalled, failed, timeout) is about that phase: its stacks stay.
        fresh = max(self._stacks_gap(), self.config.poll_interval) + 2 * self.config.poll_interval + 1
        starts = [entry["start"] for entry in st.phases if entry["phase"] in PHASES]
        this_phase = not starts or stacks.read_t >= starts[-1]
        return list(stacks.entries.values()) if t - stacks.read_t <= fresh and this_phase else []

    def _where_note(self, t):
        entries = self._recent_stacks(t)
        if not entries:
            return ""
        return "; the ranks' stacks: " + summarize(entries, self.state.stacks.read_t)

    @staticmethod
    def _awaiting_ready_notification(unit):
        unit = unit or {}
        return unit.get("Type") == "notify" and unit.get("ActiveState") == "activating"

    def _http_notes(self, http):
        """Why the HTTP answers cannot pass, when the reason is plain: a wrong port, a missing key."""
        notes = []
        logged = self.state.listen_url
        health = http.get("health") or {}
        if logged and health.get("kind") == "refused":
            try:
                logged_port = urlparse(logged).port
            except ValueError:
                logged_port = None
            if logged_port and logged_port != self.config.port():
                notes.append("the server logged that it listens on %s, not on port %d of the url: fix the url"
                             % (logged, self.config.port()))
        denied = [name for name in ("models", "completion")
                  if (http.get(name) or {}).get("kind") == "status" and http[name]["code"] in (401, 403)]
        if denied:
            notes.append("/%s answers %d: %s" % (denied[0], http[denied[0]]["code"],
                                                 "the api_key was refused" if self.config.api_key
                                                 else "the server wants an api_key"))
        return "".join("; " + note for note in notes)

    def _hang_evidence(self, http):
        """The last log lines, after a hung request's own account: a hung vLLM still answers /health."""
        evidence = self.state.tail[-10:]
        completion = http.get("completion") or {}
        if completion.get("kind") == "timeout":
            evidence = ["POST /v1/completions (model %r): %s, while GET /health answered %s"
                        % (http.get("model"), completion.get("error"), http_result(http.get("health")))] + evidence
        return evidence

    def _ready_reason(self, http):
        check = self.config.ready_check
        if check == "completion":
            return "a completion for model %r answered 200 with choices" % http.get("model")
        return "GET /%s answered 200" % ("health" if check == "health" else "v1/models")

    def _picture(self, snap, proc, cpu_rate):
        """What the signals show now, in words, for messages."""
        parts = []
        if cpu_rate is not None:
            parts.append("CPU %.2f cores" % cpu_rate)
        if proc.get("read_bytes") is not None:
            parts.append("read_bytes %s" % _mib(proc["read_bytes"]))
        if self.state.shards:
            parts.append("shards %d/%d" % tuple(self.state.shards))
        if snap.gpus:
            parts.append("GPU memory %s MiB, utilisation %s %%" % (
                "/".join(str(g.get("memory_used_mib")) for g in snap.gpus),
                "/".join(str(g.get("utilization")) for g in snap.gpus)))
        sig = self._http_signature(snap.http)
        if sig:
            parts.append("HTTP " + sig)
        odd = ["process %s state %s (%s)" % (pid, state, STATE_WORDS[state])
               for pid, state in sorted((proc.get("states") or {}).items()) if state in STATE_WORDS]
        parts.extend(odd[:4])
        return ", ".join(parts) or "no signals"

    # -- bookkeeping --------------------------------------------------------------------
    def _phase_start(self, phase, t):
        for entry in reversed(self.state.phases):
            if entry["phase"] == phase:
                return entry["start"]
        return t

    def _enter(self, phase, t):
        phases = self.state.phases
        if not phases or phases[-1]["phase"] != phase:
            phases.append({"phase": phase, "start": round(t, 1), "duration": 0.0})
        phases[-1]["duration"] = max(0.0, round(t - phases[-1]["start"], 1))  # start is rounded too
        self.state.phase = phase

    def _fill(self, verdict, t, snap, proc):
        st = self.state
        cfg = self.config
        verdict.since = self._phase_start(verdict.phase, t)
        verdict.bytes_read = proc.get("read_bytes")
        rate = window_rate(st.read_samples)
        if rate is not None:
            verdict.read_rate = round(rate, 1)
        verdict.shards = st.shards
        loaded = _rank(st.phase) > _rank(LOADING) if st.phase in PHASES else False
        if st.shards:
            verdict.fraction = round(float(st.shards[0]) / st.shards[1], 4) if st.shards[1] else None
        elif cfg.expected_bytes and verdict.bytes_read is not None:
            verdict.fraction = round(min(float(verdict.bytes_read) / cfg.expected_bytes, 0.99), 4)
        if loaded and verdict.fraction is not None:
            verdict.fraction = 1.0
        if st.phase == LOADING:
            verdict.eta = self._eta(t, verdict)
        verdict.gpu = [{"index": g["index"], "memory_used_mib": g.get("memory_used_mib"),
                        "utilization": g.get("utilization")} for g in snap.gpus]
        unit = snap.unit or {}
        if unit.get("NRestarts") is not None and st.nrestarts is not None:
            verdict.restarts = unit["NRestarts"] - st.nrestarts
        verdict.pid = unit.get("MainPID") or proc.get("root_pid") or cfg.pid
        verdict.engine = st.engine
        if st.last_progress_t is not None:
            verdict.last_progress = {"t": round(st.last_progress_t, 1), "what": st.last_progress}
        verdict.phases = copy.deepcopy(st.phases)
        entries = self._recent_stacks(t)
        verdict.stacks = st.stacks.shown(entries)
        verdict.where = summarize(entries, st.stacks.read_t, seconds=False, short=True) if entries else ""
        verdict.stacks_unavailable = st.stacks.unavailable or ""
        verdict.source = self._source(snap)
        verdict.bottleneck = self._bottleneck(t, verdict)
        if verdict.bottleneck:
            verdict.msg += "; " + verdict.bottleneck
        if verdict.phase == FAILED and entries and "; the ranks' stacks: " not in verdict.msg:
            verdict.msg += self._where_note(t)
        verdict.evidence = verdict.evidence + [q for q in self._xid_quotes() if q not in verdict.evidence]
        return verdict

    def _eta(self, t, verdict):
        cfg = self.config
        if cfg.expected_bytes and verdict.read_rate and verdict.bytes_read is not None:
            return round(max(0.0, cfg.expected_bytes - verdict.bytes_read) / verdict.read_rate, 1)
        shards = self.state.shards
        load_t = self.state.load_t
        if shards and shards[0] > 0 and load_t is not None and t > load_t:
            return round((t - load_t) / shards[0] * (shards[1] - shards[0]), 1)
        return None

    def _source(self, snap):
        """The network source of the weights while they arrive (a verdict's `source`), else None."""
        transfers = self.state.transfers
        if transfers.source is None or self.state.phase not in (STARTING, LOADING):
            return None
        if self.config.poll_interval and transfers.source_t is not None and \
                self._wait_t(snap) - transfers.source_t > 2 * self.config.poll_interval + 1:
            return None  # nothing came that way lately: it is not where the weights come from now
        if transfers.source == DOWNLOAD and not (snap.downloads or {}).get("files"):
            return None  # downloaded: what loads now comes from the cache's files
        source = {"kind": transfers.source, "bytes": transfers.totals[transfers.source],
                  "rate": None if transfers.rate() is None else round(transfers.rate(), 1),
                  "file": None, "expected": None}
        if transfers.source == DOWNLOAD:
            source["file"] = _download_name(transfers.download or {})
            source["expected"] = (snap.downloads or {}).get("expected")
        return source

    def _wait_t(self, snap):
        """A snapshot's time on the wait's clock (seconds since the first look)."""
        return snap.t - (self.state.t0 or 0.0)

    @staticmethod
    def _secs(seconds):
        return "%d s" % round(seconds)


# The kernel's Xid lines kept across looks, and quoted in a verdict's evidence.
XIDS_KEPT = 50
XIDS_QUOTED = 5


def _xid_gpu(record):
    """`GPU 3 (PCI 0000:41:00)`, or `the GPU at PCI 0000:41:00` when the driver could not say which."""
    if record.get("gpu") is None:
        return "the GPU at PCI %s" % record.get("pci")
    return "GPU %d (PCI %s)" % (record["gpu"], record.get("pci"))


# Looks in a row of reads beyond the disk with no weight file open before they are called a stream.
STREAM_LOOKS = 2


def _download_name(download):
    """`org/name model-00003-of-00064.safetensors`, or where the file's name is not on disk yet (the hub
    cache links it only once complete) its blob, short: `org/name blob 4bed0b2e3919`."""
    what = download.get("file")
    if not what and download.get("blob"):
        what = "blob " + download["blob"].split(".")[0][:12]
    return " ".join(part for part in (download.get("repo"), what) if part) or "a file"


# A host whose run queue holds this many runnable processes per core, or whose 1-minute load is
# that high, is saturated: its ranks wait for a CPU, which the stacks cannot tell from a spin.
SATURATED_PER_CORE = 2.0


def _saturated(load):
    if not load or not load.get("cores"):
        return False
    limit = SATURATED_PER_CORE * load["cores"]
    return (load.get("runnable") or 0) > limit or (load.get("load1") or 0.0) > limit


def _saturation_note(load):
    if not _saturated(load):
        return ""
    return ("; the host's CPUs are saturated (%d runnable, load %.1f on %d cores): the ranks may be starved "
            "of CPU rather than hung" % (load.get("runnable") or 0, load.get("load1") or 0.0, load["cores"]))
