"""The launcher's prefetch step (--prefetch auto|on|off): the model read into the page cache before
the engine starts.

Here, in the launcher, so that every start gets it, a systemd restart as much as a deploy's, and a
start that does not happen (a deploy that changes nothing restarts nothing) reads nothing. The step
runs inside the start's turn on its GPUs (launcher/gpu_turns.py), after the turn is taken and before the
engine process exists, so that two starts on the same GPUs never read their models at once; and a read
takes the host's disk turn (DiskTurn: one lock file beside the GPU turns', with --gpu-turns), so that two
starts on different GPUs of one host never read theirs at once either (each would halve the other's
rate and evict the other's pages; the second reads after the first, at the disk's whole rate):
  off   reads nothing and says nothing;
  on    reads every weight file (host/prefetch.py: parallel large reads, O_RDONLY only);
  auto  reads them only when the host's MemAvailable holds the model with a margin (else the read
        would evict its own first shards, or squeeze the engine) and the page cache does not hold
        it already: a restart on a warm cache reads nothing. The cache is seen with mincore where it
        tells the service user the truth (host/prefetch.py mincore_is_truthful), else by sampling
        with RWF_NOWAIT; where neither can (overlayfs) the reason says so and memory decides.
Whatever it decides it says once in the journal, with its reason. While it reads, systemd hears
  STATUS=starting: prefetching 12.0 GiB of 548.0 GiB (2%), 6.8 GB/s, ETA 1m18s
and EXTEND_TIMEOUT_USEC= each time bytes were read, never without: a read that stops moving lets
the unit's stall budget run out, and the step itself gives up after the wait's stall timeout.
For the readiness wait this is the launcher's own step before the engine exists, like its wait for
a turn on the GPUs (readiness/status.py status_waiting): the unit is `starting`, the wait's lines
end with "the launcher is prefetching ... ETA ...", and the launcher's own stall rule bounds it.
Not `loading`: counted as the load, the prefetch's reads would make up the model's size before the
engine read a byte (the wait's loading-done rule), and the wait, whose phases only move forward,
would call the engine's real load, from the page cache afterwards, initializing. A read error (a
damaged or truncated shard, EIO) or a stall ends the launcher with EXIT_PREFETCH and a message
naming the shard, recorded like any failed start (the crash-loop guard stops a repeated one).
"""
import os
import time

from ..common.errors import ModelWakeError
from ..common.formatting import duration, size
from ..host import prefetch, storage
from ..readiness.status import waiting_status
from .gpu_turns import TurnLocks, WaitingStatus, take_in_turn

MODES = ("auto", "on", "off")
LOG_EVERY = 10.0  # seconds between two progress lines in the journal (STATUS= follows every report)


def check_mode(options):
    """Raises ModelWakeError for a prefetch that cannot run: it needs the model directory."""
    if options.prefetch != "off" and not options.model_path:
        raise ModelWakeError("prefetch: %s needs --model-path (the model directory to read); give it or "
                             "use --prefetch off" % options.prefetch)
    if not options.prefetch_margin >= 1.0:
        raise ModelWakeError("prefetch-margin: must be 1.0 or more (MemAvailable / model size), got %s"
                             % options.prefetch_margin)


def cached_bytes(files):
    """(bytes of the model the page cache holds, None) or (None, why it cannot be known): mincore
    where it tells this user the truth, else one page in PROBES read with RWF_NOWAIT."""
    total = sum(length for _path, length in files)
    if all(prefetch.mincore_is_truthful(path) for path, _length in files):
        share = storage.page_cache_share([path for path, _length in files])
        if share["fraction"] is not None:
            return int(share["fraction"] * total), None
    fraction, why = prefetch.sampled_cache_fraction(files)
    if fraction is None:
        return None, ("mincore reports the cache only to a file's owner or writer, and %s" % why)
    return int(fraction * total), None


def decide(mode, files, margin, meminfo_path=storage.MEMINFO):
    """(read: bool, reason) for this start's files ([(path, size)])."""
    total = sum(length for _path, length in files)
    if not files:
        return False, "not prefetched: no *.safetensors files"
    if mode == "on":
        return True, "prefetching: the %s model, whatever memory and the page cache hold (prefetch: on)" % size(total)
    resident, unknown = cached_bytes(files)
    available = storage.memory_for_model(total, meminfo_path)["mem_available_bytes"] or None
    read, reason = prefetch.auto_decision(total, available, resident, margin=margin)
    if unknown:
        # Memory decides alone: reading a model the cache holds costs a read from memory, not the disk.
        reason += "; how much of it the page cache holds is unknown (%s)" % unknown
    return read, reason


DISK_TURN = "disk"  # the lock file disk.lock in the turns directory


def disk_turn_message(holder):
    """`waiting for the disk: sglang-a.service (pid 4242) is prefetching its model`."""
    if not holder:
        return "waiting for the disk: another start is prefetching its model"
    return "waiting for the disk: %s (pid %s) is prefetching its model" % (
        holder.get("unit") or "a process", holder.get("pid", "?"))


class DiskTurn(object):
    """The host's one turn to prefetch: `disk.lock` in the directory the GPU turns share (--gpu-turns),
    held from the first byte of a prefetch to its last. Without that directory there is no turn. A lock
    dies with its process: a killed launcher holds no turn."""

    def __init__(self, directory, unit, notifier, log, extend_seconds, clock=time.monotonic, sleep=time.sleep):
        self.directory = directory
        self.unit = unit
        self.notifier = notifier
        self.log = log
        self.extend_seconds = extend_seconds
        self.clock = clock
        self.sleep = sleep
        self.locks = None

    def take(self, stopping):
        """True once this start holds the disk (or goes without a turn), False when a stop came first."""
        if not self.directory:
            return True
        start, status = self.clock(), WaitingStatus(self.notifier, self.log, self.extend_seconds, self.clock)
        try:
            os.makedirs(self.directory, exist_ok=True)
            self.locks = TurnLocks(self.directory, [DISK_TURN], file_name="%s.lock")
            if not take_in_turn(self.locks, [DISK_TURN], stopping, lambda _key, holder: disk_turn_message(holder),
                                status.say, self.sleep):
                self.release()
                return False
        except OSError as exc:
            # A start is never refused for want of a lock file: it only reads without its turn.
            self.log("disk turn: cannot use %s (%s): prefetching without waiting for a turn" % (self.directory, exc))
            self.release()
            return True
        self.locks.write_holder(self.unit, os.getpid())
        if status.text is not None:
            self.log("took the disk after %s" % duration(self.clock() - start))
        return True

    def release(self):
        if self.locks is not None:
            self.locks.release()
            self.locks = None


class PrefetchStep(object):
    """One start's prefetch: run() returns True to go on with the engine's start, False when a stop
    was asked for meanwhile; raises prefetch.PrefetchError (a shard's read error, a stall)."""

    def __init__(self, options, notifier, log, stall_timeout, stopping=None, clock=time.monotonic,
                 meminfo_path=storage.MEMINFO, progress_interval=prefetch.PROGRESS_INTERVAL):
        self.options = options
        self.notifier = notifier
        self.log = log
        self.stall_timeout = stall_timeout
        self.stopping = stopping or (lambda: False)
        self.clock = clock
        self.meminfo_path = meminfo_path
        self.progress_interval = progress_interval
        self.last_bytes = 0
        self.last_progress_t = None
        self.last_log_t = None

    def run(self):
        mode = self.options.prefetch
        if mode == "off":
            return True
        try:
            files = storage.model_files(self.options.model_path)
        except OSError as exc:  # the engine says more about a missing model: its own start fails
            self._say("not prefetched: cannot list %s (%s)" % (self.options.model_path, exc.strerror or exc))
            return True
        read, reason = decide(mode, files, self.options.prefetch_margin, self.meminfo_path)
        if not read:
            self._say(reason)
            return True
        self.log(reason)
        turn = DiskTurn(self.options.gpu_turns, self.options.name, self.notifier, self.log, self.options.extend_timeout)
        if not turn.take(self.stopping):
            self.log("prefetch not begun: a stop was asked for while it waited for the disk")
            return False
        try:
            self.last_progress_t = self.last_log_t = self.clock()
            result = prefetch.prefetch(files, progress=self._progress, progress_interval=self.progress_interval,
                                       clock=self.clock, stopping=self.stopping)
        finally:
            turn.release()
        if result["stopped"]:
            self.log("prefetch stopped after %s: a stop was asked for" % size(result["bytes"]))
            return False
        self.log("prefetch done: %s in %s, %.1f GB/s, %d files: the page cache holds the model" % (
            size(result["bytes"]), duration(result["seconds"]), result["rate_bytes_per_s"] / 1e9, result["files"]))
        return True

    def _say(self, reason):
        """A decision not to read: in the journal, and in STATUS= until the engine's own phase follows."""
        self.log(reason)
        self.notifier.status("starting: " + reason)

    def _progress(self, report):
        """prefetch()'s progress hook, in the launcher's main thread."""
        now = self.clock()
        line = prefetch.progress_line(report)
        if report["bytes"] > self.last_bytes:
            # Bytes were read: news for systemd and the wait, and a new stall budget.
            self.last_bytes, self.last_progress_t = report["bytes"], now
            self.notifier.send("STATUS=" + waiting_status(line),
                               "EXTEND_TIMEOUT_USEC=%d" % int(self.options.extend_timeout * 1000000))
        elif now - self.last_progress_t >= self.stall_timeout:
            raise prefetch.PrefetchError("prefetch stalled: no byte read for %s (%s)" % (
                duration(now - self.last_progress_t), line))
        if now - self.last_log_t >= LOG_EVERY or report["fraction"] >= 1.0:
            self.last_log_t = now
            self.log(line)
