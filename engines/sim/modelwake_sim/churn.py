"""`--churn KIND`: a healthy start whose process churn looks like a rank's death, then ready as usual.

Real engines make and end processes while they start, and some of those look like ranks to a
watcher that reads names loosely. Each kind is a negative control of the rule "a rank that died
fails the start" (SGLang mode; `--churn-seconds` S, default 4, sets how long each lasts):

- compile-workers: at the start of initialisation every rank runs WAVES waves of PER_WAVE short
  workers, as torch's compile workers are: in each wave some made by fork() without exec (they
  carry the rank's title, `sglang::scheduler_TP0`, and burn a little CPU) and one fork+exec'd
  fresh Python; each exits 0 and the rank reaps it before the next wave (the waves last S in all).
- loader-chain: before its schedulers start, the API process makes a process that titles itself
  `sglang::scheduler_TP0`, which forks a loader titled `loader_TP0` that reads the model's shards
  through mmap for S seconds with no log line; the loader exits 0, its parent reaps it and exits 0,
  the API process reaps that, and only then starts the real schedulers.
- helper-sigterm: at the start of initialisation every rank starts a GPU probe that hangs (exec'd,
  comm and argv[0] `nvidia-smi`, `--query-gpu=...`) and a check made by fork() without exec (the
  rank's title); after S seconds, its own timeout, the rank SIGTERMs both, reaps them and goes on.
- node-rank: with `--node-rank 0` on the command line (required), the API process forks a helper
  (the same command line, so the same `rank 0` in it) that lives S / 2 seconds and exits 1, a
  failed optional check; its parent reaps it.

`--churn-record PATH` proves the churn happened: one JSON line per churn child once it has ended
and been reaped, `{"churn": KIND, "pid", "parent", "made": "fork" | "fork+exec", "title": its
command line as a watcher reads it, "ended": "exit 0" | "signal 15 (SIGTERM)", "t": wall time}`
(faults.record; the rank a rankkill or rankreap fault kills is written there too).
"""
import mmap
import os
import signal
import sys
import threading
import time

from . import faults, ranks

KINDS = ("compile-workers", "loader-chain", "helper-sigterm", "node-rank")
DEFAULT_SECONDS = 4.0
WAVES = 3
PER_WAVE = 3  # of which the last is fork+exec'd, the others forked without exec
LOADER_TITLE = "loader_TP0"
PSEUDO_SCHEDULER_TITLE = "sglang::scheduler_TP0"
# The hanging GPU probe: a Python that calls itself nvidia-smi (argv[0] and comm) and sleeps until killed.
PROBE_CODE = "import time; open('/proc/self/comm', 'w').write('nvidia-smi'); time.sleep(3600)"
PROBE_ARGS = ["--query-gpu=index,memory.used,utilization.gpu", "--format=csv,noheader,nounits"]
HELPER_EXIT = 1
MIB = 1024 * 1024


def own_cmdline():
    """This process's command line as a watcher reads it (/proc/self/cmdline, NULs as spaces): after
    set_title, the title alone. A child made by fork() without exec shows exactly this."""
    with open("/proc/self/cmdline", "rb") as handle:
        return " ".join(arg.decode("utf-8", "replace") for arg in handle.read().split(b"\0") if arg)


def fork_child(body):
    """fork() without exec: the child keeps the parent's title and command line, runs body() with
    the default signal dispositions (a rank's SIGTERM handler would end it with exit 0 and tidy the
    rank's GPU holder) and exits with body()'s return value (None: 0)."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            code = body() or 0
        finally:
            os._exit(code)
    return pid


def exec_child(argv0, args):
    """fork+exec of this Python with argv[0] `argv0` and `args` (`-c CODE ...`), no file needed."""
    pid = os.fork()
    if pid == 0:
        try:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.execv(sys.executable, [argv0] + list(args))
        finally:
            os._exit(127)
    return pid


def reap(pid, path, kind, made, title):
    """Wait for one churn child and record how it ended."""
    _, status = os.waitpid(pid, 0)
    faults.record(path, churn=kind, pid=pid, parent=os.getpid(), made=made, title=title, ended=faults.ended(status))


def reap_later(pid, path, **fields):
    """A thread of the API process reaps `pid` as soon as it ends and records it; nothing else hears of
    it (a launcher's SIGCHLD handler that reaps whatever ended and moves on)."""
    def wait():
        _, status = os.waitpid(pid, 0)
        faults.record(path, pid=pid, parent=os.getpid(), ended=faults.ended(status), **fields)
    thread = threading.Thread(target=wait, daemon=True)
    thread.start()
    return thread


def _burn_then_sleep(seconds, busy_share=0.3):
    """A compile worker: some CPU (so its reaped time shows in the rank's counters), then idle."""
    end = time.monotonic() + seconds * busy_share
    while time.monotonic() < end:
        for _ in range(2000):
            pass
    time.sleep(max(0.0, seconds * (1 - busy_share)))


# --- in a rank, at the start of its initialisation -------------------------------------------------
def in_rank(rank, opts):
    """The rank's own churn kinds, in order; returns when they are over (every child reaped)."""
    if "compile-workers" in opts.churn:
        compile_workers(rank, opts.churn_seconds, opts.churn_record)
    if "helper-sigterm" in opts.churn:
        helper_sigterm(rank, opts.churn_seconds, opts.churn_record)


def compile_workers(rank, seconds, path):
    life = seconds / WAVES
    code = "import time\nend = time.monotonic() + %.2f\nwhile time.monotonic() < end: pass" % (life * 0.3)
    for _ in range(WAVES):
        started = []
        for number in range(PER_WAVE):
            if number < PER_WAVE - 1:
                started.append((fork_child(lambda: _burn_then_sleep(life)), "fork", rank.title))
            else:
                started.append((exec_child(sys.executable, ["-c", code]), "fork+exec",
                                " ".join([sys.executable, "-c"] + code.split())))
        rank.children.extend(pid for pid, _, _ in started)  # a SIGTERM of the rank takes them too
        for pid, made, title in started:
            reap(pid, path, "compile-workers", made, title)
            rank.children.remove(pid)
        if rank.parent_gone():
            os._exit(1)


def helper_sigterm(rank, seconds, path):
    probe = exec_child("nvidia-smi", ["-c", PROBE_CODE] + PROBE_ARGS)
    check = fork_child(lambda: time.sleep(3600))
    rank.children.extend((probe, check))
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if rank.parent_gone():
            os._exit(1)
        time.sleep(min(0.2, max(0.0, end - time.monotonic())))
    # The rank's own timeout: it ends both on purpose and goes on.
    for pid in (probe, check):
        os.kill(pid, signal.SIGTERM)
    reap(probe, path, "helper-sigterm", "fork+exec", " ".join(["nvidia-smi", "-c", PROBE_CODE] + PROBE_ARGS))
    reap(check, path, "helper-sigterm", "fork", rank.title)
    for pid in (probe, check):
        rank.children.remove(pid)


# --- in the API process ------------------------------------------------------------------------------
def loader_chain(opts):
    """Before the schedulers: a pseudo-scheduler and its loader, both gone (exit 0, reaped) before the
    real ranks start. The API process waits for the chain, as a launcher waits for a pre-load step."""
    def scheduler():
        ranks.set_title(PSEUDO_SCHEDULER_TITLE)
        loader = fork_child(lambda: _load(opts.model_path, opts.churn_seconds))
        reap(loader, opts.churn_record, "loader-chain", "fork", LOADER_TITLE)
        return 0

    pid = fork_child(scheduler)
    reap(pid, opts.churn_record, "loader-chain", "fork", PSEUDO_SCHEDULER_TITLE)


def _load(model_path, seconds):
    """The loader: the shards through mmap, paced to last `seconds` (or cut off then), no log line.
    Each shard is dropped from the page cache first, so its pages come from the disk (read_bytes)."""
    ranks.set_title(LOADER_TITLE)
    shards = ranks.shard_paths(model_path) if os.path.isdir(model_path) else []
    total = sum(os.path.getsize(shard) for shard in shards)
    started = time.monotonic()
    end = started + seconds
    rate = max(1.0, total / max(seconds, 0.1))
    done = 0
    for shard in shards:
        with open(shard, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            if not size:
                continue
            os.posix_fadvise(handle.fileno(), 0, size, os.POSIX_FADV_DONTNEED)
            with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
                for offset in range(0, size, MIB):
                    mapped[offset:offset + MIB]  # the pages fault in
                    done += min(MIB, size - offset)
                    ahead = started + done / rate - time.monotonic()
                    if ahead > 0:
                        time.sleep(ahead)
                    if time.monotonic() >= end:
                        return 0
    time.sleep(max(0.0, end - time.monotonic()))
    return 0


def node_rank_helper(opts):
    """A helper forked by the API process (its command line, `--node-rank 0` in it) that lives
    S / 2 seconds and exits 1; a thread reaps it. Call before any other thread starts: fork() in a
    process with threads is what CPython warns about."""
    title = own_cmdline()

    def check():
        time.sleep(opts.churn_seconds / 2)
        return HELPER_EXIT

    pid = fork_child(check)
    return reap_later(pid, opts.churn_record, churn="node-rank", made="fork", title=title)
