"""The launcher running the REAL simulated engine as its child, with NOTIFY_SOCKET pointing at the
test's own datagram socket (what systemd would read): STATUS lines during the load,
EXTEND_TIMEOUT_USEC while it progresses, READY=1 only once a completion works; a hang ends in
EXIT_STALLED after the stall budget with its evidence, a crash in EXIT_FAILED with the root cause,
an exit after ready (even with status 0) in EXIT_ENGINE_EXITED, an engine refusing its options in
EXIT_USAGE (the unit does not restart it); with liveness on, an engine hung after ready gets no more
WATCHDOG=1; SIGTERM leaves no process.
Every process is started in its own session and killed by process group afterwards, whatever
the outcome."""
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

from ansible_collections.modelwake.serving.plugins.module_utils.host import procfs
from ansible_collections.modelwake.serving.plugins.module_utils.launcher.exit_codes import EXIT_ENGINE_EXITED, EXIT_FAILED, EXIT_STALLED, EXIT_USAGE

from tests.helpers import SIM_PATH, free_port, launcher_package
from tests.helpers.notify_listener import NotifyListener
from tests.helpers.simharness import start_hub

FAST = ["--start-seconds", "0.5", "--init-seconds", "2", "--warmup-seconds", "0.5", "--load-rate-mib", "16",
        "--disable-cuda-graph"]


@pytest.fixture(scope="module")
def pythonpath(tmp_path_factory):
    """The launcher as the model_service role installs it (only what it imports), and the simulator."""
    return os.pathsep.join([launcher_package.install(str(tmp_path_factory.mktemp("launcher"))), SIM_PATH])


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("model"))
    subprocess.run([sys.executable, "-m", "modelwake_sim", "make-model", path, "--size-mib", "32", "--shards", "8",
                    "--quantization", "none"], env=dict(os.environ, PYTHONPATH=SIM_PATH), check=True,
                   stdout=subprocess.DEVNULL)
    return path


class Launch(object):
    """One `python -m modelwake launch ... -- python -m modelwake_sim serve ...` run."""

    def __init__(self, tmp_path, model_dir, pythonpath, sim_args=(), launcher_args=(), env=None):
        self.listener = NotifyListener()
        self.port = free_port()
        self.out_path = str(tmp_path / "stdout.log")
        self.err_path = str(tmp_path / "stderr.log")
        self.url = "http://127.0.0.1:%d" % self.port
        argv = [sys.executable, "-m", "modelwake", "launch", "--url", self.url, "--engine", "sglang",
                "--model-path", model_dir, "--poll-interval", "0.5", "--stall-timeout", "6", "--stop-timeout", "5",
                "--name", "sim-test.service"] + list(launcher_args) + [
                "--", sys.executable, "-m", "modelwake_sim", "serve", "--engine", "sglang", "--model-path", model_dir,
                "--port", str(self.port), "--tp", "2"] + FAST + list(sim_args)
        environ = dict(os.environ, PYTHONPATH=pythonpath, NOTIFY_SOCKET=self.listener.address)
        environ.pop("MODELWAKE_API_KEY", None)
        environ.update(env or {})
        self.start = time.monotonic()
        with open(self.out_path, "wb") as out, open(self.err_path, "wb") as err:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=err, env=environ, start_new_session=True)
        self.engine_pid = None
        self.seen = {}  # pid -> starttime of every process of the tree seen while it ran

    def stderr(self):
        with open(self.err_path, encoding="utf-8", errors="replace") as handle:
            return handle.read()

    def stdout(self):
        with open(self.out_path, encoding="utf-8", errors="replace") as handle:
            return handle.read()

    def watch_tree(self):
        for pid, info in procfs.tree([self.proc.pid]).items():
            self.seen[pid] = info["starttime"]
        match = re.search(r"engine started as pid (\d+)", self.stderr())
        if match:
            self.engine_pid = int(match.group(1))

    def wait_ready(self, timeout=90):
        """Follow the tree until READY=1 arrives; fail with the launcher's stderr if it does not."""
        ready = None
        deadline = time.monotonic() + timeout
        while ready is None and time.monotonic() < deadline and self.proc.poll() is None:
            self.watch_tree()
            ready = self.listener.wait_for("READY", 0.3)
        assert ready is not None, self.stderr()
        return ready

    def wait(self, timeout):
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None and time.monotonic() < deadline:
            self.watch_tree()
            time.sleep(0.2)
        return self.proc.poll()

    def survivors(self):
        """Processes of the tree that still run (same pid AND start time: not a reused pid)."""
        alive = []
        for pid, starttime in self.seen.items():
            info = procfs.read_process(pid)
            if info is not None and info["starttime"] == starttime and not procfs.is_gone(info):
                alive.append((pid, info["cmdline"][:80]))
        return alive

    def cleanup(self):
        for pgid in (self.proc.pid, self.engine_pid):
            if pgid:
                try:
                    os.killpg(pgid, signal.SIGKILL)
                except OSError:
                    pass
        for pid, _cmd in self.survivors():
            os.kill(pid, signal.SIGKILL)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            pass
        self.listener.close()


@pytest.fixture
def launch(tmp_path, model_dir, pythonpath):
    runs = []

    def start(sim_args=(), launcher_args=(), env=None):
        run = Launch(tmp_path, model_dir, pythonpath, sim_args, launcher_args, env)
        runs.append(run)
        return run

    yield start
    for run in runs:
        run.cleanup()


def completion(url, key=None):
    request = urllib.request.Request(url + "/v1/completions", method="POST",
                                     data=json.dumps({"prompt": "2+2=", "max_tokens": 4}).encode(),
                                     headers=dict([("Content-Type", "application/json")]
                                                  + ([("Authorization", "Bearer " + key)] if key else [])))
    with urllib.request.urlopen(request, timeout=10) as answer:
        return answer.status, json.loads(answer.read().decode())


def test_start_reports_phases_extends_and_is_ready_only_after_a_completion(launch, tmp_path):
    textfile = str(tmp_path / "sim.prom")
    run = launch(launcher_args=["--textfile", textfile], env={"MODELWAKE_LAUNCHER_API_KEY": "sk-launch-7",
                                                              "MODELWAKE_API_KEY": "sk-launch-7"})
    ready = run.wait_ready()
    # READY=1 means a completion works, right now, with the key the launcher read from its environment.
    status, body = completion(run.url, key="sk-launch-7")
    assert status == 200 and body["choices"][0]["text"]
    statuses = [value for _t, value in run.listener.fields("STATUS")]
    assert any(re.match(r"loading \d+% \(\d/8 shards", s) for s in statuses), statuses
    assert any(s.startswith("initializing") for s in statuses), statuses
    assert re.match(r"ready in [\dhms]+$", statuses[-1]), statuses
    extends = run.listener.fields("EXTEND_TIMEOUT_USEC")
    # Default budget: stall timeout 6 s + 2 polls of 0.5 s + 30 s.
    assert extends and all(t < ready[0] for t, _v in extends) and set(v for _t, v in extends) == {"37000000"}
    # The engine's READY line came before READY=1: the launcher never trusts a log line alone.
    out = run.stdout()
    assert "The server is fired up and ready to roll!" in out and "Load weight begin" in out
    assert "sk-launch-7" not in run.stderr() + out
    assert 'phase="ready"} 1' in open(textfile).read()
    # The engine does not see the launcher's own variables.
    with open("/proc/%d/environ" % run.engine_pid, "rb") as handle:
        names = [entry.split(b"=", 1)[0] for entry in handle.read().split(b"\0")]
    assert b"NOTIFY_SOCKET" not in names and b"MODELWAKE_LAUNCHER_API_KEY" not in names
    run.watch_tree()
    assert len(run.seen) >= 4  # launcher, engine, two ranks
    os.kill(run.proc.pid, signal.SIGTERM)
    assert run.wait(20) == 0
    assert run.survivors() == []
    assert run.listener.fields("STOPPING")
    assert "SIGTERM received: stopping the engine's process group" in run.stderr()


def test_a_hang_exits_after_the_stall_budget_with_the_evidence(launch):
    run = launch(sim_args=["--fault", "hang:loading", "--fault-after", "1"])
    code = run.wait(60)
    elapsed = time.monotonic() - run.start
    err = run.stderr()
    assert code == EXIT_STALLED, err
    assert 6 <= elapsed < 30, elapsed
    assert re.search(r"stalled: no progress for \d+ s in phase loading", err), err
    assert "  | " in err and "Loading safetensors checkpoint shards" in err  # the last lines, as evidence
    assert run.listener.fields("READY") == []
    assert run.listener.fields("STATUS")[-1][1].startswith("stalled:")
    assert run.survivors() == []


def test_ranks_spinning_in_a_collective_are_stalled_with_their_frames(launch):
    """The hang that looks like work, under the launcher: TP0 spins in one native call (a core busy),
    TP1 parks. The launcher reads their stacks with the py-spy beside the engine's interpreter."""
    run = launch(sim_args=["--fault", "spin:initializing", "--disable-cuda-graph"])
    code = run.wait(90)
    err = run.stderr()
    assert code == EXIT_STALLED, err
    assert re.search(r"stalled: no progress for \d+ s in phase initializing", err), err
    assert "goes to frames that have not moved, nor touched new memory" in err, err
    assert "the ranks' stacks: TP0 in all_reduce (modelwake_sim/ranks.py:" in err, err
    statuses = [value for _t, value in run.listener.fields("STATUS")]
    assert any(re.match(r"initializing.* \| TP0 in all_reduce \(modelwake_sim/ranks\.py:\d+\)", text)
               for text in statuses), statuses
    assert run.survivors() == []  # the spinning rank too


def test_a_crash_exits_non_zero_with_the_root_cause(launch):
    run = launch(sim_args=["--fault", "crash1:loading", "--fault-after", "0.5"])
    code = run.wait(60)
    err = run.stderr()
    assert code == EXIT_FAILED, err
    first = re.search(r"modelwake: failed: .*", err)
    assert first and "CUDA out of memory" in first.group(0), err
    assert re.search(r"\| .*OutOfMemoryError: CUDA out of memory", err), err
    assert run.listener.fields("READY") == []
    assert run.survivors() == []


def test_an_engine_refusing_its_options_ends_the_launcher_with_the_usage_status(launch):
    # The unit's RestartPreventExitStatus=2 then stops systemd from restarting it forever.
    run = launch(sim_args=["--no-such-option"])
    code = run.wait(60)
    err = run.stderr()
    assert code == EXIT_USAGE, err
    assert "unrecognized arguments: --no-such-option" in err
    assert "the engine refused its options (exit status 2)" in err
    assert run.survivors() == []


def test_an_exit_0_after_ready_still_ends_the_launcher_non_zero(launch, tmp_path):
    textfile = str(tmp_path / "sim.prom")
    run = launch(sim_args=["--fault", "crash0:ready", "--fault-after", "6"], launcher_args=["--textfile", textfile])
    code = run.wait(90)
    err = run.stderr()
    assert code == EXIT_ENGINE_EXITED, err
    assert run.listener.fields("READY")
    assert "failed: the engine exited after it was ready (exit status 0)" in err
    assert "Rank 0 scheduler is dead" in err  # the evidence from the engine's last lines
    assert run.survivors() == []
    assert 'modelwake_phase{name="sim-test.service",phase="failed"} 1' in open(textfile).read().splitlines()


def test_liveness_stops_the_watchdog_pings_of_an_engine_hung_after_ready(launch):
    """WatchdogSec=2 s (a probe and a ping every second), --liveness-failures 2: pings while the
    engine answers /health; once it hangs after ready (SGLang's /health then waits on a generation
    that never comes) the pings stop, STATUS= and the journal say why, and the launcher stays up
    for systemd's watchdog to end."""
    run = launch(sim_args=["--fault", "hang:ready", "--fault-after", "4"],
                 launcher_args=["--liveness-failures", "2"], env={"WATCHDOG_USEC": "2000000"})
    ready = run.wait_ready()
    verdict = run.listener.wait_for("STATUS", 60, lambda value: value.startswith("stalled:"))
    assert verdict is not None, run.stderr()
    assert re.match(r"stalled: the engine stopped answering after it was ready \(/health timeout \(no answer in "
                    r"0\.5 s\), 2 times in a row, every 1 s\)", verdict[1]), verdict
    pings = [t for t, _v in run.listener.fields("WATCHDOG")]
    assert pings and ready[0] <= pings[0] and pings[-1] < verdict[0], (ready, pings, verdict)
    assert run.proc.poll() is None  # the watchdog ends it, not the launcher
    time.sleep(2.5)  # more than a watchdog period: still no ping
    assert [t for t, _v in run.listener.fields("WATCHDOG") if t > verdict[0]] == []
    err = run.stderr()
    assert "modelwake: liveness: /health timeout (no answer in 0.5 s) (1 of 2 failed probes in a row)" in err, err
    run.watch_tree()
    os.kill(run.proc.pid, signal.SIGTERM)
    assert run.wait(20) == 0
    assert run.survivors() == []


def test_sigterm_during_the_load_leaves_no_process(launch):
    run = launch()
    assert run.listener.wait_for("STATUS", 30, lambda v: v.startswith("loading")), run.stderr()
    run.watch_tree()
    assert len(run.seen) >= 4
    os.kill(run.proc.pid, signal.SIGTERM)
    assert run.wait(20) == 0
    assert run.survivors() == []
    assert run.listener.fields("READY") == []


@pytest.mark.parametrize("arrival", ["download", "stream"])
def test_weights_from_the_network_are_named_in_the_status_while_they_arrive(launch, tmp_path, model_dir, arrival):
    """A hub download (silent log) or a streamed load, each longer than the stall timeout: STATUS=
    says where the weights come from, and the start ends ready, not stalled."""
    server = start_hub(model_dir, "org/k26", rate_mib=3)
    try:
        if arrival == "download":
            run = launch(sim_args=["--model-path", "org/k26"],
                         env={"HF_ENDPOINT": server.url, "HF_HUB_CACHE": str(tmp_path / "hub")})
            expected = "downloading org/k26 "
        else:
            run = launch(sim_args=["--load-format", "runai_streamer", "--model-path", server.url + "/org/k26",
                                   "--load-rate-mib", "3"])
            expected = "streamed: "
        run.wait_ready(timeout=120)
    finally:
        server.stop()
    statuses = [value for _t, value in run.listener.fields("STATUS")]
    named = [s for s in statuses if s.startswith("loading") and expected in s]
    assert len(named) >= 2, statuses
    assert not [s for s in statuses if s.startswith("stalled")]
    assert re.match(r"ready in [\dhms]+$", statuses[-1]), statuses
