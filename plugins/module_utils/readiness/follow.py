"""One process per wait, followed over the connection: live progress without a module run per line.

A module cannot print while it runs, and starting a module again for every progress line would pay
the module's start (Python, Ansible's wrapper, the imports) each time: bench/REPORT.md ("The
module's own cost") measures that start against a whole wait. So the action plugin starts the
module once; the module checks its input, then leaves the whole wait to a detached process of its
own and returns. That process writes the wait's latest result after every look to a 0600 file,
atomically, and holds a FIFO open beside it. The controller follows with one shell command per
progress interval (FOLLOW_COMMAND): it blocks on the FIFO until the wait ends or the interval
passes, then prints the file. No Python starts on the host after the first; a finished wait wakes
the controller at once (the process writes a byte to the FIFO).

The FIFO is also the lease: the controller touches it on every read. A wait whose controller has
gone (the play interrupted, the controller's machine lost) ends by itself after LEASE_READS missed
reads, instead of looking for the rest of its timeout. Neither file holds the API key.
"""
import json
import os
import resource
import tempfile
import time
import traceback

from ..common.atomic import replace_file
from .engines import PROBE_ACCESS
from .phases import STARTING
from .waiter import wait_for_ready

FILE_VERSION = 1
ROOT_STATE_DIR = "/run/modelwake"
STATE_PREFIX = "modelwake-wait-"
BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"
LOG_LINE_CHARS = 160
# Reads the controller may miss before the wait ends itself, and the least time that is.
LEASE_READS = 4
LEASE_MIN_SECONDS = 120
# Once done, how long the process keeps the FIFO (and its wake-up byte) for the controller's last read.
LINGER_SECONDS = 60

# Run by the controller on the host, every interval: touch the lease, wait for the wake-up byte or the
# interval, then say the boot id and whether the process lives, then the file. POSIX sh and coreutils.
FOLLOW_COMMAND = ("touch -c {fifo} 2>/dev/null; timeout {interval} head -c 1 {fifo} >/dev/null 2>&1; "
                  "echo \"$(cat /proc/sys/kernel/random/boot_id 2>/dev/null) "
                  "$(kill -0 {pid} 2>/dev/null && echo running || echo gone)\"; cat {path} 2>/dev/null")
CLEANUP_COMMAND = "rm -f {path} {fifo}"


def boot_id(path=BOOT_ID_PATH):
    """The kernel's id of this boot: a wait never outlives one, and the controller tells a reboot by it."""
    try:
        with open(path) as handle:
            return handle.read().strip()
    except OSError:
        return None


def state_dir():
    """Where the wait's files live: /run/modelwake for root (a tmpfs, gone at a reboot), else the
    temporary directory."""
    if os.geteuid() == 0:
        try:
            os.makedirs(ROOT_STATE_DIR, mode=0o755, exist_ok=True)
            return ROOT_STATE_DIR
        except OSError:
            pass
    return tempfile.gettempdir()


class Progress(object):
    """What the controller's progress line needs beyond a look's verdict: the engine's latest log line,
    the expected bytes, the GPUs' total memory. Fed by wait_for_ready's on_snapshot."""

    def __init__(self, config, start, clock, budgets=None):
        self.config = config
        self.budgets = budgets
        self.start = start
        self.clock = clock
        self.log_line = None
        self.info = {}
        self.result = None

    def update(self, snap, verdict):
        # The access log's lines of the probes (this wait's own requests among them) are not the
        # engine's news: the line quoted is the engine's own, as the classifier counts progress.
        lines = [line.strip() for line in snap.log_lines if line.strip() and not PROBE_ACCESS.search(line)]
        if lines:
            self.log_line = lines[-1][:LOG_LINE_CHARS]
        totals = [g.get("memory_total_mib") for g in snap.gpus]
        self.info = {"log_line": self.log_line, "expected_bytes": self.config.expected_bytes,
                     "gpu_total_mib": sum(totals) if totals and None not in totals else None}
        if self.budgets:
            self.info["budgets"] = self.budgets  # the auto budgets' derivation: the controller says it once
        self.result = verdict.to_dict()
        del self.result["terminal"]
        self.result.update(elapsed=int(round(self.clock() - self.start)), failed=False)


def _write(path, data):
    """Atomically (the controller's cat never sees half a file), 0600 like mkstemp's files."""
    replace_file(path, json.dumps(data, sort_keys=True, default=str), mode=None)


class ControllerGone(Exception):
    """Raised inside the wait's look loop when the controller stopped following. Not a
    ModelWakeError: it is not reported to anyone but the file nobody reads any more."""


def start(config, probe, interval, clock=time.monotonic, lease_seconds=None, memory=None, budgets=None):
    """Start the wait in a detached process; return {"path", "fifo", "pid", "boot_id", "timeout"} for the
    controller (timeout: the wait's own budget, seconds, which bounds how long the controller looks again
    for a host that stopped answering). `probe` is built (the input is checked) before this is called. The wait ends by
    itself when no read came for `lease_seconds` (default: LEASE_READS intervals, at least
    LEASE_MIN_SECONDS). memory and budgets: the start history's (wait_for_ready's and the result's)."""
    lease = lease_seconds or max(LEASE_MIN_SECONDS, LEASE_READS * interval)
    directory = state_dir()
    fd, path = tempfile.mkstemp(prefix=STATE_PREFIX, suffix=".json", dir=directory)
    os.close(fd)
    fifo = path[:-len(".json")] + ".fifo"
    os.mkfifo(fifo, 0o600)
    boot = boot_id()
    began = clock()
    # The module's process so far: the interpreter, Ansible's wrapper, the imports, the input checks.
    startup_cpu_s = time.process_time()
    _write(path, {"version": FILE_VERSION, "done": False, "pid": None, "boot_id": boot,
                  "result": {"phase": STARTING, "elapsed": 0}, "info": {}})
    ready_read, ready_write = os.pipe()
    child = os.fork()
    if child == 0:
        # Double fork: the module's process exits, and the wait is nobody's child but init's.
        os.close(ready_read)
        os.setsid()
        if os.fork() != 0:
            os._exit(0)
        try:
            os.write(ready_write, str(os.getpid()).encode())
            os.close(ready_write)
            _detach()
            _run(config, probe, path, fifo, boot, began, lease, clock, startup_cpu_s, memory, budgets)
        finally:
            os._exit(0)
    os.close(ready_write)
    with os.fdopen(ready_read) as handle:
        pid = int(handle.read() or 0)
    os.waitpid(child, 0)
    return {"path": path, "fifo": fifo, "pid": pid, "boot_id": boot, "timeout": config.timeout}


def _detach():
    """Nothing of the connection's: its pipes must see EOF when the module's process exits."""
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    os.close(devnull)
    os.chdir("/")


def cost_report(probe, looks, startup_cpu_s):
    """The host's CPU for this wait, split: the module's start (its process, before the fork), this
    process's looks (of which GPU reads), and the programs it ran (journalctl, systemctl, py-spy,
    nvidia-smi). A forked process's counters start at zero."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {"startup_cpu_s": round(startup_cpu_s, 3), "looks": looks,
            "looks_cpu_s": round(time.process_time(), 3), "gpu_read_cpu_s": round(probe.gpu_cpu_s, 3),
            "programs_cpu_s": round(children.ru_utime + children.ru_stime, 3)}


def _run(config, probe, path, fifo, boot, began, lease, clock, startup_cpu_s, memory=None, budgets=None):
    wake = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)  # O_RDWR: never blocks, and keeps readers' open from blocking
    header = {"version": FILE_VERSION, "pid": os.getpid(), "boot_id": boot}
    progress = Progress(config, began, clock, budgets)
    looks = []

    def on_snapshot(snap, verdict):
        looks.append(snap.t)
        # The controller touches the FIFO on every read: its mtime is the lease.
        if time.time() - os.fstat(wake).st_mtime > lease:
            raise ControllerGone()
        progress.update(snap, verdict)
        _write(path, dict(header, done=False, result=progress.result, info=progress.info))

    try:
        result = wait_for_ready(config, probe, clock=clock, on_snapshot=on_snapshot, start=began, memory=memory)
        if budgets:
            result["budgets"] = budgets
    except ControllerGone:
        os.close(wake)
        for leftover in (path, fifo):
            if os.path.exists(leftover):
                os.unlink(leftover)
        return
    except Exception:  # a bug must still end the wait with a verdict, not with silence
        lines = traceback.format_exc().strip().splitlines()
        result = {"phase": "failed", "failed": True, "elapsed": int(round(clock() - began)),
                  "msg": "the wait failed on the host: %s" % lines[-1], "evidence": lines[-12:]}
    result["cost"] = cost_report(probe, len(looks), startup_cpu_s)
    _write(path, dict(header, done=True, result=result, info=progress.info))
    os.write(wake, b"x")
    # Keep the FIFO (and its byte) until the controller has read the result and removed the file.
    deadline = time.time() + LINGER_SECONDS
    while os.path.exists(path) and time.time() < deadline:
        time.sleep(0.2)
    os.close(wake)


def parse_read(stdout, follow):
    """The controller's side of FOLLOW_COMMAND's output: (state, data). state is "running", "done",
    "gone" (the process ended without a verdict) or "rebooted"; data is the file's content or None."""
    first, _newline, rest = stdout.partition("\n")
    words = first.split()
    current_boot = words[0] if len(words) == 2 else None
    running = bool(words) and words[-1] == "running"
    try:
        data = json.loads(rest) if rest.strip() else None
    except ValueError:
        data = None
    if data is not None and data.get("done"):
        return "done", data
    if current_boot and follow.get("boot_id") and current_boot != follow["boot_id"]:
        return "rebooted", data
    return ("running" if running else "gone"), data
