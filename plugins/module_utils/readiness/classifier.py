"""The phase classifier: snapshots in, a verdict out. Pure: no I/O, no clock, no sleeping.

"Why did it say stalled?" is answered here. The rules, in order:
1. failed   a crash signature in the log (root-cause line as evidence: when no line names the
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
phase changing, an HTTP answer changing, systemd's StatusText changing.

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

from ..common.formatting import mib as _mib
from ..host import http_probe
from . import engines
from .phases import FAILED, INITIALIZING, LOADING, NOT_STARTED, PHASES, READY, STALLED, STARTING, TIMEOUT
from .stack_summary import summarize
from .status import status_news, status_phase

TAIL_LINES = 200
# The ranks' stacks cost the host a py-spy run per Python process (~10-30 ms of CPU each, more for a
# large engine's ranks). Reads are spaced so that they take at most this share of one core, measured
# from the last read's own cost, but never more than STACKS_GAP_OF_STALL x stall_timeout apart, so a
# busy-spinning hang is still declared within a quarter of stall_timeout of its silent-hang bound.
STACKS_CPU_SHARE = 0.0025
STACKS_GAP_OF_STALL = 0.25
RATE_WINDOW = 60.0


@dataclasses.dataclass
class Verdict(object):
    phase: str
    msg: str
    evidence: List[str] = dataclasses.field(default_factory=list)
    terminal: bool = False
    since: float = 0.0  # when the current phase began (seconds since the wait began)
    bytes_read: Optional[int] = None
    read_rate: Optional[float] = None  # bytes/s over the last RATE_WINDOW seconds
    fraction: Optional[float] = None  # 0..1 of the weights loaded
    eta: Optional[float] = None  # seconds until loading ends, when it can be estimated
    shards: Optional[List[int]] = None  # [n, N] from the engine's progress bar
    gpu: List[Dict[str, Any]] = dataclasses.field(default_factory=list)
    restarts: int = 0
    pid: Optional[int] = None
    engine: str = "auto"
    last_progress: Optional[Dict[str, Any]] = None  # {"t", "what"}
    phases: List[Dict[str, Any]] = dataclasses.field(default_factory=list)
    # The ranks' stacks at the latest read, when it is recent: per process pid, name, rank, state,
    # thread, frames (innermost first) and same_for (seconds its stack has not changed).
    stacks: List[Dict[str, Any]] = dataclasses.field(default_factory=list)
    where: str = ""  # those stacks in one line (stack_summary.summarize)
    stacks_unavailable: str = ""  # why the latest read got no stacks (no py-spy, not permitted)

    def to_dict(self):
        return dataclasses.asdict(self)


def _rank(phase):
    return PHASES.index(phase) if phase in PHASES else -1


def _later(a, b):
    return a if _rank(a) >= _rank(b) else b


STATE_WORDS = {"T": "stopped", "t": "stopped by a tracer", "D": "in uninterruptible disk sleep", "Z": "a zombie"}


class Classifier(object):
    def __init__(self, config):
        self.config = config
        self.state = {
            "engine": config.engine,
            "t0": None, "t_prev": None,
            "phase": None, "phases": [],
            "marker_phase": None, "marker_line": None, "ready_hint": False,
            "shards": None, "load_t": None, "load_read0": None, "completion_hung": False,
            "cpu_prev": None, "read_prev": None, "gpu_prev": {}, "http_prev": None,
            "status_prev": None, "pids_prev": None,
            "last_progress_t": None, "last_progress": None,
            "read_samples": [], "last_read_t": None, "disk_loading_seen": False,
            "tail": [], "fatal": None, "fatal_waited": False,
            "main_pid": None, "nrestarts": None, "seen_running": False,
            "listen_url": None,
            # The ranks' stacks: per pid {sig, since (stack unchanged since), still_since (and no
            # pages faulted in since), still, name, rank, state, thread, frames}.
            "stacks": {}, "stacks_t": None, "stacks_cpu_s": 0.0, "stacks_unavailable": None, "silent": False, "spin_note": None,
            "cpu_pid_prev": {}, "noncpu_progress_t": None, "noncpu_progress": None,
            # Multi-node: per other node {conns (at the previous look), joined_t, left_t}.
            "peers": {},
        }

    @property
    def completion_hung(self):
        """The last look's completion timed out, and it was the first to, or nothing moved since
        the one before: the next look may ask with a short timeout."""
        return bool(self.state.get("completion_hung"))

    def stall_due(self):
        """The wait's clock (a snapshot's `t`) from which a look that sees nothing new declares the
        stall; None before the first look. The waiter puts a look there."""
        st = self.state
        if st["t0"] is None or st["last_progress_t"] is None:
            return None
        return st["t0"] + st["last_progress_t"] + self.config.stall_timeout

    def stacks_due(self, t):
        """Whether the look at `t` should read the ranks' stacks: the last look saw nothing move
        but (maybe) CPU, and the latest read is old enough: stacks_interval (0: every such look), or
        longer where the last read cost enough CPU to need it (STACKS_CPU_SHARE); and the look at
        the stall's moment, when no recent read would name the ranks in its verdict."""
        st = self.state
        cfg = self.config
        if cfg.py_spy == "off" or st["t0"] is None:
            return False
        # The look that may declare the stall reads them unless a recent read would be shown: a
        # "stalled" says where the ranks are also when no silent look came first (the first look's
        # log backlog was news, then its hung completion held it past the stall's moment).
        stall_due = self.stall_due()
        if stall_due is not None and t >= stall_due and not self._recent_stacks(t - st["t0"]):
            return True
        if not st["silent"]:
            return False
        last = st["stacks_t"]
        if last is None:
            return True
        return (t - st["t0"]) - last >= self._stacks_gap() * 0.9

    def _stacks_gap(self):
        """Seconds between two reads of the stacks: stacks_interval, or more where the last read cost
        enough CPU (STACKS_CPU_SHARE), never more than STACKS_GAP_OF_STALL x stall_timeout."""
        cfg = self.config
        gap = min(self.state["stacks_cpu_s"] / STACKS_CPU_SHARE, cfg.stall_timeout * STACKS_GAP_OF_STALL)
        return max(cfg.stacks_interval, gap)

    # -- logs ---------------------------------------------------------------------------
    def _read_logs(self, lines, context):
        """Fold log lines into the state; return how many count as progress."""
        st = self.state
        # In a first read that may hold earlier runs, a crash line counts only after the
        # marker that starts a run (the current one, as far as the read shows).
        run_seen = not context
        progress = 0
        for line in lines:
            if st["engine"] == "auto":
                st["engine"] = engines.detect_engine(line) or "auto"
            kind, hint = engines.classify_line(st["engine"], line)
            if kind == "probe":
                continue
            if kind == "run_start":
                run_seen = True
                st.update(tail=[], fatal=None, fatal_waited=False, shards=None, marker_phase=STARTING, marker_line=line,
                          ready_hint=False)
            st["tail"] = (st["tail"] + [line])[-TAIL_LINES:]
            if engines.listen_url(line):
                st["listen_url"] = engines.listen_url(line)
            if kind == "fatal" and run_seen and st["fatal"] is None:
                st["fatal"] = line
            if kind == "heartbeat":
                continue
            shards = engines.shard_progress(line)
            if shards is not None:
                if list(shards) != st["shards"] and not context:
                    progress += 1  # a redraw of the same n/N is no news
                st["shards"] = list(shards)
                hint = engines.LOADING
                kind = "marker"
            elif not context:
                progress += 1
            if kind == "marker":
                if hint == engines.READY_HINT:
                    st["ready_hint"] = True
                    hint = INITIALIZING
                st["marker_phase"] = _later(hint, st["marker_phase"] or STARTING)
                st["marker_line"] = line
        return progress

    # -- the verdict --------------------------------------------------------------------
    def observe(self, snap):
        st = self.state
        cfg = self.config
        first = st["t0"] is None
        if first:
            st["t0"] = snap.t
        t = snap.t - st["t0"]
        proc = snap.process or {}
        events = []

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
            st["last_read_t"] = t
            st["disk_loading_seen"] = True
        gpu_changes = {}
        for gpu in snap.gpus:
            key = str(gpu["index"])
            prev = st["gpu_prev"].get(key)
            used = gpu.get("memory_used_mib")
            if prev is not None and used is not None and abs(used - prev) >= cfg.gpu_memory_threshold:
                gpu_changes[key] = used - prev
            if used is not None:
                st["gpu_prev"][key] = used
        if gpu_changes:
            biggest = max(gpu_changes.values(), key=abs)
            events.append("GPU memory %+d MiB on GPU %s" % (biggest, ",".join(sorted(gpu_changes, key=int))))
        gpu_rising = any(change > 0 for change in gpu_changes.values())
        pids = sorted(proc.get("pids") or [])
        if st["pids_prev"] is not None and pids != st["pids_prev"]:
            events.append("process tree changed (%d processes)" % len(pids))
        st["pids_prev"] = pids
        http_sig = self._http_signature(snap.http)
        if st["http_prev"] is not None and http_sig != st["http_prev"]:
            events.append("HTTP now %s" % http_sig)
        st["http_prev"] = http_sig
        status_text = (snap.unit or {}).get("StatusText")
        # Only the launcher's news is progress, not its stacks' age ("| TP0-7 in f (x.py:1) for 40s").
        news = status_news(status_text)
        if st["status_prev"] is not None and news != st["status_prev"]:
            events.append("systemd status %r" % status_text)
        st["status_prev"] = news
        st["status_phase"] = status_phase(status_text)

        events += self._track_peers(t, snap.peers)

        self._track_reads(t, proc.get("read_bytes"))
        alive = self._alive(snap, proc)
        verdict = self._failure(snap, t, proc, alive)
        if verdict is None:
            phase = self._phase(t, alive, read_delta, gpu_rising, work_rate, snap.http)
            if phase != st["phase"]:
                if st["phase"] is not None:
                    events.append("phase %s -> %s" % (st["phase"], phase))
            if first or events:
                st["last_progress_t"] = t
                st["last_progress"] = "; ".join(events[:4]) if events else "first look"
            noncpu = [event for event in events if not event.startswith("CPU ")]
            if first or noncpu:
                st["noncpu_progress_t"] = t
                st["noncpu_progress"] = st["last_progress"]
            st["silent"] = not noncpu
            st["spin_note"] = None
            if spinning >= cfg.cpu_threshold and (work_rate or 0.0) < cfg.cpu_threshold:
                self._take_back_spun_cpu()
                st["spin_note"] = ("; the CPU (%.2f cores) goes to frames that have not moved, nor touched new "
                                   "memory, since +%s: a busy-wait, not work" % (spinning, self._secs(self._moved())))
            # A completion that timed out once is asked again with a short timeout (the waiter's
            # choice) while nothing else moves: a hung engine costs one full completion_timeout,
            # not one per look. Any progress, or an answer, gives the next one its full time again.
            timed_out = ((snap.http or {}).get("completion") or {}).get("kind") == "timeout"
            st["completion_hung"] = timed_out and not (st.get("completion_hung") and events)
            verdict = self._verdict_for(phase, t, snap, proc, alive, cpu_rate)
        self._enter(verdict.phase, t)
        st["t_prev"] = snap.t
        return self._fill(verdict, t, snap, proc)

    # -- the ranks' stacks ----------------------------------------------------------------
    def _read_stacks(self, t, snap):
        """Fold a stack read into the per-process state; `still` = unchanged and no fresh memory."""
        st = self.state
        sample = getattr(snap, "stacks", None)
        if sample is None:
            return
        st["stacks_t"] = t
        st["stacks_cpu_s"] = sample.get("cpu_s") or 0.0
        st["stacks_unavailable"] = sample.get("unavailable")
        seen = {}
        for proc in sample.get("processes") or []:
            key = str(proc["pid"])
            prev = st["stacks"].get(key)
            faults = proc.get("faults") or 0
            entry = {"name": proc.get("name"), "rank": proc.get("rank"), "state": proc.get("state"),
                     "thread": proc.get("thread"), "frames": proc.get("frames") or [], "sig": proc.get("signature"),
                     "faults": faults, "pid": proc["pid"]}
            function = entry["frames"][0][:2] if entry["frames"] else None
            # How long it has been in its innermost function: what `for 40s` says in the summary.
            entry["in_since"] = prev["in_since"] if prev is not None and prev.get("function") == function else t
            entry["function"] = function
            if prev is None or prev["sig"] != entry["sig"]:
                entry.update(since=t, still_since=t, faults0=faults, still=False)
            elif faults - prev["faults0"] >= self.config.fault_threshold:
                # The same frames, on fresh memory: a loop of long native calls at work.
                entry.update(since=prev["since"], still_since=t, faults0=faults, still=False)
            else:
                entry.update(since=prev["since"], still_since=prev["still_since"], faults0=prev["faults0"], still=True)
            seen[key] = entry
        # A live process whose read failed this time (py-spy timed out, the read raced a change)
        # keeps what the last read saw: a missed read is not a moved stack.
        alive = set(str(pid) for pid in (snap.process or {}).get("pids") or [])
        for key, prev in st["stacks"].items():
            if key not in seen and key in alive:
                seen[key] = prev
        st["stacks"] = seen

    def _moved(self):
        """When the processes that stand still were last seen moving (their latest still_since)."""
        return max(entry["still_since"] for entry in self.state["stacks"].values() if entry["still"])

    def _spinning_cpu_rate(self, snap, proc):
        """Cores burnt since the previous look by processes whose stacks stand still."""
        st = self.state
        cpu = proc.get("cpu") or {}
        prev = st["cpu_pid_prev"]
        st["cpu_pid_prev"] = dict(cpu)
        if st["t_prev"] is None or snap.t <= st["t_prev"]:
            return 0.0
        spun = sum(max(0.0, cpu[key] - prev[key]) for key, entry in st["stacks"].items()
                   if entry["still"] and key in cpu and key in prev)
        return spun / (snap.t - st["t_prev"])

    def _take_back_spun_cpu(self):
        """The tree's CPU went to frames that stand still: the progress it was counted as since
        the busy processes were last seen moving is taken back."""
        st = self.state
        moved = self._moved()
        floor = max(st["noncpu_progress_t"] or 0.0, moved)
        if st["last_progress_t"] is not None and st["last_progress_t"] > floor:
            st["last_progress_t"] = floor
            if floor == moved and moved > (st["noncpu_progress_t"] or 0.0):
                st["last_progress"] = "the busy ranks' stacks last moved or touched new memory"
            else:
                st["last_progress"] = st["noncpu_progress"]

    def _cpu_rate(self, snap, proc):
        st = self.state
        cpu = proc.get("cpu_seconds")
        rate = None
        if cpu is not None and st["cpu_prev"] is not None and st["t_prev"] is not None and snap.t > st["t_prev"]:
            rate = max(0.0, cpu - st["cpu_prev"]) / (snap.t - st["t_prev"])
        if cpu is not None:
            st["cpu_prev"] = cpu
        return rate

    def _read_delta(self, snap, proc):
        st = self.state
        rbytes = proc.get("read_bytes")
        delta = None
        if rbytes is not None and st["read_prev"] is not None:
            delta = max(0, rbytes - st["read_prev"])
        if rbytes is not None:
            st["read_prev"] = rbytes
        return delta

    def _track_reads(self, t, rbytes):
        if rbytes is None:
            return
        samples = self.state["read_samples"] + [[t, rbytes]]
        # Keep one sample at or before the window's start, so the rate spans the whole window.
        while len(samples) > 2 and samples[1][0] <= t - RATE_WINDOW:
            samples.pop(0)
        self.state["read_samples"] = samples

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
        """Who joined (progress) and who left, from each node's connections to the dist-init port.
        A node has left when none of the connections it had at the previous look remain: its
        engine's processes are gone (a new connection from it is a restarted engine that cannot
        join a group formed without it)."""
        if not self.config.peers or connections is None:
            return []
        events = []
        for name in self.config.peers:
            entry = self.state["peers"].setdefault(name, {"conns": [], "joined_t": None, "left_t": None})
            now = set(connections.get(name) or [])
            if entry["left_t"] is None:
                if entry["conns"] and not now & set(entry["conns"]):
                    entry["left_t"] = t
                elif now and entry["joined_t"] is None:
                    entry["joined_t"] = t
                    events.append("node %s joined" % name)
            entry["conns"] = sorted(now)
        return events

    def _peer_name(self, name):
        return "node %s (%s)" % (name, ", ".join(self.config.peers[name]))

    def _peer_notes(self):
        """What keeps the group from completing, for any verdict's message ("" when nothing)."""
        notes = []
        for name, entry in sorted(self.state["peers"].items()):
            if entry["left_t"] is not None:
                notes.append("%s left the group at +%s" % (self._peer_name(name), self._secs(entry["left_t"])))
            elif entry["joined_t"] is None:
                notes.append("%s has not joined the group (no connection on the dist-init port %d)"
                             % (self._peer_name(name), self.config.peer_port))
        return "".join("; " + note for note in notes)

    def _peer_left(self):
        left = [(entry["left_t"], name) for name, entry in self.state["peers"].items() if entry["left_t"] is not None]
        if not left:
            return None
        when, name = min(left)
        return Verdict(FAILED, "failed: %s left the group at +%s: its connections to the dist-init port %d closed, "
                       "and the nodes left wait in a collective that cannot complete without it; restart every "
                       "node of the group together" % (self._peer_name(name), self._secs(when), self.config.peer_port),
                       evidence=self._crash_evidence(), terminal=True)

    # -- failures -----------------------------------------------------------------------
    def _failure(self, snap, t, proc, alive):
        st = self.state
        cfg = self.config
        holder = self._foreign_listener(snap, proc)
        # A server that died of "Address already in use" is best told who holds the port.
        held = ("; port %d is held by another process (pid %d, %s)" % (cfg.port(), holder["pid"], holder.get("comm") or "?")
                if holder else "")
        if st["fatal"] is not None:
            cause = engines.root_cause(st["tail"], st["fatal"])
            if cause[0] == st["fatal"] and alive and not st["fatal_waited"]:
                # No line names the cause yet: its traceback may arrive with the next look.
                st["fatal_waited"] = True
                return None
            return Verdict(FAILED, "failed: the server logged a fatal error: %s%s" % (cause[0].strip(), held),
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
                           % (pid, self._secs(t), st["phase"] or STARTING, cause, held),
                           evidence=evidence, terminal=True)
        # After this node's own end: a node whose engine died sees its connection gone too.
        left = self._peer_left()
        if left is not None:
            return left
        health = (snap.http or {}).get("health") or {}
        if st["engine"] == "vllm" and health.get("kind") == "status" and health.get("code") == 503:
            return Verdict(FAILED, "failed: vLLM's /health answers 503: its engine core is dead",
                           evidence=self._crash_evidence(), terminal=True)
        ours = proc.get("pids") or []
        if holder and ours:
            return Verdict(FAILED, "failed: port %d is held by another process (pid %d, %s), not by the "
                           "server's processes %s: stop it or change the port"
                           % (cfg.port(), holder["pid"], holder.get("comm") or "?", sorted(ours)[:8]),
                           evidence=self._crash_evidence(), terminal=True)
        return None

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
        if st["nrestarts"] is None and restarts is not None:
            st["nrestarts"] = restarts
        detail = "ActiveState=%s, SubState=%s, Result=%s, exit status %s" % (
            unit.get("ActiveState"), unit.get("SubState"), unit.get("Result"), unit.get("ExecMainStatus"))
        if unit.get("StatusText"):
            # A notify unit's last word, e.g. its launcher's "stalled: no progress for 600 s ...".
            detail += '; status "%s"' % unit["StatusText"][:300]
        if restarts is not None and st["nrestarts"] is not None and restarts > st["nrestarts"]:
            return Verdict(FAILED, "failed: unit %s restarted %d time(s) during the wait (NRestarts %s -> %s; %s): "
                           "its server crashed" % (name, restarts - st["nrestarts"], st["nrestarts"], restarts, detail),
                           evidence=self._crash_evidence(), terminal=True)
        if st["main_pid"] and main_pid and main_pid != st["main_pid"]:
            return Verdict(FAILED, "failed: unit %s's main process changed from %s to %s %s into the wait: "
                           "the server restarted (%s)" % (name, st["main_pid"], main_pid, self._secs(t), detail),
                           evidence=self._crash_evidence(), terminal=True)
        if unit.get("SubState") == "auto-restart":
            return Verdict(FAILED, "failed: unit %s's process exited and systemd waits to restart it (%s)"
                           % (name, detail), evidence=self._crash_evidence(), terminal=True)
        if unit.get("ActiveState") == "failed":
            return Verdict(FAILED, "failed: unit %s failed (%s)" % (name, detail),
                           evidence=self._crash_evidence(), terminal=True)
        if not running and st["seen_running"]:
            return Verdict(FAILED, "failed: unit %s stopped %s into the wait (%s); a crash can exit 0"
                           % (name, self._secs(t), detail), evidence=self._crash_evidence(), terminal=True)
        if running:
            st["seen_running"] = True
            if main_pid and not st["main_pid"]:
                st["main_pid"] = main_pid
        return None

    def _crash_evidence(self):
        return engines.crash_evidence(self.state["tail"])

    # -- phases -------------------------------------------------------------------------
    def _phase(self, t, alive, read_delta, gpu_rising, cpu_rate, http):
        st = self.state
        cfg = self.config
        if not alive:
            return NOT_STARTED
        phase = st["marker_phase"] or STARTING
        if st.get("status_phase"):
            # A notify unit's launcher names the phase in its STATUS=: as good as a log marker.
            phase = _later(phase, st["status_phase"])
        reading = read_delta is not None and read_delta >= cfg.read_threshold
        if phase == STARTING and (reading or gpu_rising) and self._silent_load_possible():
            phase = LOADING  # the log is silent, the disk or the GPUs are not
        if st["phase"] in PHASES:
            # The phases only move forward: a server that really restarts is a failure (a new
            # MainPID, NRestarts up, the watched pid gone), so a late run-start line is not one.
            phase = _later(phase, st["phase"])
        if phase == LOADING and st["load_t"] is None:
            st["load_t"] = t
            # What the tree had read before loading began (imports, libraries) is not weights.
            st["load_read0"] = None if st["read_prev"] is None else st["read_prev"] - (read_delta or 0)
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
        return st["marker_phase"] is not None and st["engine"] not in engines.LOGS_LOAD_START

    def _load_done(self, t, cpu_rate):
        st = self.state
        cfg = self.config
        shards = st["shards"]
        if shards and shards[0] >= shards[1] > 0:
            return True
        rbytes = st["read_prev"]
        # The model's size read since loading began, and loading shown for a look at least: the
        # reads of the look it began in can still be imports, larger than a small model.
        if (cfg.expected_bytes and rbytes is not None and st.get("load_read0") is not None
                and st["phase"] == LOADING and rbytes - st["load_read0"] >= cfg.expected_bytes):
            return True
        # Reading from disk happened and stopped a while ago, and the CPU still works: the
        # silent CPU-bound initialisation (kernel JIT, graph capture) has begun.
        return bool(st["disk_loading_seen"] and st["last_read_t"] is not None
                    and t - st["last_read_t"] >= cfg.load_quiet_window
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
                           evidence=[st["marker_line"]] if st["marker_line"] else [], terminal=False)
        quiet = t - st["last_progress_t"]
        notes = self._http_notes(http) + self._peer_notes()
        where = (st.get("spin_note") or "") + self._where_note(t)
        if quiet >= cfg.stall_timeout:
            return Verdict(STALLED, "stalled: no progress for %s in phase %s (last progress: %s at +%s; %s)%s%s"
                           % (self._secs(quiet), phase, st["last_progress"], self._secs(st["last_progress_t"]),
                              self._picture(snap, proc, cpu_rate), notes, where),
                           evidence=self._hang_evidence(http), terminal=True)
        if cfg.timeout and t >= cfg.timeout:
            return Verdict(TIMEOUT, "timeout: not ready after %s; in phase %s since +%s, last progress %s ago (%s); %s%s%s"
                           % (self._secs(t), phase, self._secs(self._phase_start(phase, t)),
                              self._secs(quiet), st["last_progress"], self._picture(snap, proc, cpu_rate), notes, where),
                           evidence=self._hang_evidence(http), terminal=True)
        msg = "%s since +%s: %s" % (phase, self._secs(self._phase_start(phase, t)), self._picture(snap, proc, cpu_rate))
        if http.get("ready") and awaiting_notify:
            msg += "; the completion answers, the unit waits for its launcher's READY=1"
        if st["ready_hint"]:
            msg += "; the engine logged that it is ready but the %s check does not pass yet" % cfg.ready_check
        return Verdict(phase, msg + notes, evidence=[st["marker_line"]] if st["marker_line"] else [])

    def _recent_stacks(self, t):
        """The latest stack read's entries, when it is recent enough to say where the ranks are."""
        st = self.state
        if st["stacks_t"] is None or not st["stacks"]:
            return []
        # Reads are spaced by _stacks_gap() and fall on looks: the latest is that old plus up to a
        # poll, and one more poll while the look that reads it runs.
        # A read of an earlier phase says where the ranks were, not where they are. The verdict that
        # ends a phase (stalled, failed, timeout) is about that phase: its stacks stay.
        fresh = max(self._stacks_gap(), self.config.poll_interval) + 2 * self.config.poll_interval + 1
        starts = [entry["start"] for entry in st["phases"] if entry["phase"] in PHASES]
        this_phase = not starts or st["stacks_t"] >= starts[-1]
        return list(st["stacks"].values()) if t - st["stacks_t"] <= fresh and this_phase else []

    def _where_note(self, t):
        entries = self._recent_stacks(t)
        if not entries:
            return ""
        return "; the ranks' stacks: " + summarize(entries, self.state["stacks_t"])

    @staticmethod
    def _awaiting_ready_notification(unit):
        unit = unit or {}
        return unit.get("Type") == "notify" and unit.get("ActiveState") == "activating"

    def _http_notes(self, http):
        """Why the HTTP answers cannot pass, when the reason is plain: a wrong port, a missing key."""
        notes = []
        logged = self.state.get("listen_url")
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
        evidence = self.state["tail"][-10:]
        completion = http.get("completion") or {}
        if completion.get("kind") == "timeout":
            evidence = ["POST /v1/completions (model %r): %s, while GET /health answered %s"
                        % (http.get("model"), completion.get("error"), http_probe.describe(http.get("health")))] + evidence
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
        if self.state["shards"]:
            parts.append("shards %d/%d" % tuple(self.state["shards"]))
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
        for entry in reversed(self.state["phases"]):
            if entry["phase"] == phase:
                return entry["start"]
        return t

    def _enter(self, phase, t):
        phases = self.state["phases"]
        if not phases or phases[-1]["phase"] != phase:
            phases.append({"phase": phase, "start": round(t, 1), "duration": 0.0})
        phases[-1]["duration"] = max(0.0, round(t - phases[-1]["start"], 1))  # start is rounded too
        self.state["phase"] = phase

    def _fill(self, verdict, t, snap, proc):
        st = self.state
        cfg = self.config
        verdict.since = self._phase_start(verdict.phase, t)
        verdict.bytes_read = proc.get("read_bytes")
        samples = st["read_samples"]
        if len(samples) >= 2 and samples[-1][0] > samples[0][0]:
            verdict.read_rate = round((samples[-1][1] - samples[0][1]) / (samples[-1][0] - samples[0][0]), 1)
        verdict.shards = st["shards"]
        loaded = _rank(st["phase"]) > _rank(LOADING) if st["phase"] in PHASES else False
        if st["shards"]:
            verdict.fraction = round(float(st["shards"][0]) / st["shards"][1], 4) if st["shards"][1] else None
        elif cfg.expected_bytes and verdict.bytes_read is not None:
            verdict.fraction = round(min(float(verdict.bytes_read) / cfg.expected_bytes, 0.99), 4)
        if loaded and verdict.fraction is not None:
            verdict.fraction = 1.0
        if st["phase"] == LOADING:
            verdict.eta = self._eta(t, verdict)
        verdict.gpu = [{"index": g["index"], "memory_used_mib": g.get("memory_used_mib"),
                        "utilization": g.get("utilization")} for g in snap.gpus]
        unit = snap.unit or {}
        if unit.get("NRestarts") is not None and st["nrestarts"] is not None:
            verdict.restarts = unit["NRestarts"] - st["nrestarts"]
        verdict.pid = unit.get("MainPID") or proc.get("root_pid") or cfg.pid
        verdict.engine = st["engine"]
        if st["last_progress_t"] is not None:
            verdict.last_progress = {"t": round(st["last_progress_t"], 1), "what": st["last_progress"]}
        verdict.phases = copy.deepcopy(st["phases"])
        entries = self._recent_stacks(t)
        verdict.stacks = [{"pid": e["pid"], "name": e["name"], "rank": e["rank"], "state": e["state"],
                           "thread": e["thread"], "same_for": round(st["stacks_t"] - e["since"], 1),
                           "in_function_for": round(st["stacks_t"] - e["in_since"], 1),
                           "frames": [{"function": f[0], "file": f[1], "line": f[2]} for f in e["frames"]]}
                          for e in sorted(entries, key=lambda e: e["pid"])]
        verdict.where = summarize(entries, st["stacks_t"], seconds=False, short=True) if entries else ""
        verdict.stacks_unavailable = st["stacks_unavailable"] or ""
        if verdict.phase == FAILED and entries and "; the ranks' stacks: " not in verdict.msg:
            verdict.msg += self._where_note(t)
        return verdict

    def _eta(self, t, verdict):
        cfg = self.config
        if cfg.expected_bytes and verdict.read_rate and verdict.bytes_read is not None:
            return round(max(0.0, cfg.expected_bytes - verdict.bytes_read) / verdict.read_rate, 1)
        shards = self.state["shards"]
        load_t = self.state["load_t"]
        if shards and shards[0] > 0 and load_t is not None and t > load_t:
            return round((t - load_t) / shards[0] * (shards[1] - shards[0]), 1)
        return None

    @staticmethod
    def _secs(seconds):
        return "%d s" % round(seconds)
