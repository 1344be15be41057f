"""The phase classifier: snapshots in, a verdict out. Pure: no I/O, no clock, no sleeping.

One look goes through four steps, each in its own module:
1. events.py     two looks -> events: bytes read or arriving, GPU memory moved, the tree changed, an
                 HTTP answer changed, log lines (markers, a crash line), a rank gone and how it ended.
2. rules.py      the terminal rules, one ordered table: the first FAILURE_RULES row whose evidence is
                 there ends the wait `failed` (a GPU's Xid, a stopped crash loop, a crash line, the unit
                 or the process gone, a rank dead, a node gone, vLLM's 503, the port held).
3. here          `ready` when the ready check passed while the server's own processes are alive; else
                 the phase machine: the latest log marker, refined by evidence (disk reads or GPU memory
                 rising = loading even when the log is silent; reading over and CPU busy =
                 initializing; the port answering = initializing). The phases only move forward.
4. rules.py      HANG_RULES: `stalled` after stall_timeout with no progress (judged here), `timeout` at
                 the overall deadline.
Words come from wording.py, a verdict's other fields from details.py.

The stall judgement: progress is any of tree CPU above cpu_threshold cores, read_bytes up by
read_threshold, GPU memory changed by gpu_memory_threshold MiB (NOT utilisation: a hung NCCL collective
spins the GPUs at 100 %), new log lines other than hang-time chatter, the process tree changing, the
phase changing, an HTTP answer changing, systemd's StatusText changing. A notify unit whose launcher
says it waits before it starts the engine (its turn on the GPUs: status.status_waiting) is starting,
never stalled: the launcher bounds that wait itself.

The hang that looks like work: CPU is progress only while it goes to code that moves. When the ranks'
stacks are read (py-spy, during silent looks), a busy process whose every Python frame is where it was
at the previous read, and which faulted in fewer than fault_threshold pages since, is spinning (a
busy-waiting collective: one core per rank, no memory touched); its CPU does not count, and the CPU it
burnt since its stack was first seen there is taken back, so the stall clock runs from the last read
that saw it move. Legitimate silent work from one call site (a layer-by-layer repack, one JIT'd kernel
per layer) looks the same from one read to the next but works on fresh buffers: its page faults keep
it progress. Without stacks, CPU counts as before.
"""
from . import engines, events as look_events, rules, wording
from .details import fill
from .phases import INITIALIZING, LOADING, NOT_STARTED, PHASES, READY, STARTING, later, order
from .stack_summary import summarize
from .state import ClassifierState
from .verdict import Verdict


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
        if self.config.py_spy == "off" or st.t0 is None:
            return False
        # The look that may declare the stall reads them unless a recent read would be shown: a
        # "stalled" says where the ranks are also when no silent look came first (the first look's
        # log backlog was news, then its hung completion held it past the stall's moment).
        stall_due = self.stall_due()
        if stall_due is not None and t >= stall_due and not self._recent_stacks(t - st.t0):
            return True
        if not st.silent:
            return False
        if st.stacks.read_t is None:
            return True
        return (t - st.t0) - st.stacks.read_t >= self._stacks_gap() * 0.9

    def _stacks_gap(self):
        return self.state.stacks.gap(self.config.stacks_interval, self.config.stall_timeout)

    # -- one look -----------------------------------------------------------------------------
    def observe(self, snap):
        st = self.state
        cfg = self.config
        first = st.t0 is None
        if first:
            st.t0 = snap.t
        t = snap.t - st.t0
        if snap.earlier_run:
            return self._earlier_run_stopping(t, snap)

        seen = look_events.read(st, cfg, snap, t)
        if snap.stacks is not None:
            st.stacks.fold(t, snap.stacks, snap.process.pids, cfg.fault_threshold)
        elapsed = None if st.t_prev is None else snap.t - st.t_prev
        spinning = st.stacks.spinning_cpu_rate(snap.process.cpu, elapsed)
        work_rate = None if seen.cpu_rate is None else max(0.0, seen.cpu_rate - spinning)
        progress = seen.progress(cfg, work_rate)
        for gone in st.ranks_gone:
            # Progress at a later look than the one that found it gone (whose tree change is the end itself).
            gone.went_on = gone.went_on or bool(progress and t > gone.t)
        look = rules.Look(t=t, snap=snap, state=st, config=cfg, alive=self._alive(snap),
                          progressed=bool(progress), cpu_rate=seen.cpu_rate)
        verdict = rules.judge(rules.FAILURE_RULES, look)
        if verdict is None:
            phase = self._phase(t, look.alive, seen, work_rate, snap.http)
            if phase != st.phase and st.phase is not None:
                progress.append("phase %s -> %s" % (st.phase, phase))
            self._judge_progress(t, first, progress, spinning, work_rate, snap)
            look.phase, look.quiet, look.where = phase, t - st.last_progress_t, self._where_note(t)
            verdict = self._ready(look) or rules.judge(rules.HANG_RULES, look) or self._in_phase(look)
            reached = phase
        else:
            reached = self._phase_the_log_reached()
        if not first and verdict.phase != reached and reached in PHASES and order(reached) > order(st.phase):
            # The look that ends a start it watched also saw it reach a later phase (a crash 2 s into loading,
            # between two looks; a ready check that passed at the first look in initializing): that phase is
            # the one the start reached, from between the two looks (where in between, no look can tell). A
            # first look that finds the end (a server already ready, a unit already failed) saw no phase.
            self._enter(reached, round((st.t_prev - st.t0 + t) / 2.0, 1))
        self._enter(verdict.phase, t)
        st.t_prev = snap.t
        return fill(verdict, st, cfg, t, snap, self._recent_stacks(t), self._where_note(t))

    def _judge_progress(self, t, first, progress, spinning, work_rate, snap):
        """The stall clock: this look's progress moves it, CPU spun in frames that stand still does not."""
        st = self.state
        cfg = self.config
        if first or progress:
            st.last_progress_t = t
            st.last_progress = "; ".join(progress[:4]) if progress else "first look"
        noncpu = [words for words in progress if not words.startswith("CPU ")]
        if first or noncpu:
            st.noncpu_progress_t = t
            st.noncpu_progress = st.last_progress
        st.silent = not noncpu
        st.spin_note = None
        if spinning >= cfg.cpu_threshold and (work_rate or 0.0) < cfg.cpu_threshold:
            self._take_back_spun_cpu()
            st.spin_note = ("; the CPU (%.2f cores) goes to frames that have not moved, nor touched new memory, "
                            "since +%s" % (spinning, wording.secs(st.stacks.moved())))
            # On a saturated host a rank may be starved rather than spinning: never call that a busy-wait.
            st.spin_note += ": a busy-wait, not work" if not wording.saturated(snap.load) else ""
        # A completion that timed out once is asked again with a short timeout (the waiter's choice)
        # while nothing else moves: a hung engine costs one full completion_timeout, not one per look.
        # Any progress, or an answer, gives the next one its full time again.
        timed_out = snap.http is not None and snap.http.completion is not None and snap.http.completion.kind == "timeout"
        st.completion_hung = timed_out and not (st.completion_hung and progress)

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
        verdict = fill(verdict, st, self.config, t, snap, self._recent_stacks(t), self._where_note(t))
        verdict.pid = None  # the stopping run's pid is not this start's
        return verdict

    def _alive(self, snap):
        proc = snap.process
        if self.config.unit:
            unit = snap.unit or {}
            return unit.get("ActiveState") in ("active", "activating", "reloading") and proc.alive is not False
        return bool(proc.alive)

    # -- the phase machine ----------------------------------------------------------------------
    def _phase(self, t, alive, seen, work_rate, http):
        st = self.state
        cfg = self.config
        if not alive:
            return STARTING if st.launcher_waiting else NOT_STARTED
        phase = st.marker_phase or STARTING
        if st.status_phase:
            # A notify unit's launcher names the phase in its STATUS=: as good as a log marker.
            phase = later(phase, st.status_phase)
        read_delta = seen.read_delta
        reading = read_delta is not None and read_delta >= cfg.read_threshold
        if phase == STARTING and (reading or seen.gpu_rising() or seen.arriving) and self._silent_load_possible():
            phase = LOADING  # the log is silent, the disk or the GPUs are not
        if st.phase in PHASES:
            # The phases only move forward: a server that really restarts is a failure (a new
            # MainPID, NRestarts up, the watched pid gone), so a late run-start line is not one.
            phase = later(phase, st.phase)
        if phase == LOADING and st.load_t is None:
            st.load_t = t
            # What the tree had read before loading began (imports, libraries) is not weights.
            st.load_read0 = None if st.read_prev is None else st.read_prev - (read_delta or 0)
        if phase == LOADING and self._load_done(t, work_rate):
            phase = INITIALIZING
        if http is not None and http.listening:
            phase = later(phase, INITIALIZING)  # the port answers only after loading
        return phase

    def _phase_the_log_reached(self):
        """The furthest phase the run's log markers and the launcher's STATUS= reached; None without either
        (a start that ended before it said anything reached no phase the look can name)."""
        st = self.state
        if st.marker_phase is None and st.status_phase is None:
            return None
        return later(st.marker_phase or STARTING, st.status_phase)

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

    def _ready(self, look):
        """`ready`: the ready check passed while the server runs; a Type=notify unit is ready for
        systemd (and units ordered After= it) only once its launcher sent READY=1."""
        http = look.snap.http
        if http is not None and http.ready and look.alive and not self._awaiting_ready_notification(look.snap.unit):
            st = self.state
            return Verdict(READY, "ready after %s: %s" % (wording.secs(look.t), wording.ready_reason(self.config, http)),
                           evidence=[st.marker_line] if st.marker_line else [])
        return None

    def _in_phase(self, look):
        st = self.state
        http = look.snap.http
        since = wording.secs(st.phase_start(look.phase, look.t))
        msg = "%s since +%s: %s" % (look.phase, since, wording.picture(st, look.snap, look.proc, look.cpu_rate))
        if http is not None and http.ready and self._awaiting_ready_notification(look.snap.unit):
            msg += "; the completion answers, the unit waits for its launcher's READY=1"
        if st.ready_hint:
            msg += "; the engine logged that it is ready but the %s check does not pass yet" % self.config.ready_check
        if st.launcher_waiting:
            msg += "; the launcher is %s" % st.launcher_waiting
        msg += wording.http_notes(st, self.config, http) + wording.peer_notes(st, self.config)
        return Verdict(look.phase, msg, evidence=[st.marker_line] if st.marker_line else [])

    @staticmethod
    def _awaiting_ready_notification(unit):
        unit = unit or {}
        return unit.get("Type") == "notify" and unit.get("ActiveState") == "activating"

    # -- the ranks' stacks, for messages --------------------------------------------------------
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

    def _enter(self, phase, t):
        phases = self.state.phases
        if not phases or phases[-1]["phase"] != phase:
            if phases:
                # The phase before lasted until this one began, not until its own last look: a start that
                # fails 5.8 s into `starting`, seen at its first look and then at the failure, was 5.8 s long.
                phases[-1]["duration"] = max(0.0, round(t - phases[-1]["start"], 1))
            phases.append({"phase": phase, "start": round(t, 1), "duration": 0.0})
        phases[-1]["duration"] = max(0.0, round(t - phases[-1]["start"], 1))  # start is rounded too
        self.state.phase = phase
