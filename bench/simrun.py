"""A simulated engine run with the ground truth the benchmarks compare against.

The engine's stdout goes through a pipe read here: each line is stamped with the wall clock the
moment it arrives (the sim's own timestamps have 1 s resolution) and appended to the log file the
readiness module reads (`log_path`). The exit is stamped by a thread blocked in wait().
Every engine runs in its own session and is stopped by process group, whatever happened.
"""
import os
import signal
import subprocess
import sys
import threading
import time

# The integration tests' helpers: a free loopback port, the sim's environment.
from tests.helpers import free_port, poll
from tests.helpers.simharness import sim_env

# The engine's own line when it is ready: the true event of a healthy start (bench/run.py, bench/fleet.py).
READY_LINE = {"sglang": "The server is fired up and ready to roll!", "vllm": "Application startup complete."}


class SimRun(object):
    """One engine: `start()`, then `lines` [(wall time, line)], `exit_time`, `stop()`."""

    def __init__(self, engine, model_path, log_path, args=(), port=None, env=None):
        self.engine = engine
        self.model_path = model_path
        self.log_path = log_path
        self.port = port or free_port()
        self.args = list(args)
        self.env = env
        self.proc = None
        self.started = None
        self.lines = []
        self.exit_time = None
        self.exit_code = None
        self._lock = threading.Lock()
        self._threads = []

    @property
    def url(self):
        return "http://127.0.0.1:%d" % self.port

    def start(self):
        argv = [sys.executable, "-m", "modelwake_sim", "serve", "--engine", self.engine, "--model-path",
                self.model_path, "--host", "127.0.0.1", "--port", str(self.port)] + self.args
        self.started = time.time()
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     env=sim_env(self.env), start_new_session=True)
        for target in (self._tee, self._reap):
            thread = threading.Thread(target=target)
            thread.daemon = True
            thread.start()
            self._threads.append(thread)
        return self

    def _tee(self):
        with open(self.log_path, "ab", buffering=0) as log:
            for raw in iter(self.proc.stdout.readline, b""):
                now = time.time()
                log.write(raw)
                for piece in raw.decode("utf-8", "replace").replace("\r\n", "\n").split("\r"):
                    if piece.strip():
                        with self._lock:
                            self.lines.append((now, piece.rstrip("\n")))

    def _reap(self):
        code = self.proc.wait()
        self.exit_time = time.time()
        self.exit_code = code

    def first(self, text, after=0.0):
        """Wall time of the first line holding `text` (at or after `after`), or None."""
        with self._lock:
            for when, line in self.lines:
                if when >= after and text in line:
                    return when
        return None

    def wait_for(self, text, timeout):
        """Block until a line holds `text`; its wall time, or None when the deadline or the exit came first."""
        return poll(lambda: self.first(text), timeout, stop=lambda: self.exit_time is not None)

    def stop(self):
        """SIGTERM to the process group, SIGKILL after 10 s; always reaps."""
        if self.proc is None:
            return
        for sig, grace in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout=grace)
                break
            except subprocess.TimeoutExpired:
                continue
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # ranks left behind by a crash or a hang
        except ProcessLookupError:
            pass
        for thread in self._threads:
            thread.join(timeout=5)
