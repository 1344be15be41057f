"""The engine as the launcher's child: its own process group, its output teed to the journal and
offered to the wait through a pipe, its exit reaped, and its whole process tree stopped."""
import collections
import ctypes
import os
import queue
import signal
import subprocess
import threading
import time

from ..host import procfs
from ..host.logs import split_records
from .exit_codes import EXIT_USAGE

TAIL_LINES = 200  # the engine's last lines, kept for the evidence when it exits after ready
# How long a read of the output waits for the rest of a dead engine's output (its traceback).
EOF_WAIT = 2.0

PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4


def ambient_capability_dropper():
    """A preexec_fn for the engine's child: clear the ambient capabilities before exec, so the engine
    (a non-root user, no file capabilities) runs with none. The unit grants CAP_SYS_PTRACE where Yama
    asks for it (roles/model_service), for the launcher's py-spy only. prctl is looked up here, in
    the parent: between fork and exec only the call itself runs. Kernels before 4.3 have no ambient
    set, and a libc without prctl needs no drop: then nothing is done."""
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None

    def drop():
        prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    return drop


class PipeSource(object):
    """The engine's merged stdout/stderr: teed line by line to our stdout (the journal) and
    offered to the probe with the interface of logs.FileTailer (read_new, last_read_context)."""

    last_read_context = False  # everything comes from this run: no earlier run's lines
    error = None

    def __init__(self, fd, out, exited=None, eof_wait=EOF_WAIT):
        self.fd = fd
        self.out = out
        self.exited = exited or threading.Event()
        self.eof_wait = eof_wait
        self.queue = queue.Queue()
        self.tail = collections.deque(maxlen=TAIL_LINES)
        self.collect = True
        self.eof = threading.Event()
        self.thread = threading.Thread(target=self._pump, name="engine-output", daemon=True)

    def start(self):
        self.thread.start()
        return self

    def _tee(self, data):
        try:
            self.out.write(data)
            self.out.flush()
        except (OSError, ValueError):
            pass  # our stdout gone (journald restarting): keep the engine and the watch going

    def _records(self, lines):
        for line in lines:
            self.tail.append(line)
            if self.collect:
                self.queue.put(line)

    def _pump(self):
        pending_tee = b""
        pending_records = b""
        while True:
            try:
                data = os.read(self.fd, 65536)
            except OSError:
                data = b""
            if not data:
                break
            # journald splits on \n: hand it whole lines (a long \r progress bar at most 64 KiB).
            pending_tee += data
            cut = pending_tee.rfind(b"\n") + 1
            if cut == 0 and len(pending_tee) > 65536:
                cut = len(pending_tee)
            if cut:
                self._tee(pending_tee[:cut])
                pending_tee = pending_tee[cut:]
            # The classifier also splits on \r: a tqdm redraw is news before its line ends.
            lines, pending_records = split_records(pending_records + data)
            self._records(lines)
        if pending_tee:
            self._tee(pending_tee + b"\n")
        if pending_records.strip():
            self._records([pending_records.decode("utf-8", "replace")])
        os.close(self.fd)
        self.eof.set()

    def read_new(self):
        if self.exited.is_set():
            # The engine is gone: its last lines (the traceback) are still in the pipe.
            self.eof.wait(self.eof_wait)
        lines = []
        while True:
            try:
                lines.append(self.queue.get_nowait())
            except queue.Empty:
                return lines


class Engine(object):
    """The engine as our child, in its own session and process group (pgid == pid)."""

    def __init__(self, argv, env, out):
        read_fd, write_fd = os.pipe()
        try:
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=write_fd, stderr=write_fd,
                                         env=env, start_new_session=True, close_fds=True,
                                         preexec_fn=ambient_capability_dropper())
        finally:
            os.close(write_fd)
        self.pid = self.proc.pid
        self.exited = threading.Event()
        self.status = None
        self.wake = threading.Event()
        self.output = PipeSource(read_fd, out, exited=self.exited).start()
        self.seen = {}  # pid -> starttime of every descendant seen, to kill escapees by identity
        threading.Thread(target=self._reap, name="engine-reaper", daemon=True).start()

    def _reap(self):
        _pid, status = os.waitpid(self.pid, 0)
        self.status = status
        self.proc.returncode = -1  # reaped here: Popen must not wait for it again
        self.exited.set()
        self.wake.set()

    def describe_exit(self):
        if self.status is None:
            return "still running"
        if os.WIFSIGNALED(self.status):
            return "killed by signal %d (%s)" % (os.WTERMSIG(self.status), signal.Signals(os.WTERMSIG(self.status)).name)
        return "exit status %d" % os.WEXITSTATUS(self.status)

    def refused_its_options(self):
        """Did the engine exit by itself with argparse's usage status (bad options)?"""
        return self.status is not None and os.WIFEXITED(self.status) and os.WEXITSTATUS(self.status) == EXIT_USAGE

    def remember_tree(self):
        for pid, info in procfs.tree([self.pid]).items():
            self.seen[pid] = info["starttime"]

    def signal_group(self, signum):
        try:
            os.killpg(self.pid, signum)
        except OSError:
            pass  # the group is empty: nothing left to signal

    def _still_running(self):
        """Descendants seen earlier that still run (not exited, not a zombie)."""
        running = []
        for pid, starttime in self.seen.items():
            info = procfs.read_process(pid)
            if info is not None and info["starttime"] == starttime and not procfs.is_gone(info):
                running.append(pid)
        return running

    def _kill_escapees(self):
        """Descendants seen earlier that left the process group (setsid) and still run."""
        for pid in self._still_running():
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass

    def _wait_tree_gone(self, seconds):
        """SIGKILL takes effect asynchronously: on a loaded host a killed child can still run for a
        moment. Return only once none of the tree is left (or after `seconds`), so that nothing of
        the engine outlives the launcher, with or without systemd's cgroup to clean up."""
        deadline = time.monotonic() + seconds
        while self._still_running() and time.monotonic() < deadline:
            time.sleep(0.05)

    def stop(self, grace, signum=signal.SIGTERM):
        """signum to the group, SIGKILL to whatever is left after `grace` seconds; returns when reaped."""
        if not self.exited.is_set():
            self.remember_tree()
            self.signal_group(signum)
            self.exited.wait(grace)
        self.signal_group(signal.SIGKILL)
        self._kill_escapees()
        self.exited.wait(grace + 5)
        self._wait_tree_gone(5)
        return self.exited.is_set()
