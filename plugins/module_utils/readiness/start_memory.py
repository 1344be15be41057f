"""A wait's use of the host's record of earlier starts (host/start_history.py, readiness/history.py):
loaded once at the wait's start, it gives the `auto` budgets, annotates each verdict with the usual
phase durations, the whole start's ETA and "slower than usual", and at the verdict adds this start
to the record — when this wait is the one that records it.

The classifier stays pure: this layer sits beside it in the waiter (waiter.py), after each look.

Who records a start: the launcher of a Type=notify unit (it sees every start from its beginning);
the module's wait only where no launcher runs the server (a Type=simple unit, or a pid with a record
file named) and only when it saw the start from its beginning. Records carry the unit's
InvocationID, so that two writers never record one start twice.
"""
import dataclasses
import os
import time

from ..common.errors import InputError
from ..host import start_history, systemd
from . import history
from .phases import NOT_STARTED, STARTING

# A start that read less than this share of the model from disk found it in the page cache; one that
# read nearly all of it did not. In between (or without the model's size) nobody can tell.
WARM_BELOW = 0.5
COLD_FROM = 0.9
# A wait that began this long after its unit's start (systemd's InactiveExitTimestampMonotonic) still
# saw the start from its beginning: `systemctl restart` returns, the play goes on to the wait.
JOINED_AFTER = 60.0


def page_cache(bytes_read, model_bytes):
    """warm / cold / None: how much of the weights this start had to read from the disk."""
    if not bytes_read or not model_bytes:
        return None
    share = float(bytes_read) / model_bytes
    return "warm" if share < WARM_BELOW else "cold" if share >= COLD_FROM else None


class StartMemory(object):
    """The record of `unit`'s starts at `path`, for one wait.

    writes: whether this wait records the start it sees ("launcher": always from its beginning;
    "wait": only when the start was seen from its beginning and no launcher runs the unit; None:
    never, it only reads). newest_version: an engine_version of None means the newest record's
    version (a status look, which does not know the venv), not an unknown one."""

    def __init__(self, path, unit, model, engine="auto", engine_version=None, model_bytes=None, gpus=None,
                 writes=None, wall_clock=time.time, newest_version=False, monotonic=time.monotonic):
        self.path = path
        self.unit = systemd.unit_name(unit)
        self.model = model
        self.engine = engine
        self.model_bytes = model_bytes
        self.gpus = gpus
        self.writes = writes
        self.wall_clock = wall_clock
        self.monotonic = monotonic  # the clock of systemd's *TimestampMonotonic (CLOCK_MONOTONIC)
        self.from_beginning = None
        self.records = start_history.read_records(path)
        mine = [r for r in self.records if r.get("unit") == self.unit]
        self.last = mine[-1] if mine else None
        if newest_version and engine_version is None and self.last is not None:
            engine_version = self.last.get("engine_version")
        self.engine_version = engine_version
        self.comparable = history.comparable(self.records, self.unit, engine_version, model)
        self.usual = history.usual_durations(self.comparable) or None
        self.observer = history.StartObserver()
        self.first_phase = None
        self.started_at = None
        self.invocation = None
        self.launcher_runs_it = False
        self.recorded = False
        self.slower_phases = []

    def budgets(self, default_stall, default_ready):
        return history.auto_budgets(self.comparable, default_stall, default_ready)

    def observe(self, t, snap, verdict):
        """After each look: annotate the verdict (in place) and sum the start up."""
        unit = snap.unit or {}
        if self.first_phase is None:
            self.first_phase = verdict.phase
            self.started_at = self.wall_clock() - t
            self.from_beginning = self._from_beginning(t, verdict, unit)
        if unit.get("InvocationID"):
            self.invocation = unit["InvocationID"]
        # A notify unit's main process is modelwake's launcher: it records its own starts.
        self.launcher_runs_it = unit.get("Type") == "notify"
        self.observer.observe(t, verdict)
        if self.usual:
            in_phase = max(0.0, t - verdict.since)
            verdict.usual = dict(self.usual)
            verdict.start_eta = history.whole_start_eta(self.usual, verdict.phase, in_phase, verdict.eta)
            slower = history.slower_than_usual(self.usual, verdict.phase, in_phase)
            if slower and verdict.phase not in self.slower_phases:
                self.slower_phases.append(verdict.phase)
            # While a phase runs late, and at the verdict when any phase of this start did.
            verdict.slower_than_usual = slower or (verdict.phase not in history.TIMED_PHASES
                                                   and bool(self.slower_phases))

    def _from_beginning(self, t, verdict, unit):
        """Whether the first look came at the start's beginning: before it (not started), or within
        JOINED_AFTER of the unit's start; without the unit's start time, when it was still starting."""
        if verdict.phase == NOT_STARTED:
            return True
        try:
            unit_started = int(unit.get("InactiveExitTimestampMonotonic")) / 1e6
        except (TypeError, ValueError):
            unit_started = 0
        if unit_started > 0:
            wait_started = self.monotonic() - t
            return wait_started - unit_started <= JOINED_AFTER
        return verdict.phase == STARTING

    def _records_this_start(self):
        if self.writes == "launcher":
            return True
        return self.writes == "wait" and not self.launcher_runs_it and bool(self.from_beginning)

    def end(self, verdict):
        """At the start's verdict (ready or terminal): add it to the record when this wait records it.
        Returns an error text, or None."""
        if self.recorded or not self.path or not self._records_this_start():
            return None
        self.recorded = True
        if self.invocation and any(r.get("invocation") == self.invocation for r in self.records):
            return None  # the launcher (or an earlier wait) recorded this start already
        host = {"gpus": self.gpus if self.gpus is not None else [g.get("index") for g in verdict.gpu],
                "page_cache": page_cache(verdict.bytes_read, self.model_bytes)}
        record = self.observer.record(self.unit, verdict.engine if verdict.engine != "auto" else self.engine,
                                      self.engine_version, self.model, self.model_bytes,
                                      round(self.started_at or self.wall_clock(), 1), host, self.invocation)
        record = history.with_totals(record, self.last)
        error = start_history.append_record(self.path, record)
        if error is None:
            self.records.append(record)
            self.last = record
        return error

    def result_fields(self):
        """For the wait's result: the unit's last recorded start (this one, once recorded)."""
        return {"last_start": history.summary(self.last)}

    def metrics(self):
        """For the Prometheus textfile: the last start's phases and the cumulative totals, or None."""
        if self.last is None:
            return None
        return {"last": dict((e["phase"], e["duration"]) for e in self.last.get("phases", [])),
                "totals": self.last.get("totals") or {}}


# The module's `history` option: the standard place for its unit, none, or a file named.
HISTORY_AUTO = "auto"
HISTORY_OFF = "off"


def module_memory(config, history_option, engine_version, root=None):
    """The StartMemory of a module's wait, or None. `auto`: in unit mode the unit's record under
    /var/lib/modelwake/<unit>/ (written only where that directory exists: the role's units have
    it); in pid mode none. `off`: none. A path: that file (its directory must exist)."""
    option = history_option or HISTORY_AUTO
    if option == HISTORY_OFF:
        return None
    if option == HISTORY_AUTO:
        if config.unit is None:
            return None
        path = start_history.history_path(systemd.state_dir(config.unit, root))
        writes = "wait" if os.path.isdir(os.path.dirname(path)) else None
    else:
        if not os.path.isabs(option):
            raise InputError("history", "must be auto, off or the absolute path of a record file, got %r" % option)
        if not os.path.isdir(os.path.dirname(option)):
            raise InputError("history", "the directory of %s does not exist" % option)
        path, writes = option, "wait"
    return StartMemory(path, config.unit or "pid", config.model_path or config.model, engine=config.engine,
                       engine_version=engine_version, model_bytes=config.expected_bytes, gpus=config.gpus,
                       writes=writes, newest_version=True)


def resolve_budgets(config, memory):
    """The config with its `auto` budgets resolved from the record (without one, the defaults), and
    the derivation in one line (None when nothing was `auto`). Fixed values are kept as given."""
    if not (config.stall_timeout_auto or config.timeout_auto):
        return config, None
    budgets = (memory.budgets(config.stall_timeout, config.timeout) if memory is not None
               else history.auto_budgets([], config.stall_timeout, config.timeout))
    changes = {"stall_timeout_auto": False, "timeout_auto": False}
    if config.stall_timeout_auto:
        changes["stall_timeout"] = budgets.stall_timeout
    if config.timeout_auto:
        changes["timeout"] = budgets.ready_timeout
    said = "auto budgets " + budgets.said(stall=config.stall_timeout_auto, ready=config.timeout_auto)
    if memory is None:
        said += " (the start history is off)"
    return dataclasses.replace(config, **changes), said
