"""The simulated engine as a real process, for integration tests (shared by the test modules).

Every engine runs in its own session (process group) on a free loopback port with a tiny model,
and `SimRunner.stop_all()` kills each group by its id whatever the test's outcome.
"""
import os
import signal
import subprocess
import sys
import threading
import time

from tests.helpers.network import free_port
from tests.helpers.paths import SIM_PATH
from tests.helpers.waiting import poll


def environ_copy():
    """os.environ as a dict, also from a pool's thread: pytest sets and removes PYTEST_CURRENT_TEST in its
    own thread meanwhile, and a copy iterates the keys, then reads each (a key removed in between: KeyError)."""
    while True:
        try:
            return dict(os.environ)
        except (KeyError, RuntimeError):
            continue


def sim_env(extra=None):
    env = environ_copy()
    env["PYTHONPATH"] = SIM_PATH
    env.pop("MODELWAKE_API_KEY", None)
    env.update(extra or {})
    return env


def make_model(path, size_mib=32, shards=8):
    """A tiny model directory whose shards are on disk and out of the page cache.

    make-model's freshly written pages are dirty, and posix_fadvise(DONTNEED) keeps dirty pages:
    without the fsync the simulated engine's reads would hit the cache and read_bytes would stay 0.
    """
    subprocess.run([sys.executable, "-m", "modelwake_sim", "make-model", str(path), "--size-mib", str(size_mib),
                    "--shards", str(shards)], env=sim_env(), check=True, stdout=subprocess.DEVNULL)
    for name in os.listdir(str(path)):
        fd = os.open(os.path.join(str(path), name), os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    return str(path)


def weights_bytes(path):
    return sum(os.path.getsize(os.path.join(path, n)) for n in os.listdir(path) if n.endswith(".safetensors"))


class Sim(object):
    """One running engine: its process, port, log file, and when it exited (monotonic)."""

    def __init__(self, proc, port, log_path):
        self.proc = proc
        self.port = port
        self.log_path = log_path
        self.exited_at = None
        self._watcher = threading.Thread(target=self._watch, daemon=True)
        self._watcher.start()

    def _watch(self):
        self.proc.wait()
        self.exited_at = time.monotonic()

    @property
    def pid(self):
        return self.proc.pid

    @property
    def url(self):
        return "http://127.0.0.1:%d" % self.port

    def log(self):
        with open(self.log_path, encoding="utf-8", errors="replace", newline="") as fileobj:
            return fileobj.read()

    def wait_log(self, text, timeout=30):
        """Until the engine logs text; fails at the deadline or once the engine has exited without it."""
        if poll(lambda: text in self.log(), timeout, stop=lambda: self.proc.poll() is not None):
            return
        raise AssertionError("%r not logged within %ss; log:\n%s" % (text, timeout, self.log()[-3000:]))

    def wait_exit(self, timeout=30):
        code = self.proc.wait(timeout=timeout)
        self._watcher.join(5)
        return code

    def tree(self):
        return descendants(self.proc.pid)


class SimRunner(object):
    """Starts engines (each in its own session) and kills every group it started."""

    def __init__(self, log_dir, fast=()):
        self.log_dir = str(log_dir)
        self.fast = list(fast)
        self.started = []
        self.lock = threading.Lock()

    def start(self, engine, model, *extra, env=None, port=None, log_before=""):
        """log_before: what the log file holds before this start appends to it (an earlier run's lines,
        as in a file appended to across restarts)."""
        port = port or free_port()
        with self.lock:
            log_path = os.path.join(self.log_dir, "sim-%d-%s.log" % (len(self.started), engine))
            with open(log_path, "wb") as log:
                log.write(log_before.encode("utf-8"))
                log.flush()  # the engine writes after it, through the same open file
                proc = subprocess.Popen(
                    [sys.executable, "-m", "modelwake_sim", "serve", "--engine", engine, "--model-path", model,
                     "--host", "127.0.0.1", "--port", str(port)] + self.fast + list(extra),
                    stdout=log, stderr=subprocess.STDOUT, env=sim_env(env), start_new_session=True)
            sim = Sim(proc, port, log_path)
            self.started.append(sim)
        return sim

    @staticmethod
    def stop(sim):
        try:
            os.killpg(sim.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        sim.proc.wait(timeout=10)

    def stop_all(self):
        for sim in self.started:
            self.stop(sim)


def descendants(pid):
    parents = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open("/proc/%s/stat" % name) as fileobj:
                    ppid = int(fileobj.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            parents.setdefault(ppid, []).append(int(name))
    found, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def start_hub(directory, repo="modelwake/k26-sim", **options):
    """The simulator's local hub server (modelwake_sim.hub.HubServer) in this process, outside the
    engine's tree: `options` are its rate_mib and stall_after_bytes. Stop it with .stop()."""
    from modelwake_sim import hub  # engines/sim: on the import path by pytest.ini
    return hub.HubServer(directory, repo, **options).start()


def py_spy():
    """The py-spy the tests read stacks with (the venv's, else one on PATH), or None."""
    import shutil  # here, so the module's head stays the shared one

    candidate = os.path.join(os.path.dirname(sys.executable), "py-spy")
    if os.access(candidate, os.X_OK):
        return candidate
    return shutil.which("py-spy")
