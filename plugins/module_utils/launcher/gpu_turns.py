"""Engines that share a host start one at a time per GPU: what the launcher does before it starts one.

vLLM sizes its KV cache from the free memory it sees while it profiles, so an engine that starts
while another loads on the same GPU, or while a stopped instance still releases its memory, sizes
itself wrong or fails (`Available KV cache memory: 1.59 GiB`, getainode/ainode PR #99; `Free memory
on device ... is less than desired GPU memory utilization`, llm-d-fast-model-actuation #709, #720);
SGLang "can't handle multiple servers loading weights simultaneously" (sglang PR #16756). So before
the engine starts the launcher
1. takes its turn: a lock file per GPU in a directory every unit shares (RuntimeDirectory=), locked
   with flock(2) in GPU order (two starts that want GPUs 0-1 and 1-0 never hold one each), held until
   the start's verdict (ready, failed, stalled) and written with the holder's unit and pid for the
   next one's message. A lock dies with its process: a crashed launcher holds no turn;
2. then waits until its GPUs show no memory held by a stopped instance: a process of this unit's
   previous run, of a unit that is not running (deactivating, inactive, failed), or of no unit and
   already exiting. A process of a running unit is a neighbour that shares the GPU on purpose (its
   start took its turn before): not waited for. The wait is bounded (--gpu-release-timeout); then the
   start fails naming the holders.
While it waits it says so in STATUS= (readiness/status.py waiting_status: the wait module shows it
and does not count the engine's silence as a stall) and renews systemd's start timeout.
"""
import dataclasses
import fcntl
import json
import os
import time
from typing import Optional

from ..common.command import run_command
from ..common.errors import ModelWakeError
from ..common.formatting import duration
from ..host import procfs
from ..host.gpu import GpuReader
from ..host.systemd import SystemdError, is_running, unit_properties
from ..readiness.phases import STARTING
from ..readiness.status import status_phase, waiting_status

POLL_SECONDS = 1.0  # a lock and a GPU's holders are cheap to look at; the wait ends soon after they change
SAY_EVERY = 10.0  # seconds between two STATUS= / EXTEND_TIMEOUT_USEC= with the same text
# A holder's unit, in the wait's words, by its ActiveState.
STOPPED_WORDS = {"deactivating": "stopping", "inactive": "stopped", "failed": "failed"}
LEFT_OVER = "left over from its previous run"


class GpuTurnError(ModelWakeError):
    """A stopped instance's GPU memory was not released in time."""


@dataclasses.dataclass
class Holder(object):
    """A process that holds memory on one GPU, with what tells a stopped instance from a neighbour."""
    gpu: int
    pid: int
    mib: Optional[int]  # None when the driver cannot tell
    unit: Optional[str]  # its systemd unit (cgroup), None outside any
    unit_state: Optional[str]  # the unit's ActiveState; None when unknown
    exiting: bool  # in exit() or a zombie: releasing what it holds
    reason: str = ""  # why the start waits for it (release_reason), once sorted

    def describe(self):
        return "pid %d (%s)" % (self.pid, ", ".join(part for part in (self.unit or "no unit", self.reason) if part))


def release_reason(holder, own_unit, own_pids):
    """Why the start waits for this holder's memory, in words, or None when it does not: a neighbour
    (a process of a running unit, or of none and alive) and a process it cannot place (its unit's state
    unknown) are not waited for; the next check is the engine's own."""
    if holder.pid in own_pids:
        return None
    if holder.unit is not None:
        if holder.unit == own_unit:
            return LEFT_OVER  # systemd stopped the previous run, a process of it still holds memory
        if holder.unit_state is None or is_running({"ActiveState": holder.unit_state}):
            return None
        return STOPPED_WORDS.get(holder.unit_state, holder.unit_state)
    return "exiting" if holder.exiting else None


def releasing(holders, own_unit, own_pids):
    """The holders the start waits for, by GPU then pid, each with its reason."""
    found = []
    for holder in sorted(holders, key=lambda h: (h.gpu, h.pid)):
        reason = release_reason(holder, own_unit, own_pids)
        if reason is not None:
            found.append(dataclasses.replace(holder, reason=reason))
    return found


def memory_message(waiting):
    """`waiting for GPU 2's memory to be released by pid 4242 (sglang-a.service, stopping)`, naming
    the first holder and counting the others."""
    first = waiting[0]
    text = "waiting for GPU %d's memory to be released by %s" % (first.gpu, first.describe())
    if len(waiting) > 1:
        text += " and %d more" % (len(waiting) - 1)
    return text


def turn_message(gpu, holder, holder_phase):
    """`waiting for its turn on GPU 2: sglang-a.service (pid 4242) is starting (loading)`."""
    if not holder:
        return "waiting for its turn on GPU %d: another start holds it" % gpu
    return "waiting for its turn on GPU %d: %s (pid %s) is %s" % (
        gpu, holder.get("unit") or "a process", holder.get("pid", "?"), holder_phase or "starting")


class TurnLocks(object):
    """Lock files in the shared directory, each holding the JSON {unit, pid} of the start that holds it:
    the per-GPU turns `gpu-<index>.lock`, and with file_name="%s.lock" the host's one disk turn
    (launcher/prefetch_step.py: `disk.lock`)."""

    def __init__(self, directory, gpus, file_name="gpu-%s.lock"):
        self.directory = directory
        self.gpus = sorted(gpus)
        self.file_name = file_name
        self.fds = {}  # GPU index (or the disk's key) -> open fd (locked or not yet)
        self.held = []  # GPU indices locked, in order

    def _fd(self, gpu):
        if gpu not in self.fds:
            path = os.path.join(self.directory, self.file_name % gpu)
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o660)
                try:
                    os.fchmod(fd, 0o660)  # past the umask: the service group's other units write it too
                except OSError:
                    pass  # another user's file, opened through the group's write permission
            except PermissionError:
                # Created by a unit of another user: a read-only fd locks all the same, it just
                # cannot write who holds the turn.
                fd = os.open(path, os.O_RDONLY)
            self.fds[gpu] = fd
        return self.fds[gpu]

    def try_take(self, gpu):
        """Lock the GPU's file without blocking: True when this process holds it now."""
        try:
            fcntl.flock(self._fd(gpu), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        self.held.append(gpu)
        return True

    def holder(self, gpu):
        """{unit, pid} of the start that holds the GPU's turn, or None when it did not say (yet)."""
        try:
            return json.loads(os.pread(self._fd(gpu), 4096, 0).decode("utf-8", "replace"))
        except (OSError, ValueError):
            return None

    def write_holder(self, unit, pid):
        text = json.dumps({"unit": unit, "pid": pid}).encode("utf-8")
        for gpu in self.held:
            try:
                os.ftruncate(self.fds[gpu], 0)
                os.pwrite(self.fds[gpu], text, 0)
            except OSError:
                pass  # a read-only fd (see _fd): the others' messages say "another start"

    def release(self):
        """Give the turn to the next start: closing the files drops their locks. The files it held are
        emptied first (still locked, so no one reads half of it): a finished start's name left in them
        would be read as the holder of the next turn until that start writes its own."""
        for gpu in self.held:
            try:
                os.ftruncate(self.fds[gpu], 0)
            except OSError:
                pass  # a read-only fd (see _fd)
        for fd in self.fds.values():
            os.close(fd)
        self.fds = {}
        self.held = []


class WaitingStatus(object):
    """What a start that waits for a turn tells systemd: STATUS= with the text and a renewed start timeout,
    at once when the text changes (also to the journal), else every SAY_EVERY seconds. The wait module
    reads that status as the launcher's wait, not as a stall (readiness/status.py)."""

    def __init__(self, notifier, log, extend_seconds, clock):
        self.notifier = notifier
        self.log = log
        self.extend_seconds = extend_seconds
        self.clock = clock
        self.text, self.at = None, None  # the last text said, and when

    def say(self, text):
        now = self.clock()
        if text != self.text:
            self.log(text)
        if text != self.text or now - self.at >= SAY_EVERY:
            self.notifier.send("STATUS=" + waiting_status(text),
                               "EXTEND_TIMEOUT_USEC=%d" % int(self.extend_seconds * 1000000))
            self.text, self.at = text, now


def take_in_turn(locks, keys, stopping, message, say, sleep):
    """Take each key's lock in order, waiting while another start holds it: True once all are held, False
    when stopping() says a stop came first. message(key, holder) is the waiting text, said through say()."""
    for key in keys:
        while not locks.try_take(key):
            if stopping():
                return False
            say(message(key, locks.holder(key)))
            sleep(POLL_SECONDS)
    return True


class GpuTurns(object):
    """One launch's turn on its GPUs. take() before the engine starts, release() at its verdict.

    `gpus`: the indices the engine uses (None: every GPU the reader finds); `directory`: the shared
    lock directory ("" or None: no turns, only the memory wait). Clock, sleep, the GPU reader, the
    command runner (systemctl) and /proc are injected for tests."""

    def __init__(self, gpus, directory, release_timeout, notifier, log, extend_seconds,
                 reader=None, runner=run_command, proc_root="/proc", clock=time.monotonic, sleep=time.sleep,
                 pid=None):
        self.directory = directory
        self.release_timeout = release_timeout
        self.notifier = notifier
        self.log = log
        self.extend_seconds = extend_seconds
        self.reader = reader if reader is not None else GpuReader(gpus=gpus, runner=runner)
        self.runner = runner
        self.proc_root = proc_root
        self.clock = clock
        self.sleep = sleep
        self.pid = os.getpid() if pid is None else pid
        unit = procfs.process_unit(self.pid, proc_root)
        # Only a service is "this unit": by hand the launcher runs in a login session's scope, whose
        # other processes are not a previous run of it.
        self.own_unit = unit if unit and unit.endswith(".service") else None
        self.locks = None
        self.status = WaitingStatus(notifier, log, extend_seconds, clock)
        self._holder_phase = (None, None, None)  # (the turn holder's unit, when asked, its phase in words)

    # -- what the host shows --------------------------------------------------------------
    def _unit_state(self, unit, cache):
        if unit not in cache:
            try:
                cache[unit] = unit_properties(unit, self.runner)
            except SystemdError:
                cache[unit] = {}
        return cache[unit]

    def holders(self, gpus):
        """The compute processes on `gpus` as Holders."""
        found = []
        units = {}
        try:
            processes = self.reader.compute_processes()
        except Exception as exc:  # a driver error (NvmlError): the start is not refused for a look
            self.log("GPU turns: cannot read the GPUs' processes (%s): not waiting for their memory" % exc)
            return []
        for proc in processes:
            if proc["index"] not in gpus:
                continue
            info = procfs.read_process(proc["pid"], self.proc_root)
            if info is None:
                continue  # gone since the driver answered (or in another pid namespace: not ours to judge)
            unit = procfs.process_unit(proc["pid"], self.proc_root)
            state = self._unit_state(unit, units).get("ActiveState") if unit else None
            found.append(Holder(gpu=proc["index"], pid=proc["pid"], mib=proc.get("used_memory_mib"), unit=unit,
                                unit_state=state, exiting=info["exiting"] or info["state"] in ("Z", "X")))
        return found

    def _turn_holder_phase(self, holder):
        """What the start that holds a turn is doing: its launcher's STATUS= phase, else its unit's state.
        Asked of systemd at most every SAY_EVERY seconds (the message changes no faster)."""
        unit = (holder or {}).get("unit")
        if not unit:
            return None
        asked_unit, asked_at, phase = self._holder_phase
        if unit == asked_unit and self.clock() - asked_at < SAY_EVERY:
            return phase
        props = self._unit_state(unit, {})
        phase = status_phase(props.get("StatusText"))
        if props.get("ActiveState") == "deactivating":
            words = "stopping"
        else:
            words = "starting (%s)" % phase if phase and phase != STARTING else None
        self._holder_phase = (unit, self.clock(), words)
        return words

    # -- what systemd hears ----------------------------------------------------------------
    # -- the wait ----------------------------------------------------------------------------
    def take(self, stopping):
        """Wait for the turn on every GPU, then for their memory; True when the engine may start,
        False when a stop arrived meanwhile (stopping() says so). Raises GpuTurnError when a stopped
        instance's memory is still held after release_timeout."""
        gpus = sorted(gpu["index"] for gpu in self.reader.read())
        if not gpus:
            return True  # no GPU (a CPU engine, a host without a driver): nothing to share
        start = self.clock()
        try:
            waited = self._wait_for_memory(gpus, stopping) if self._take_turns(gpus, stopping) else None
        except GpuTurnError:
            self.release()
            raise
        if waited is None:  # a stop arrived
            self.release()
            return False
        if self.clock() - start >= 1 or waited:
            self.log("took its turn on GPU %s after %s, no stopped instance's memory left: starting the engine"
                     % (",".join(map(str, gpus)), duration(self.clock() - start)))
        return True

    def _take_turns(self, gpus, stopping):
        """True once this start holds the turn on every GPU (or goes without one), False when stopped."""
        if not self.directory:
            return True
        try:
            os.makedirs(self.directory, exist_ok=True)
            self.locks = TurnLocks(self.directory, gpus)
            if not take_in_turn(self.locks, self.locks.gpus, stopping,
                                lambda gpu, holder: turn_message(gpu, holder, self._turn_holder_phase(holder)),
                                self.status.say, self.sleep):
                return False
        except OSError as exc:
            # A start is never refused for want of a lock file: it only goes without its turn.
            self.log("GPU turns: cannot use %s (%s): starting without waiting for a turn" % (self.directory, exc))
            self.release()
            return True
        self.locks.write_holder(self.own_unit, self.pid)
        return True

    def _wait_for_memory(self, gpus, stopping):
        """Seconds waited (0 when nothing was held), or None when a stop arrived."""
        start = self.clock()
        while True:
            waiting = releasing(self.holders(gpus), self.own_unit, {self.pid})
            waited = self.clock() - start
            if not waiting:
                return waited
            if waited >= self.release_timeout:
                held = "; ".join("GPU %d: %s, %s MiB" % (h.gpu, h.describe(), "?" if h.mib is None else h.mib)
                                 for h in waiting)
                raise GpuTurnError(
                    "GPU memory still held after %s by what a stopped instance left: %s. Find out why it does "
                    "not exit (its unit's journal, its state in ps), or give it longer: --gpu-release-timeout "
                    "(the role: model_service_timeout_stop_sec + 30 s)" % (duration(waited), held))
            if stopping():
                return None
            self.status.say(memory_message(waiting))
            self.sleep(POLL_SECONDS)

    def release(self):
        """The start's verdict is in (or it ends): the next start on these GPUs may go."""
        if self.locks is not None:
            self.locks.release()
            self.locks = None
