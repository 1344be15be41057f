"""wait_for_model_ready run by real Ansible against the real simulated engine, in every phase and fault.

Each scenario starts the simulated engine (`--engine sglang` and `--engine vllm`, pid mode, its
own process group on a free loopback port, a 32 MiB model in 8 shards, phases of 1-2 s), runs
`ansible localhost -m wait_for_model_ready` against it and records the module's result and the
wall-clock times; the test functions then assert the verdict, the message's key facts, the
evidence and the time it took.

Scenarios are independent (own port, log, process group; a private model where reads are
counted), so a module-scoped fixture runs the selected ones a few at a time in threads while the
tests wait for their own. Time bounds allow a loaded 2-core CI box but stay meaningful: a crash
is reported within poll_interval + SLACK of the engine's exit, a hang not before stall_timeout
and well before the overall timeout.
"""
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.helpers import ANSIBLE, ROOT, free_port, poll
from tests.helpers.simharness import SimRunner, make_model, weights_bytes
from tests.integration.test_module_ansible import ENV, parse

ENGINES = ("sglang", "vllm")
FAST = ["--start-seconds", "1.5", "--load-rate-mib", "32", "--init-seconds", "1.5", "--warmup-seconds", "1.5"]
POLL = 1
STALL = 7
SLACK = 6  # Ansible's start and a busy machine's scheduling, in seconds
WORKERS = 4
MIB = 1024 * 1024
SECRET = "sk-modelwake-sim-secret-8f3a"

# What the simulated engine prints as the root cause of crash1 in each phase (faults.CRASH_CAUSES)
# and of crash0 (rank 0 killed: the engine's own report, then exit 0).
CRASH1_CAUSE = {
    "loading": "torch.OutOfMemoryError: CUDA out of memory",
    "initializing": "RuntimeError: CUDA error: an illegal memory access was encountered",
    "warmup": "torch._inductor.exc.InductorError: CppCompileError: C++ compile error",
    "ready": "RuntimeError: CUDA error: an illegal memory access was encountered",
}
CRASH0_CAUSE = {
    "sglang": "Rank 0 scheduler is dead. Please check if there are relevant logs.",
    "vllm": "Worker proc VllmWorker-0 died unexpectedly (exit code: -9)",
}
# Log lines that show the engine has reached a phase (the look-once scenario waits for them).
REACHED = {
    "sglang": {"starting": "Init torch distributed begin.",
               "loading": "Loading safetensors checkpoint shards:  25% Completed | 2/8",
               "initializing": "Using CompressedTensorsWNA16MarlinMoEMethod",
               "warmup": "Uvicorn running on",
               "ready": "The server is fired up and ready to roll!"},
    "vllm": {"starting": "Initializing a V1 LLM engine",
             "loading": "Loading safetensors checkpoint shards:  25% Completed | 2/8",
             "initializing": "Loading weights took",
             "warmup": "Warming up model for the compilation...",
             "ready": "Application startup complete."},
}


class Run(object):
    """One module run: rc, the result dict, Ansible's whole output, wall-clock start and end."""

    def __init__(self, rc, result, output, started, ended):
        self.rc = rc
        self.result = result
        self.output = output
        self.started = started
        self.ended = ended

    @property
    def seconds(self):
        return self.ended - self.started

    def __repr__(self):
        return "Run(rc=%s, %.1f s, %s)" % (self.rc, self.seconds, json.dumps(self.result, indent=1)[:4000])


def module(url, pid, env=None, **options):
    """Run wait_for_model_ready through `ansible localhost`; options as key=value module args (as JSON
    when one is a list or a dict, e.g. `peers`); env: more of the module's environment (it runs locally,
    so it inherits Ansible's)."""
    args = dict(url=url, pid=pid, **options)
    if any(isinstance(v, (list, dict)) for v in args.values()):
        text = json.dumps(args)
    else:
        text = " ".join("%s=%s" % (k, v) for k, v in sorted(args.items()))
    argv = [ANSIBLE, "localhost", "-c", "local", "-m", "wait_for_model_ready", "-a", text]
    started = time.monotonic()
    proc = subprocess.run(argv, cwd=ROOT, env=dict(ENV, **(env or {})), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True, timeout=240)
    ended = time.monotonic()
    return Run(proc.returncode, parse(proc.stdout, proc.stderr), proc.stdout + proc.stderr, started, ended)


def attached(sim, url=None, env=None, **options):
    """Run the module from the engine's first instant: the engine's process group is held stopped
    (SIGSTOP) until the module's first look is written to progress_path, so Ansible's own start-up
    time on a busy machine cannot let the engine pass the phase under test unobserved."""
    options.setdefault("progress_path", sim.log_path + ".progress.jsonl")
    os.killpg(sim.pid, signal.SIGSTOP)
    result = {}
    with ThreadPoolExecutor(1) as runner:
        pending = runner.submit(lambda: result.setdefault("run", module(url or sim.url, sim.pid, env=env, **options)))
        try:
            poll(lambda: os.path.exists(options["progress_path"]) and os.path.getsize(options["progress_path"]), 120,
                 stop=pending.done)
        finally:
            os.killpg(sim.pid, signal.SIGCONT)
        pending.result()
    return result["run"]


def wait_args(sim, engine, **extra):
    options = dict(engine=engine, log_path=sim.log_path, timeout=90, stall_timeout=STALL, poll_interval=POLL)
    options.update(extra)
    return options


def http_status(url, api_key=None):
    headers = {"Authorization": "Bearer " + api_key} if api_key else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=5) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


class Scenario(object):
    """What one scenario may use: its own directory and engine runner, and the shared model."""

    def __init__(self, directory, model):
        self.dir = directory
        self.model = model
        self.sims = SimRunner(directory, FAST)


# -- the scenarios (run in the pool) -----------------------------------------------------------

def scenario_look_once(ctx, engine):
    """One start; at each phase's log line, one `timeout=0` look. While the port is closed the
    engine's group is held stopped during the look, so the phase cannot end under a slow Ansible."""
    # SGLang's warm-up cannot be held stopped (its port answers): it outlasts a look's allowed 20 s, or a slow
    # Ansible's look lands after it (seen: ready, on a loaded 2-core machine where a look took over 12 s).
    sim = ctx.sims.start(engine, ctx.model, "--start-seconds", "4", "--load-rate-mib", "8",
                         "--init-seconds", "4", "--warmup-seconds", "25", "--disable-cuda-graph")
    seen = {}
    for phase in ("starting", "loading", "initializing", "warmup", "ready"):
        sim.wait_log(REACHED[engine][phase], timeout=60)
        frozen = phase in ("starting", "loading", "initializing") or (engine, phase) == ("vllm", "warmup")
        if frozen:
            os.killpg(sim.pid, signal.SIGSTOP)
        try:
            seen[phase] = module(sim.url, sim.pid, engine=engine, log_path=sim.log_path, timeout=0)
            if phase == "warmup":
                seen["warmup_models"] = http_status(sim.url + "/v1/models") if engine == "sglang" else None
        finally:
            if frozen:
                os.killpg(sim.pid, signal.SIGCONT)
    return seen


def scenario_normal_start(ctx, engine):
    model = make_model(os.path.join(ctx.dir, "private-model"))  # its reads are this engine's alone
    progress = os.path.join(ctx.dir, "progress.jsonl")
    sim = ctx.sims.start(engine, model, "--load-rate-mib", "16")
    run = attached(sim, **wait_args(sim, engine, model_path=model, progress_path=progress))
    return {"run": run, "size": weights_bytes(model), "progress": progress}


def scenario_quiet_load(ctx, engine):
    progress = os.path.join(ctx.dir, "progress.jsonl")
    # 32 MiB at 2.5 MiB/s: ~13 s of loading without a log line, twice the stall timeout.
    sim = ctx.sims.start(engine, ctx.model, "--quiet-load", "--load-rate-mib", "2.5", "--disable-cuda-graph")
    run = attached(sim, **wait_args(sim, engine, progress_path=progress))
    return {"run": run, "progress": progress}


def scenario_crash(ctx, engine, kind, phase):
    after = {"loading": "0.3", "initializing": "0.5", "warmup": "0.5", "ready": "0"}[phase]
    sim = ctx.sims.start(engine, ctx.model, "--fault", "%s:%s" % (kind, phase), "--fault-after", after)
    run = attached(sim, **wait_args(sim, engine, timeout=60))
    sim.wait_exit()
    return {"run": run, "sim": sim}


def scenario_hang(ctx, engine, phase):
    sim = ctx.sims.start(engine, ctx.model, "--fault", "hang:%s" % phase, "--fault-after", "0.3")
    timeout = 60
    if phase == "ready":
        # A wait started before the hang would end at ready: look once the engine has hung.
        sim.wait_log(REACHED[engine]["ready"], timeout=60)
        time.sleep(2.0)  # --fault-after plus one turn of the serving loop
        timeout = 35  # more than the probe's 30 s completion timeout: the first look must not wait it out
        run = module(sim.url, sim.pid, **wait_args(sim, engine, timeout=timeout))
    else:
        run = attached(sim, **wait_args(sim, engine, timeout=timeout))
    return {"run": run, "sim": sim, "timeout": timeout, "alive": sim.proc.poll() is None}


def scenario_port_taken(ctx, engine):
    port = free_port()
    # Another web server on the port: it answers every request with 404.
    holder = subprocess.Popen([sys.executable, "-c", (
        "import http.server\n"
        "class H(http.server.BaseHTTPRequestHandler):\n"
        "    def do_GET(self):\n"
        "        self.send_error(404)\n"
        "    do_POST = do_GET\n"
        "    def log_message(self, *args):\n"
        "        pass\n"
        "server = http.server.HTTPServer(('127.0.0.1', %d), H)\n"
        "print('listening', flush=True)\n"
        "server.serve_forever()\n") % port],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, universal_newlines=True)
    try:
        assert holder.stdout.readline().strip() == "listening"
        sim = ctx.sims.start(engine, ctx.model, port=port)
        run = attached(sim, **wait_args(sim, engine, timeout=60))
        sim.wait_exit()
    finally:
        holder.kill()
        holder.wait()
    return {"run": run, "sim": sim, "holder": holder.pid}


def scenario_missing_model(ctx, engine, what):
    if what == "dir":
        path = os.path.join(ctx.dir, "no-such-model")
    else:
        path = os.path.join(ctx.dir, "no-config")
        os.makedirs(path)
        for name in os.listdir(ctx.model):
            if name != "config.json":
                os.symlink(os.path.join(ctx.model, name), os.path.join(path, name))
    sim = ctx.sims.start(engine, path)
    run = attached(sim, **wait_args(sim, engine, timeout=60))
    sim.wait_exit()
    return {"run": run, "sim": sim, "path": path}


def scenario_truncated_shard(ctx, engine):
    broken = os.path.join(ctx.dir, "broken")
    os.makedirs(broken)
    for name in os.listdir(ctx.model):
        os.symlink(os.path.join(ctx.model, name), os.path.join(broken, name))
    victim = os.path.join(broken, "model-00004-of-00008.safetensors")
    os.unlink(victim)
    with open(os.path.join(ctx.model, os.path.basename(victim)), "rb") as src, open(victim, "wb") as dst:
        dst.write(src.read(1000000))
    sim = ctx.sims.start(engine, broken)
    run = attached(sim, **wait_args(sim, engine, timeout=60))
    sim.wait_exit()
    return {"run": run, "sim": sim}


def scenario_wrong_port(ctx, engine):
    sim = ctx.sims.start(engine, ctx.model)
    closed = free_port()
    run = attached(sim, url="http://127.0.0.1:%d" % closed, **wait_args(sim, engine, timeout=60))
    return {"run": run, "sim": sim, "closed": closed}


def scenario_api_key(ctx, engine):
    sim = ctx.sims.start(engine, ctx.model, env={"MODELWAKE_API_KEY": SECRET})
    with_key = attached(sim, api_key=SECRET, **wait_args(sim, engine))
    without = module(sim.url, sim.pid, engine=engine, log_path=sim.log_path, timeout=0)
    return {"with_key": with_key, "without": without, "sim": sim}


def scenario_pid_ends(ctx, engine):
    sim = ctx.sims.start(engine, ctx.model, "--load-rate-mib", "2")
    killed = {}

    def kill_when_loading():
        sim.wait_log(REACHED[engine]["loading"], timeout=60)
        os.kill(sim.pid, signal.SIGKILL)  # the root alone: its ranks notice and follow
        killed["at"] = time.monotonic()

    with ThreadPoolExecutor(1) as killer:
        pending = killer.submit(kill_when_loading)
        run = attached(sim, **wait_args(sim, engine, timeout=60))
        pending.result()
    sim.wait_exit()
    return {"run": run, "sim": sim, "killed_at": killed["at"]}


# -- the pool ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def shared_model(tmp_path_factory):
    return make_model(tmp_path_factory.mktemp("model"))


@pytest.fixture(scope="module")
def scenarios(request, tmp_path_factory, shared_model):
    """Start every selected test's scenario in the pool; each test then waits for its own."""
    module_file = request.module.__file__
    items = [item for item in request.session.items if str(item.fspath) == module_file]
    pool = ThreadPoolExecutor(WORKERS)
    futures, contexts = {}, []
    for item in items:
        function = globals()["scenario_" + item.originalname.replace("test_", "", 1)]
        params = dict(item.callspec.params) if hasattr(item, "callspec") else {}
        ctx = Scenario(str(tmp_path_factory.mktemp(item.originalname[5:25])), shared_model)
        contexts.append(ctx)
        futures[item.nodeid] = pool.submit(_run_scenario, function, ctx, params)
    yield futures
    for future in futures.values():
        future.cancel()
    pool.shutdown(wait=True)
    for ctx in contexts:
        ctx.sims.stop_all()
    _print_summary(futures)


def _print_summary(futures):
    """Each module run's verdict and times (seen with `pytest -s`): what the report quotes."""
    for nodeid, future in sorted(futures.items()):
        if future.cancelled() or future.exception() is not None:
            continue
        runs = [(k, v) for k, v in sorted(future.result().items()) if isinstance(v, Run)]
        for key, run in runs:
            print("%-70s %-9s %-12s elapsed %3s s, wall %5.1f s" % (
                nodeid.split("::")[-1], key, run.result.get("phase"), run.result.get("elapsed"), run.seconds))


def _run_scenario(function, ctx, params):
    try:
        return function(ctx, **params)
    finally:
        ctx.sims.stop_all()  # every engine of the scenario, as soon as it is done


@pytest.fixture
def outcome(request, scenarios):
    return scenarios[request.node.nodeid].result(timeout=600)


def phases_of(result):
    return [p["phase"] for p in result["phases"]]


def looks(progress_path):
    with open(progress_path) as handle:
        return [json.loads(line)["verdict"] for line in handle]


# -- the tests: longest scenarios first, so the pool overlaps them -------------------------------

@pytest.mark.parametrize("engine,phase", [(e, p) for e in ENGINES for p in ("ready", "loading", "initializing", "warmup")]
                         + [("sglang", "starting")])
def test_hang(outcome, engine, phase):
    """A hang in any phase is stalled once stall_timeout has passed without progress: not before, and
    long before the overall timeout. Hung after ready (vLLM's /health still 200), it is not ready."""
    run, result = outcome["run"], outcome["run"].result
    assert run.rc != 0 and result["phase"] == "stalled", run
    assert outcome["alive"], "the hung engine must still run: a stall, not a crash"
    quiet = result["elapsed"] - result["last_progress"]["t"]
    assert quiet >= STALL - 1 and result["elapsed"] >= STALL, run
    assert "stalled: no progress for " in result["msg"]
    if phase == "ready":
        # Hung after ready: no start phase, the server that had been ready (its ready line in the log's
        # backlog) answers nothing. The first look's completion waits no longer than stall_timeout, the
        # look at the stall's moment a poll: the verdict within S + 2P, not after the probe's 30 s.
        assert "after the engine logged that it was ready: it answers nothing" in result["msg"], run
        assert "/completion timeout" in result["msg"]
        assert any("/v1/completions" in line and "no answer" in line for line in result["evidence"]), run
        if engine == "sglang":  # its /health generates a token through the hung ranks: it hangs too
            assert "HTTP /health timeout" in result["msg"], run
        assert result["elapsed"] <= STALL + 2 * POLL + 2, run  # the module's own clock: whole seconds, a busy look
    else:
        expected_phase = {"warmup": "initializing"}.get(phase, phase)
        assert " in phase %s " % expected_phase in result["msg"], run
        assert quiet <= STALL + POLL + SLACK, run
        assert result["elapsed"] < outcome["timeout"] / 2, run
    if phase == "starting":
        assert "HTTP /health refused" in result["msg"]


@pytest.mark.parametrize("engine", ENGINES)
def test_look_once(outcome, engine):
    """timeout=0 in each phase: the phase now, at once, never a failure; SGLang's warm-up
    (port open, /health 503, /v1/models 200) is initializing, not ready."""
    for phase in ("starting", "loading", "initializing", "warmup", "ready"):
        run = outcome[phase]
        assert run.rc == 0, (phase, run)
        # One look, at once: a second look would come a poll later and give its phase a duration. A look
        # that asks a completion may itself take over half a second on a loaded machine (elapsed 1).
        assert [p["duration"] for p in run.result["phases"]] == [0.0], (phase, run)
        assert run.result["elapsed"] <= 1 and run.seconds < 20, (phase, run)
    assert outcome["starting"].result["phase"] == "starting", outcome["starting"]
    loading = outcome["loading"].result
    assert loading["phase"] == "loading", loading
    assert 2 <= loading["shards"][0] < 8 and loading["shards"][1] == 8
    assert loading["fraction"] == pytest.approx(loading["shards"][0] / 8.0)
    assert "HTTP /health refused" in loading["msg"] and "shards %d/8" % loading["shards"][0] in loading["msg"]
    initializing = outcome["initializing"].result
    assert initializing["phase"] == "initializing" and initializing["fraction"] == 1.0, initializing
    # The reads are real disk reads (page cache dropped): more than in the loading look.
    assert 0 < loading["bytes_read"] < initializing["bytes_read"]
    warmup = outcome["warmup"].result
    assert warmup["phase"] == "initializing", warmup
    if engine == "sglang":
        assert "HTTP /health 503" in warmup["msg"]
        assert outcome["warmup_models"] == 200  # the trap: the model list answers during warm-up
    else:
        assert "HTTP /health refused" in warmup["msg"]  # vLLM listens only when ready
    ready = outcome["ready"].result
    assert ready["phase"] == "ready" and "answered 200 with choices" in ready["msg"], ready


@pytest.mark.parametrize("engine", ENGINES)
def test_normal_start(outcome, engine):
    """A full start to ready: the phases in order, the model's bytes read from disk."""
    run, result = outcome["run"], outcome["run"].result
    assert run.rc == 0 and result["phase"] == "ready", run
    seen = phases_of(result)
    assert seen == ["starting", "loading", "initializing", "ready"], seen
    assert result["msg"].startswith("ready after ") and "answered 200 with choices" in result["msg"]
    assert result["fraction"] == 1.0 and result["shards"] == [8, 8]
    assert 0.95 * outcome["size"] <= result["bytes_read"] <= 1.25 * outcome["size"], (result["bytes_read"], outcome["size"])
    assert result["elapsed"] < 45, run
    verdicts = looks(outcome["progress"])
    assert [v["phase"] for v in verdicts][-1] == "ready" and len(verdicts) >= 4


@pytest.mark.parametrize("engine", ENGINES)
def test_quiet_load(outcome, engine):
    """Loading without a log line, longer than stall_timeout: never stalled while read_bytes climbs."""
    run, result = outcome["run"], outcome["run"].result
    assert run.rc == 0 and result["phase"] == "ready", run
    loading = [p for p in result["phases"] if p["phase"] == "loading"]
    assert loading and loading[0]["duration"] >= STALL + 2, result["phases"]
    during = [v for v in looks(outcome["progress"]) if v["phase"] == "loading"][1:-1]
    assert len(during) >= STALL
    # The load's reads: from the disk, or from the page cache where an earlier scenario left the shared model.
    assert all("read_bytes +" in v["last_progress"]["what"] or "from the page cache" in v["last_progress"]["what"]
               for v in during), [v["last_progress"] for v in during]
    assert all(v["shards"] is None for v in during)


@pytest.mark.parametrize("engine,kind,phase", [(e, k, p) for e in ENGINES for k in ("crash1", "crash0")
                                               for p in ("loading", "initializing", "warmup", "ready")])
def test_crash(outcome, engine, kind, phase):
    """A crash in any phase is failed within a poll of the engine's exit, with the root cause first in
    the evidence; a crash that exits 0 is still a crash."""
    run, result, sim = outcome["run"], outcome["run"].result, outcome["sim"]
    assert sim.proc.returncode == (1 if kind == "crash1" else 0)
    assert run.rc != 0 and result["phase"] == "failed", run
    assert run.ended - sim.exited_at <= POLL + SLACK, run
    cause = CRASH1_CAUSE[phase] if kind == "crash1" else CRASH0_CAUSE[engine]
    assert cause in result["evidence"][0], run
    assert cause.split(":")[0] in result["msg"], run
    assert result["pid"] == sim.pid


@pytest.mark.parametrize("engine", ENGINES)
def test_port_taken(outcome, engine):
    """The URL's port held by another process: failed, naming that process."""
    run, result = outcome["run"], outcome["run"].result
    assert outcome["sim"].proc.returncode == 1
    assert run.rc != 0 and result["phase"] == "failed", run
    assert "is held by another process (pid %d" % outcome["holder"] in result["msg"], run
    assert run.ended - outcome["sim"].exited_at <= POLL + SLACK


@pytest.mark.parametrize("engine,what", [(e, w) for e in ENGINES for w in ("dir", "config")])
def test_missing_model(outcome, engine, what):
    """A missing model directory or config.json: failed at the engine's exit, saying why."""
    run, result, sim = outcome["run"], outcome["run"].result, outcome["sim"]
    assert sim.proc.returncode == 1
    assert run.rc != 0 and result["phase"] == "failed", run
    words = {("sglang", "dir"): "OSError: Incorrect path_or_model_id: '%s'",
             ("vllm", "dir"): "OSError: Repo id must be in the form 'repo_name' or 'namespace/repo_name': '%s'",
             ("sglang", "config"): "OSError: %s does not appear to have a file named config.json",
             ("vllm", "config"): "pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig",
             }[(engine, what)]
    words = words % outcome["path"] if "%s" in words else words
    assert words in result["evidence"][0], run
    assert "process %d exited" % sim.pid in result["msg"] and words in result["msg"], run
    if (engine, what) == ("vllm", "config"):
        assert any("Invalid repository ID or local directory specified: '%s'" % outcome["path"] in line
                   for line in result["evidence"]), run
    assert run.ended - sim.exited_at <= POLL + SLACK


@pytest.mark.parametrize("engine", ENGINES)
def test_truncated_shard(outcome, engine):
    """A truncated shard: failed with the SafetensorError line first, not only the final wrapper."""
    run, result, sim = outcome["run"], outcome["run"].result, outcome["sim"]
    assert run.rc != 0 and result["phase"] == "failed", run
    assert ("SafetensorError: Error while deserializing header: incomplete metadata, file not fully covered"
            in result["evidence"][0]), run
    assert "SafetensorError" in result["msg"]
    assert run.ended - sim.exited_at <= POLL + SLACK


@pytest.mark.parametrize("engine", ENGINES)
def test_wrong_port(outcome, engine):
    """A URL to a closed loopback port while the engine serves elsewhere: stalled, and the message
    says where the engine listens."""
    run, result, sim = outcome["run"], outcome["run"].result, outcome["sim"]
    assert run.rc != 0 and result["phase"] == "stalled", run
    assert "HTTP /health refused" in result["msg"]
    assert "logged that it listens on http://127.0.0.1:%d, not on port %d" % (sim.port, outcome["closed"]) \
        in result["msg"], run
    assert result["elapsed"] < 40


@pytest.mark.parametrize("engine", ENGINES)
def test_api_key(outcome, engine):
    """A server that wants a key: ready with it, the key nowhere in the output; without it, not ready
    and the message says the key is missing."""
    with_key, without = outcome["with_key"], outcome["without"]
    assert with_key.rc == 0 and with_key.result["phase"] == "ready", with_key
    assert SECRET not in with_key.output and SECRET not in without.output
    assert without.rc == 0 and without.result["phase"] == "initializing", without
    assert "/models 401" in without.result["msg"] and "api_key" in without.result["msg"], without


@pytest.mark.parametrize("engine", ENGINES)
def test_pid_ends(outcome, engine):
    """The watched process killed mid-load: failed within a poll, in phase loading."""
    run, result, sim = outcome["run"], outcome["run"].result, outcome["sim"]
    assert run.rc != 0 and result["phase"] == "failed", run
    assert "process %d exited" % sim.pid in result["msg"] and "in phase loading" in result["msg"], run
    assert run.ended - outcome["killed_at"] <= POLL + SLACK, run
