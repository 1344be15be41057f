"""The launcher's crash-loop guard: it records each failed start's root cause in the unit's state
directory (host/failed_starts.py) and, after --crash-loop-starts failed starts in a row with the same
cause, ends the loop with EXIT_CRASH_LOOP, which the unit's RestartPreventExitStatus= honours.

systemd's own start limit (StartLimitBurst= in StartLimitIntervalSec=) never trips for a start that
fails after minutes of loading: Restart= would reload hundreds of GB again and again, for hours.
Counting across restarts takes a file, since each start is a new launcher. The record is the
launcher's convenience, never its condition: a directory it cannot write is said once and the
launcher goes on without the guard.
"""
from ..host import failed_starts
from ..readiness import engines


def root_cause(msg, evidence):
    """The failed start's cause: the evidence's first line when it names an exception (the root cause
    engines.crash_evidence puts first), else the verdict's message."""
    first = (evidence or [""])[0]
    if first and engines.EXCEPTION_LINE.search(first):
        return first.strip()
    return msg.strip()


class CrashLoopGuard(object):
    """One launcher run's view of the record. directory: the unit's state directory, None = off;
    limit: failed starts in a row with one cause that stop the loop (0 = record only); log: the
    launcher's log; wall_clock: time.time (the starts span restarts and reboots: only wall time
    dates them)."""

    def __init__(self, directory, limit, log, wall_clock):
        self.directory = directory
        self.limit = limit
        self.log = log
        self.wall_clock = wall_clock
        self.started = wall_clock()
        self.record = None
        if directory is None:
            return
        try:
            record = failed_starts.read_record(directory)
        except (OSError, ValueError) as exc:
            self.log("crash-loop record unreadable, starting a new one: %s" % exc)
            record = failed_starts.empty_record()
        if record.get("stopped"):
            # Someone started the unit again after the loop was stopped (a fix, a reboot): a new run.
            self.log("starting again after a stopped %s" % record["stopped"].get("message"))
            record = failed_starts.clear_run(record)
        self.record = record
        self._save()

    @property
    def enabled(self):
        return self.record is not None

    def metrics(self):
        """(failed starts ever, 1 when this run stopped a loop else 0) for the textfile, None when off."""
        if self.record is None:
            return None
        return (self.record["failed_starts_total"], 1 if self.record.get("stopped") else 0)

    def _save(self):
        try:
            failed_starts.write_record(self.directory, self.record)
        except OSError as exc:
            self.log("crash-loop record %s cannot be written, going on without crash-loop detection: %s"
                     % (failed_starts.record_path(self.directory), exc))
            self.record = None

    def reached_ready(self):
        """A start that reached ready ends any run of failures (only consecutive ones count)."""
        if self.record is not None and self.record.get("consecutive"):
            self.record = failed_starts.clear_run(self.record)
            self._save()

    def failed(self, msg, evidence, status):
        """Record the failed start this launcher is about to exit with `status`; return the status to exit
        with: EXIT_CRASH_LOOP and its message logged once the limit is reached, else `status`."""
        if self.record is None:
            return status
        cause = root_cause(msg, evidence)
        self.record = failed_starts.add_failure(self.record, cause, evidence or [], self.started,
                                                self.wall_clock(), status)
        count = self.record["consecutive"]
        if self.limit and count >= self.limit:
            self.record = failed_starts.mark_stopped(self.record, self.wall_clock())
            message = self.record["stopped"]["message"]
            self._save()
            self.log(message)
            self.log("exiting %d: the unit's RestartPreventExitStatus= ends the loop; the evidence stays in the "
                     "journal and in %s" % (failed_starts.EXIT_CRASH_LOOP, failed_starts.record_path(self.directory)))
            return failed_starts.EXIT_CRASH_LOOP
        self._save()
        if self.limit:
            self.log("failed start %d of %d in a row with this cause before the loop is stopped" % (count, self.limit))
        return status
