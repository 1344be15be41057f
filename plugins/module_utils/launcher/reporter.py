"""What systemd hears after each look of the wait: STATUS=, EXTEND_TIMEOUT_USEC= and READY=1."""
import time

from ..readiness.phases import READY
from ..readiness.status import format_status, one_line
from .textfile import prometheus_text, write_textfile

STATUS_EVERY = 30.0  # seconds: systemd shows how current a status is only by repeating it


class Reporter(object):
    """Decides, after each snapshot, what systemd hears. Clocks injected: no I/O of its own
    beyond the notifier and the optional textfile, so tests replay a start with a fake clock.
    clock is the monotonic one the wait runs on; wall_clock (time.time) is read once, here, only to
    date the phases for Prometheus: a later jump of the wall clock moves no phase."""

    def __init__(self, notifier, clock, extend_seconds, name="model", textfile=None, log=None,
                 status_every=STATUS_EVERY, wall_clock=time.time, expected_load=None, failed_starts=None,
                 starts=None):
        self.notifier = notifier
        self.clock = clock
        self.extend_seconds = extend_seconds
        self.name = name
        self.textfile = textfile
        self.expected_load = expected_load
        self.failed_starts = failed_starts or (lambda: None)  # the crash-loop guard's metrics()
        # () -> the start history's metrics (StartMemory.metrics) or None: the textfile's start durations.
        self.starts = starts or (lambda: None)
        self.log = log or (lambda text: None)
        self.status_every = status_every
        self.start = clock()
        self.wall_start = wall_clock()
        self.last_status = None
        self.last_status_at = None
        self.last_progress_t = None
        self.ready = False
        self.verdict = None
        self.errors = set()

    def _say_once(self, error):
        if error and error not in self.errors:
            self.errors.add(error)
            self.log(error)

    def on_snapshot(self, snap, verdict):
        """wait_for_ready's on_snapshot hook."""
        now = self.clock()
        self.verdict = verdict
        for error in snap.errors:  # a signal that could not be read (stacks, journal, GPUs): said once
            self._say_once(error)
        text = format_status(verdict, now - self.start)
        if verdict.phase == READY:
            if not self.ready:
                self.ready = True
                self.notifier.ready(text)
                self._say_once(self.notifier.error)
                self.log("%s (%s)" % (text, verdict.msg))
                self.last_status, self.last_status_at = text, now
        else:
            progress_t = (verdict.last_progress or {}).get("t")
            fields = []
            if text != self.last_status or now - self.last_status_at >= self.status_every:
                fields.append("STATUS=" + one_line(text))
                self.last_status, self.last_status_at = text, now
            if not verdict.terminal and progress_t is not None and progress_t != self.last_progress_t:
                # Progress since the last look: systemd may wait another full budget from now.
                fields.append("EXTEND_TIMEOUT_USEC=%d" % int(self.extend_seconds * 1000000))
                self.last_progress_t = progress_t
            if fields:
                self.notifier.send(*fields)
                self._say_once(self.notifier.error)
        if self.textfile:
            # verdict.since counts from the wait's start, which is this reporter's start.
            text = prometheus_text(self.name, verdict, self.wall_start + verdict.since, self.expected_load,
                                   self.failed_starts(), starts=self.starts())
            self._say_once(write_textfile(self.textfile, text))
