#!/usr/bin/env python3
"""`make bench`: measure modelwake's claims side by side with the waits people use today.

    .venv/bin/python -m bench.run [--out bench/out] [--only STEP,...] [--disk-engines vllm,sim] [--report-only]

(from the repository root: the bench imports the collection, the tests' helpers and the tools by name).

Writes <out>/results.json, <out>/report.md (bench/report.py) and its pictures. Everything runs on
loopback or on our own test-host guests, and everything started here is stopped here (engines by
process group, guests with `tools/testhosts down NAME`).
"""
import argparse
import glob
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

if not __package__:
    # Run as a file, Python would put bench/ on the import path instead of the root the imports below need.
    sys.exit("bench/run.py runs from the repository root as a module: .venv/bin/python -m bench.run")

from ansible_collections.modelwake.serving.plugins.module_utils.readiness import follow  # noqa: E402
from bench import container_demo, containers, disk, fleet, report, simrun  # noqa: E402
from modelwake_runner.cli import run_playbook  # noqa: E402  (ansible-runner: every play's events as data)
from tests.fakes import fake_nvml  # noqa: E402  (the fake libnvidia-ml.so.1: scripted GPUs read through NVML)
from tests.helpers import ANSIBLE_PLAYBOOK, FAKES, ROOT, TESTHOSTS, VENV_BIN, free_port, poll  # noqa: E402
from tests.helpers.simharness import descendants, make_model, sim_env  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))

# Time scale: the fixed-deadline waits' common budget (600 s: uri delay 10 x retries 60, wait_for
# timeout 600) is scaled by 1/30 like the engine's start; every approach looks once a second.
SCALE = 30.0
SETTINGS = {
    "scale": SCALE,
    "poll_interval": 1.0,  # module poll_interval, uri delay, wait_for sleep: the same for all three
    "deadline": 600 / SCALE,  # uri retries x delay, wait_for timeout
    "retries": int(600 / SCALE / 1.0),
    "uri_timeout": 5,
    "module_timeout": 3600 / SCALE,  # the module's default overall deadline, scaled
    "stall_timeout": 10,  # 300 s at full scale (the module's default is 600, the demo's 120)
    "fault_after": 3.0,  # s into loading: after the waits' own start-up (ansible-playbook takes 2-4 s here)
    "sglang_health_check_timeout": 2,  # SGLang's 20 s, scaled
    # The module's completion probe waits 30 s by default; scaled like stall_timeout, or a hung engine
    # that still listens is judged only after an unscaled 30 s look. The sim answers in ~0.05 s.
    "completion_timeout": 2,
}
# A ~14 s start: 1 s imports, 192 MiB in 16 shards at 32 MiB/s, 5 s silent JIT, 2 s warm-up.
SIM_ARGS = ["--tp", "2", "--fake-gpus", "--fake-gpu-count", "2", "--disable-cuda-graph", "--start-seconds", "1",
            "--load-rate-mib", "32", "--init-seconds", "5", "--warmup-seconds", "2", "--served-model-name", "k26-sim"]
MODEL_MIB, MODEL_SHARDS = 192, 16
READY_LINE = simrun.READY_LINE
LOAD_LINE = {"sglang": "Load weight begin", "vllm": "Starting to load model"}
SCENARIOS = [
    # name, --fault, what the true event is
    ("normal", None, "ready line"),
    ("crash-loading", "crash1:loading", "process exit"),
    ("hang-loading", "hang:loading", "loading line + fault_after"),
    ("hang-ready", "hang:ready", "ready line (the fault fires at once)"),
]
APPROACHES = ("module", "uri", "wait_for")
STEPS = report.STEPS


NVML_DIR = os.path.join(HERE, "out", "fake-nvml")


def ansible_env(extra=None):
    """What ansible-playbook's environment adds to ours: the module reads the scripted GPUs through
    NVML (the fake driver library on LD_LIBRARY_PATH), as on a GPU host; the scripted nvidia-smi
    stays on PATH as the fallback."""
    env = {"ANSIBLE_PYTHON_INTERPRETER": sys.executable, "LD_LIBRARY_PATH": NVML_DIR,
           "PATH": FAKES + os.pathsep + VENV_BIN + os.pathsep + os.environ.get("PATH", "")}
    env.update(extra or {})
    return env


class Play(object):
    """One playbook run through ansible-runner (modelwake_runner.cli.run_playbook): its exit status,
    our events of it (`objects`: progress looks, verdicts, the recap) and Ansible's own output (`text`,
    kept for the report's "why")."""

    def __init__(self, playbook, inventories, extra_vars=None, limit=None, env=None, timeout=900):
        self.objects = []
        private = tempfile.mkdtemp(prefix="bench-play-")
        try:
            runner, events = run_playbook(playbook, private, inventories, extra_vars, limit,
                                          on_object=self.objects.append, timeout=timeout, env=env)
            self.rc, self.text, self.recap = runner.rc, runner.stdout.read(), events.recap or {}
            self.task_times = task_times(runner.events)
        finally:
            shutil.rmtree(private, ignore_errors=True)

    def count(self, kind):
        return sum(1 for obj in self.objects if obj["event"] == kind)


# A task's end on a host, with ansible-runner's timing of it (event_data duration: from the task's start on
# that host): Ansible's task profiling, from the events the run records anyway.
TASK_RESULT_EVENTS = ("runner_on_ok", "runner_on_failed", "runner_on_skipped", "runner_on_unreachable")


def task_times(runner_events):
    """[{seconds, task, action, skipped}] of every task a host ran, in the run's order."""
    times = []
    for event in runner_events:
        data = event.get("event_data") or {}
        if event.get("event") in TASK_RESULT_EVENTS and data.get("duration") is not None:
            times.append({"seconds": round(float(data["duration"]), 3), "task": data.get("task", ""),
                          "action": data.get("task_action", ""), "skipped": event["event"] == "runner_on_skipped"})
    return times


def _localhost_inventory(work):
    """bench/waits.yml runs on this machine: an inventory of localhost alone (not the demo's)."""
    path = os.path.join(work, "localhost.yml")
    with open(path, "w") as handle:
        handle.write("all:\n  hosts:\n    localhost:\n      ansible_connection: local\n")
    return path


class Waiter(object):
    """bench/waits.yml for one approach, run in the background; `end` = wall time of its end, `play`
    the Play (None until it ended). Its module processes are this process' descendants."""

    def __init__(self, approach, extra_vars, env, log_path, timeout=900):
        self.approach = approach
        self.log_path = log_path
        self.play = None
        self.start = time.time()
        self.end = None
        self.timeout = timeout
        inventory = _localhost_inventory(os.path.dirname(log_path))
        self.thread = threading.Thread(target=self._run, args=(dict(extra_vars, bench_approach=approach),
                                                               inventory, env))
        self.thread.daemon = True
        self.thread.start()

    def _run(self, extra_vars, inventory, env):
        try:
            self.play = Play(os.path.join(HERE, "waits.yml"), [inventory], extra_vars, env=env, timeout=self.timeout)
        finally:
            self.end = time.time()
        with open(self.log_path, "w") as log:
            log.write(self.play.text)

    def join(self):
        """The play's exit status (ansible-runner stops it at the Waiter's timeout: rc 254)."""
        self.thread.join(self.timeout + 60)
        return self.play.rc if self.play else None


def _fresh(path):
    """A path with no file left from an earlier bench run (the module appends to progress files)."""
    if os.path.exists(path):
        os.remove(path)
    return path


def last_verdict(progress_path):
    try:
        with open(progress_path) as handle:
            lines = [line for line in handle if line.strip()]
        return json.loads(lines[-1])["verdict"] if lines else None
    except (OSError, ValueError, KeyError):
        return None


def run_scenario(engine, name, fault, event, model, work):
    """One engine start with all three waits watching it at once; their verdicts and times."""
    base = os.path.join(work, "%s-%s" % (engine, name))
    os.makedirs(base, exist_ok=True)
    args = list(SIM_ARGS)
    if fault:
        args += ["--fault", fault, "--fault-after", str(SETTINGS["fault_after"] if "loading" in fault else 0)]
    env = {"MODELWAKE_FAKE_GPU_DIR": os.path.join(base, "gpu"),
           "SGLANG_HEALTH_CHECK_TIMEOUT": str(SETTINGS["sglang_health_check_timeout"])}
    os.makedirs(env["MODELWAKE_FAKE_GPU_DIR"], exist_ok=True)
    sim = simrun.SimRun(engine, model, _fresh(os.path.join(base, "engine.log")), args, env=env).start()
    progress = _fresh(os.path.join(base, "progress.jsonl"))
    extra = {"bench_url": sim.url, "bench_pid": sim.proc.pid, "bench_port": sim.port, "bench_engine": engine,
             "bench_log_path": sim.log_path, "bench_model_path": model, "bench_progress_path": progress,
             "bench_module_timeout": SETTINGS["module_timeout"], "bench_stall_timeout": SETTINGS["stall_timeout"],
             "bench_poll_interval": SETTINGS["poll_interval"], "bench_retries": SETTINGS["retries"],
             "bench_deadline": SETTINGS["deadline"], "bench_uri_timeout": SETTINGS["uri_timeout"],
             "bench_completion_timeout": SETTINGS["completion_timeout"]}
    waiter_env = ansible_env({"MODELWAKE_FAKE_GPU_DIR": env["MODELWAKE_FAKE_GPU_DIR"]})
    try:
        waiters = [Waiter(a, extra, waiter_env, os.path.join(base, "wait-%s.log" % a), SETTINGS["module_timeout"] + 60)
                   for a in APPROACHES]
        codes = dict((w.approach, w.join()) for w in waiters)
        if fault and fault.startswith("crash"):
            poll(lambda: sim.exit_time is not None, 15)
        truth = true_event(sim, engine, name)
    finally:
        sim.stop()
    verdict = last_verdict(progress)
    result = {"engine": engine, "scenario": name, "fault": fault, "truth": truth, "event": event, "approaches": {},
              "progress": progress}
    for w in waiters:
        if w.approach == "module":
            said = verdict["phase"] if verdict else "no verdict"
            msg = verdict["msg"] if verdict else "no progress record"
        else:
            said = "ready" if codes[w.approach] == 0 else "gave up"
            msg = "rc %s after %.1f s" % (codes[w.approach], w.end - w.start)
        judged = report.judge(name, w.approach, said, w.end - sim.started, truth, msg)
        if w.approach == "module" and verdict:
            # The verdict itself, without the play's end: the module appends its last look
            # to the progress file the moment it decides.
            own = report.judge(name, w.approach, said, os.stat(progress).st_mtime - sim.started, truth, msg)
            judged["verdict_delay"] = own["delay"]
        result["approaches"][w.approach] = judged
    return result


def true_event(sim, engine, name):
    """When the thing the waits should report really happened, in seconds since the engine started."""
    if name == "normal":
        when = sim.first(READY_LINE[engine])
    elif name == "crash-loading":
        when = sim.exit_time
    elif name == "hang-loading":
        loading = sim.first(LOAD_LINE[engine])
        when = None if loading is None else loading + SETTINGS["fault_after"]
    else:
        when = sim.first(READY_LINE[engine])
    return None if when is None else round(when - sim.started, 2)


# -- the module's own cost -------------------------------------------------------------------------

def _proc_stat(pid):
    with open("/proc/%d/stat" % pid) as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    return fields


def _module_processes(root):
    """The AnsiballZ pythons under ansible-playbook: `<python> .../AnsiballZ_wait_for_model_ready.py`,
    or with pipelining a bare interpreter reading the module from stdin. A forked child before its
    exec looks the same, so only the shallowest match of each chain counts."""
    found = []
    for pid in descendants(root):
        try:
            with open("/proc/%d/cmdline" % pid, "rb") as handle:
                argv = [arg.decode("utf-8", "replace") for arg in handle.read().split(b"\0")[:-1]]
            parent = int(_proc_stat(pid)[1])
        except (OSError, IndexError, ValueError):
            continue
        if not argv or not os.path.basename(argv[0]).startswith("python") or parent in found:
            continue
        if len(argv) == 1 or argv[1].endswith("AnsiballZ_wait_for_model_ready.py"):
            found.append(pid)
    return found


def _sample(pid, ticks):
    """(own CPU s, reaped children's CPU s, VmHWM KiB) of a process, or None once it is gone."""
    try:
        fields = _proc_stat(pid)
        with open("/proc/%d/status" % pid) as handle:
            hwm = [int(line.split()[1]) for line in handle if line.startswith("VmHWM:")]
    except (OSError, IndexError, ValueError):
        return None
    return ((int(fields[11]) + int(fields[12])) / float(ticks), (int(fields[13]) + int(fields[14])) / float(ticks),
            hwm[0] if hwm else 0)


def _followed_waits(marker):
    """The pids of the waits the module left on this host (readiness/follow.py's files) whose
    environment holds `marker`: this measurement's, not those of tests running beside it."""
    pids = []
    for path in glob.glob(os.path.join(follow.state_dir(), follow.STATE_PREFIX + "*.json")):
        try:
            with open(path) as handle:
                pid = json.load(handle).get("pid")
        except (OSError, ValueError):
            continue
        try:
            with open("/proc/%d/environ" % pid, "rb") as handle:
                ours = marker.encode() in handle.read().split(b"\0")
        except (OSError, TypeError):
            continue
        if ours:
            pids.append(pid)
    return pids


def _read_cost(reads=40):
    """CPU seconds of one controller read on the host (follow.FOLLOW_COMMAND under /bin/sh), the read
    woken at once as when a wait has ended, so that no sleeping is measured."""
    work = tempfile.mkdtemp(prefix="bench-read-")
    try:
        path, fifo = os.path.join(work, "wait.json"), os.path.join(work, "wait.fifo")
        with open(path, "w") as handle:
            json.dump({"done": False, "result": {"phase": "initializing", "elapsed": 60}}, handle)
        os.mkfifo(fifo, 0o600)
        holder = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)
        command = follow.FOLLOW_COMMAND.format(interval=5, path=path, fifo=fifo, pid=os.getpid())
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        for _ in range(reads):
            os.write(holder, b"x")
            subprocess.run(["/bin/sh", "-c", command], stdout=subprocess.DEVNULL, check=True)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        os.close(holder)
    finally:
        shutil.rmtree(work)
    return ((after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)) / reads


COST_PHASES = ("load", "init")


def measure_cost(model, work, phase, seconds=300.0, poll=5.0, gpus=8):
    """The module waiting `seconds` on an engine in a long silent phase, at a `poll` s interval with
    live progress on (the action plugin's default interval), `gpus` scripted GPUs read through NVML,
    run by ansible-playbook as operators run it. phase "load": reading the shards with no log line
    (a silent load, as K2.6's long one); "init": a CPU-busy initialisation with nothing else moving, so the
    ranks' stacks are read too (py-spy). Sampled from /proc every 0.1 s: the module's process and
    the wait it leaves on the host (CPU, reaped children, peak RSS); the wait's own split of its CPU
    (its result's `cost`); the controller's reads on the host."""
    base = os.path.join(work, "cost-" + phase)
    os.makedirs(os.path.join(base, "gpu"), exist_ok=True)
    env = {"MODELWAKE_FAKE_GPU_DIR": os.path.join(base, "gpu")}
    marker = "MODELWAKE_FAKE_GPU_DIR=" + env["MODELWAKE_FAKE_GPU_DIR"]
    args = list(SIM_ARGS)
    args[args.index("--fake-gpu-count") + 1] = str(gpus)
    if phase == "load":
        # MODEL_MIB at 0.5 MiB/s: loading lasts past the measurement, with no progress bars.
        args[args.index("--load-rate-mib") + 1] = "0.5"
        args.append("--quiet-load")
    else:
        args[args.index("--init-seconds") + 1] = "3600"  # silent (CPU-busy) for an hour
    sim = simrun.SimRun("sglang", model, _fresh(os.path.join(base, "engine.log")), args, env=env).start()
    progress = _fresh(os.path.join(base, "progress.jsonl"))
    log_path = os.path.join(base, "wait-module.log")
    cost_path = _fresh(os.path.join(base, "split.json"))
    ticks = os.sysconf("SC_CLK_TCK")
    seen = {}  # pid -> the latest (cpu, children, hwm): counters only grow while a process lives
    first = last = None
    try:
        sim.wait_for(LOAD_LINE["sglang"], 30)
        extra = {"bench_url": sim.url, "bench_pid": sim.proc.pid, "bench_port": sim.port, "bench_engine": "sglang",
                 "bench_log_path": sim.log_path, "bench_model_path": model, "bench_progress_path": progress,
                 "bench_module_timeout": seconds, "bench_stall_timeout": 600, "bench_poll_interval": poll,
                 "bench_ignore_errors": True, "bench_cost_path": cost_path}
        waiter = Waiter("module", extra, ansible_env(env), log_path, timeout=seconds + 300)
        while waiter.end is None:
            for pid in _module_processes(os.getpid()) + _followed_waits(marker):
                values = _sample(pid, ticks)
                if values:
                    seen[pid] = values
                    last = time.time()
                    first = first or last
            time.sleep(0.1)
        waiter.join()
    finally:
        sim.stop()
    with open(progress) as handle:
        polls = sum(1 for line in handle if line.strip())
    split = None
    if os.path.exists(cost_path):
        with open(cost_path) as handle:
            split = json.load(handle)
    lines = waiter.play.count("progress") if waiter.play else 0  # the live-progress looks the play showed
    return {"phase": phase, "poll_interval": poll, "seconds": seconds, "gpus": gpus, "watched_s": round((last or 0) - (first or 0), 1),
            "polls": polls, "processes": len(seen), "cpu_s": round(sum(v[0] for v in seen.values()), 3),
            "children_cpu_s": round(sum(v[1] for v in seen.values()), 3),
            "peak_rss_mib": round(max([v[2] for v in seen.values()] or [0]) / 1024.0, 1),
            "split": split, "progress_lines": lines, "reads": lines + 1,
            "read_cpu_s": round(_read_cost(), 4)}


# -- the ranks' stacks: what a read costs, when a spinning hang is declared ----------------------------

def measure_stacks(model, work, reads=20, stall=10, poll=1.0):
    """py-spy's cost per read on a TP-8 simulated SGLang tree (8 ranks, the API process), then the
    module on a busy-spinning hang (--fault spin:initializing, TP 4: three ranks spin in one native
    call, the fourth parks) with stacks and without: when each verdict came after the hang began."""
    from ansible_collections.modelwake.serving.plugins.module_utils.host import procfs, stacks
    base = os.path.join(work, "stacks")
    os.makedirs(base, exist_ok=True)
    cost = {}
    args = ["--tp", "8", "--disable-cuda-graph", "--start-seconds", "1", "--load-rate-mib", "64",
            "--init-seconds", "600"]
    sim = simrun.SimRun("sglang", model, _fresh(os.path.join(base, "tp8.log")), args).start()
    try:
        sim.wait_for("Using CompressedTensorsWNA16MarlinMoEMethod", 120)
        reader = stacks.StackReader("auto")
        walls, found = [], 0
        before = os.times()
        for _ in range(reads):
            tree = procfs.tree([sim.proc.pid])
            started = time.monotonic()
            found = len(reader.read(tree)["processes"])
            walls.append(time.monotonic() - started)
        after = os.times()
        cpu = (after.children_user + after.children_system) - (before.children_user + before.children_system)
        cost = {"reads": reads, "processes": found, "cpu_s_per_read": round(cpu / reads, 4),
                "cpu_ms_per_process": round(1000.0 * cpu / reads / max(1, found), 1),
                "wall_s_per_read": round(sum(walls) / reads, 3), "wall_s_max": round(max(walls), 3)}
    finally:
        sim.stop()
    verdicts = {}
    for label, py_spy in (("with stacks", "auto"), ("without stacks", "off")):
        sim = simrun.SimRun("sglang", model, _fresh(os.path.join(base, "spin-%s.log" % py_spy)),
                            ["--tp", "4", "--disable-cuda-graph", "--start-seconds", "1", "--load-rate-mib", "64",
                             "--fault", "spin:initializing"]).start()
        try:
            extra = {"bench_approach": "module", "bench_url": sim.url, "bench_pid": sim.proc.pid,
                     "bench_engine": "sglang", "bench_log_path": sim.log_path, "bench_module_timeout": 6 * stall,
                     "bench_stall_timeout": stall, "bench_poll_interval": poll, "bench_py_spy": py_spy}
            play = Play(os.path.join(HERE, "waits.yml"), [_localhost_inventory(base)], extra, env=ansible_env(),
                        timeout=600)
            found = [obj for obj in play.objects if obj["event"] == "verdict"]
            if not found:
                raise RuntimeError("no verdict from bench/waits.yml (rc %s): %s" % (play.rc, play.text[-600:]))
            result = found[-1]
            hang = sim.first("Using CompressedTensorsWNA16MarlinMoEMethod")  # the spin begins with the phase
            init = [p for p in result.get("phases", []) if p["phase"] == "initializing"]
            verdicts[label] = {"phase": result["phase"], "elapsed": result.get("elapsed"),
                               "after_hang_s": round(result["elapsed"] - init[0]["start"], 1) if init else None,
                               "msg": result.get("msg", "")[:600], "hang_wall": hang}
        finally:
            sim.stop()
    return {"cost": cost, "stall_timeout": stall, "poll_interval": poll, "verdicts": verdicts}


# -- rank churn and rank death ---------------------------------------------------------------------

CHURN_SIM_ARGS = ["--disable-cuda-graph", "--start-seconds", "1", "--init-seconds", "3", "--warmup-seconds", "1"]
CHURN_CASES = (
    # case, TP, what the module must say, the simulator's options (modelwake_sim/churn.py, faults.py)
    ("compile-workers", 2, "ready", ["--churn", "compile-workers"]),
    ("loader-chain", 2, "ready", ["--churn", "loader-chain"]),
    ("helper-sigterm", 2, "ready", ["--churn", "helper-sigterm"]),
    ("node-rank", 2, "ready", ["--churn", "node-rank", "--node-rank", "0"]),
    ("rankkill:initializing", 3, "failed", ["--fault", "rankkill:initializing", "--fault-after", "1"]),
    ("rankreap:initializing", 2, "failed", ["--fault", "rankreap:initializing", "--fault-after", "1"]),
)


def measure_churn(model, work, stall=10, death_stall=60, poll=1.0, churn_seconds=4.0):
    """The module on healthy SGLang starts whose process churn looks like a rank's death (the
    simulator's --churn kinds), each of which must end ready with no look failed, and on two real rank
    deaths: a rank SIGKILLed and left a zombie (rankkill, its exit status readable) and one SIGKILLed
    and reaped at once by its parent (rankreap, nothing left to read), its siblings parked. For each:
    the final verdict, the looks that said failed, and for a death the lag from the kill (the wall
    time the dying rank recorded, --churn-record) to the verdict (its look's line in progress_path).
    The deaths run with `stall_timeout: death_stall`, so that stall_timeout does not decide them."""
    base = os.path.join(work, "churn")
    os.makedirs(base, exist_ok=True)
    measured = {"stall_timeout": stall, "death_stall_timeout": death_stall, "poll_interval": poll,
                "churn_seconds": churn_seconds, "cases": []}
    for case, tp, expects, options in CHURN_CASES:
        tag = case.replace(":", "-")
        record = _fresh(os.path.join(base, tag + ".record.jsonl"))
        args = CHURN_SIM_ARGS + ["--tp", str(tp), "--churn-seconds", str(churn_seconds), "--churn-record", record]
        sim = simrun.SimRun("sglang", model, _fresh(os.path.join(base, tag + ".log")), args + options).start()
        progress = _fresh(os.path.join(base, tag + ".progress.jsonl"))
        try:
            extra = {"bench_approach": "module", "bench_url": sim.url, "bench_pid": sim.proc.pid,
                     "bench_engine": "sglang", "bench_log_path": sim.log_path, "bench_model_path": model,
                     "bench_module_timeout": 120, "bench_poll_interval": poll, "bench_progress_path": progress,
                     "bench_stall_timeout": stall if expects == "ready" else death_stall,
                     "bench_ignore_errors": True}
            play = Play(os.path.join(HERE, "waits.yml"), [_localhost_inventory(base)], extra, env=ansible_env(),
                        timeout=600)
        finally:
            sim.stop()
        with open(progress) as handle:
            verdicts = [json.loads(line)["verdict"] for line in handle if line.strip()]
        if not verdicts:
            raise RuntimeError("no look from bench/waits.yml (rc %s): %s" % (play.rc, play.text[-600:]))
        with open(record) as handle:
            lines = [json.loads(line) for line in handle if line.strip()]
        kills = [line for line in lines if line.get("killed")]
        final = verdicts[-1]
        measured["cases"].append({
            "case": case, "tp": tp, "expects": expects, "phase": final["phase"], "msg": final["msg"][:600],
            "looks": len(verdicts), "failed_looks": sum(1 for v in verdicts if v["phase"] == "failed"),
            "churn_children": sum(1 for line in lines if line.get("churn")),
            "lag_s": round(os.stat(progress).st_mtime - kills[0]["t"], 1) if kills else None})
    return measured


# -- weights from the network -----------------------------------------------------------------------

ARRIVAL_REPO = "org/k26-sim"
ARRIVAL_SIM_ARGS = ["--tp", "2", "--disable-cuda-graph", "--start-seconds", "1", "--init-seconds", "3",
                    "--warmup-seconds", "1"]


def measure_arrivals(model, work, stall=10, poll=1.0, rate_mib=4.0):
    """The module watching weights that arrive by the network, each for longer than stall_timeout, from
    the simulator's local hub server (modelwake_sim.hub, outside the watched tree): a hub download
    (vLLM, whose log says nothing while it downloads), a streamed load (SGLang with the Run:ai
    streamer's socket reads, no log followed: the counters alone), and a download whose server stops
    sending with the socket open. For each: the verdict, when it came, and the launcher's STATUS= text
    of the looks while the weights arrived (readiness/status.py, from the module's progress file)."""
    from ansible_collections.modelwake.serving.plugins.module_utils.readiness.status import format_status
    from ansible_collections.modelwake.serving.plugins.module_utils.readiness.verdict import Verdict
    base = os.path.join(work, "arrivals")
    os.makedirs(base, exist_ok=True)
    weights = sum(os.path.getsize(path) for path in glob.glob(os.path.join(model, "*.safetensors")))
    cases = (
        ("download", "vllm", ["--rate-mib", str(rate_mib)], lambda url: (ARRIVAL_REPO, [], {"HF_ENDPOINT": url})),
        ("stream", "sglang", [], lambda url: ("%s/%s" % (url, ARRIVAL_REPO),
                                               ["--load-format", "runai_streamer", "--load-rate-mib", str(rate_mib)], {})),
        ("stopped download", "sglang", ["--rate-mib", str(rate_mib), "--stall-after-mib", str(weights // 2 // 1048576)],
         lambda url: (ARRIVAL_REPO, [], {"HF_ENDPOINT": url})),
    )
    measured = {"stall_timeout": stall, "poll_interval": poll, "rate_mib": rate_mib, "weights_bytes": weights,
                "cases": []}
    for label, engine, server_options, arrival in cases:
        # The hub in a process of its own, outside the watched tree, as the model hub is.
        port = free_port()
        server = subprocess.Popen([sys.executable, "-m", "modelwake_sim", "hub", model, "--repo", ARRIVAL_REPO,
                                   "--port", str(port)] + server_options, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, env=sim_env(), start_new_session=True)
        server.stdout.readline()  # it serves once it says so
        url = "http://127.0.0.1:%d" % port
        model_path, args, env = arrival(url)
        cache = os.path.join(base, label.replace(" ", "-") + "-hub")
        shutil.rmtree(cache, ignore_errors=True)
        env = dict(env, HF_HUB_CACHE=cache)
        tag = label.replace(" ", "-")
        sim = simrun.SimRun(engine, model_path, _fresh(os.path.join(base, tag + ".log")), ARRIVAL_SIM_ARGS + args,
                            env=env).start()
        progress = _fresh(os.path.join(base, tag + ".progress.jsonl"))
        try:
            extra = {"bench_approach": "module", "bench_url": sim.url, "bench_pid": sim.proc.pid,
                     "bench_engine": engine, "bench_module_timeout": 300, "bench_stall_timeout": stall,
                     "bench_poll_interval": poll, "bench_progress_path": progress, "bench_ignore_errors": True}
            if label != "stream":
                extra["bench_log_path"] = sim.log_path
            play = Play(os.path.join(HERE, "waits.yml"), [_localhost_inventory(base)], extra, env=ansible_env(),
                        timeout=600)
        finally:
            sim.stop()
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
        with open(progress) as handle:
            looks = [json.loads(line) for line in handle if line.strip()]
        if not looks:
            raise RuntimeError("no look from bench/waits.yml (rc %s): %s" % (play.rc, play.text[-600:]))
        t0 = looks[0]["snapshot"]["t"]
        final = looks[-1]["verdict"]
        arriving = [look for look in looks if look["verdict"].get("source")]
        statuses = []
        for look in arriving[::max(1, len(arriving) // 4)][:4] + looks[-1:]:
            verdict = look["verdict"]
            fields = dict((k, verdict.get(k)) for k in ("phase", "msg", "evidence", "since", "fraction", "shards",
                                                      "bytes_read", "read_rate", "eta", "where", "source"))
            elapsed = look["snapshot"]["t"] - t0
            statuses.append("+%.0f s: %s" % (elapsed, format_status(Verdict(**fields), elapsed)))
        case = {"arrival": label, "engine": engine, "phase": final["phase"], "msg": final["msg"][:400],
                "elapsed": round(looks[-1]["snapshot"]["t"] - t0, 1),
                "looks_with_source": len(arriving), "source": (arriving[-1]["verdict"]["source"] if arriving else None),
                "statuses": statuses, "stalled_after_last_byte_s": None}
        if final["phase"] == "stalled" and final.get("last_progress"):
            # From the last progress the module saw (the download's last byte) to its verdict.
            case["stalled_after_last_byte_s"] = round(case["elapsed"] - final["last_progress"]["t"], 1)
            case["last_progress"] = final["last_progress"]["what"]
        measured["cases"].append(case)
    return measured


# -- the start history's ETA -----------------------------------------------------------------------

HISTORY_SIM_ARGS = ["--tp", "2", "--disable-cuda-graph", "--start-seconds", "1"]


def measure_history(model, work, starts=6, poll=1.0, load_seconds=12.0, init_seconds=15.0, jitter=0.15, seed=7):
    """The whole-start ETA from the host's own record: `starts` starts of the simulated SGLang server
    watched by the module (pid mode, `history` naming a record file), each start's load and silent
    initialisation drawn within +-`jitter` of `load_seconds` and `init_seconds` (a host's starts are
    never the same twice). From the third start on (two earlier ones make a usual), the ETA a look
    gives (`start_eta`) against the time the start really still took, at its first look and at a
    quarter, half and three quarters of it."""
    import random
    base = os.path.join(work, "history")
    shutil.rmtree(base, ignore_errors=True)
    os.makedirs(base)
    record = os.path.join(base, "starts.jsonl")
    weights = sum(os.path.getsize(path) for path in glob.glob(os.path.join(model, "*.safetensors")))
    draw = random.Random(seed)
    measured = {"starts": [], "poll_interval": poll, "load_seconds": load_seconds, "init_seconds": init_seconds,
                "jitter": jitter}
    for number in range(1, starts + 1):
        load = load_seconds * draw.uniform(1 - jitter, 1 + jitter)
        init = init_seconds * draw.uniform(1 - jitter, 1 + jitter)
        rate_mib = weights / 1048576.0 / load
        tag = "start-%d" % number
        sim = simrun.SimRun("sglang", model, _fresh(os.path.join(base, tag + ".log")),
                            HISTORY_SIM_ARGS + ["--load-rate-mib", "%.2f" % rate_mib, "--init-seconds", "%.1f" % init]
                            ).start()
        progress = _fresh(os.path.join(base, tag + ".progress.jsonl"))
        try:
            extra = {"bench_approach": "module", "bench_url": sim.url, "bench_pid": sim.proc.pid,
                     "bench_engine": "sglang", "bench_module_timeout": 300, "bench_stall_timeout": 60,
                     "bench_poll_interval": poll, "bench_progress_path": progress, "bench_log_path": sim.log_path,
                     "bench_model_path": model, "bench_history": record}
            play = Play(os.path.join(HERE, "waits.yml"), [_localhost_inventory(base)], extra, env=ansible_env(),
                        timeout=600)
        finally:
            sim.stop()
        with open(progress) as handle:
            looks = [json.loads(line) for line in handle if line.strip()]
        if not looks or looks[-1]["verdict"]["phase"] != "ready":
            raise RuntimeError("start %d did not end ready (rc %s): %s" % (number, play.rc, play.text[-600:]))
        t0, t_ready = looks[0]["snapshot"]["t"], looks[-1]["snapshot"]["t"]
        whole = t_ready - t0
        points = []
        for share in (0.0, 0.25, 0.5, 0.75):
            look = next(look for look in looks if look["snapshot"]["t"] - t0 >= share * whole)
            left = t_ready - look["snapshot"]["t"]
            eta = look["verdict"].get("start_eta")
            points.append({"share": share, "phase": look["verdict"]["phase"], "truth_s": round(left, 1),
                           "eta_s": None if eta is None else round(eta, 1),
                           "error": None if eta is None or left <= 0 else round(abs(eta - left) / left, 3)})
        measured["starts"].append({"start": number, "load_s": round(load, 1), "init_s": round(init, 1),
                                   "whole_s": round(whole, 1), "usual": looks[-1]["verdict"].get("usual"),
                                   "points": points})
    return measured


# -- throughput on the sim -------------------------------------------------------------------------

def measure_throughput(model, work):
    from ansible_collections.modelwake.serving.plugins.modules import completion_load
    base = os.path.join(work, "throughput")
    os.makedirs(base, exist_ok=True)
    fast = ["--start-seconds", "0.2", "--init-seconds", "0.3", "--warmup-seconds", "0.2", "--load-rate-mib", "500",
            "--no-access-log", "--served-model-name", "k26-sim"]
    sim = simrun.SimRun("sglang", model, _fresh(os.path.join(base, "engine.log")), fast).start()
    try:
        if not sim.wait_for(READY_LINE["sglang"], 60):
            return {"status": "not measured", "why": "the engine did not start"}
        # Four completions per slot: every level takes about as long as four requests.
        levels = [completion_load.run_level(sim.url, "k26-sim", None, concurrency, 4 * concurrency, 64,
                                            "Describe the weather.", level_timeout=60, request_timeout=60)
                  for concurrency in (1, 2, 4, 8, 16, 32)]
    finally:
        sim.stop()
    return {"status": "measured", "token_seconds": 0.025, "max_tokens": 64, "levels": levels}


# -- test hosts: re-run of deploy-k26.yml, fan-out -------------------------------------------------

def testhosts(*args, **kwargs):
    return subprocess.run([TESTHOSTS] + list(args), cwd=ROOT,
                          env=dict(os.environ, **ansible_env()),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True, **kwargs)


def _unit_state(guest, unit):
    out = testhosts("ssh", guest, "systemctl", "show", unit, "-p", "NRestarts,InvocationID,MainPID,ActiveState",
                    timeout=60).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def _guests_up(names):
    """`tools/testhosts up` (addresses derived from the names); {name: address}, or raise with its output."""
    up = testhosts("up", *names, timeout=900)
    if up.returncode != 0:
        raise RuntimeError("tools/testhosts up failed: %s" % up.stdout[-400:])
    return dict((name, testhosts("addr", name, timeout=60).stdout.strip()) for name in names)


def _inventory(path, group, addresses):
    """A YAML inventory of `group`; loaded together with inventories/demo, whose group_vars and
    connection variables (the test hosts' SSH key, root) apply to it."""
    with open(path, "w") as handle:
        handle.write("all:\n  children:\n    %s:\n      hosts:\n" % group)
        for name, addr in sorted(addresses.items()):
            handle.write("        %s:\n          ansible_host: %s\n" % (name, addr))
    return path


RERUNS = 3


def measure_rerun(work, guest="bench-rerun"):
    """deploy-k26.yml once on a fresh guest, then again on the now-ready host: wall time, changed, restarts."""
    result = {"status": "not measured", "guest": guest}
    try:
        try:
            addresses = _guests_up([guest])
        except RuntimeError as exc:
            result["why"] = str(exc)
            return result
        inventory = _inventory(os.path.join(work, "rerun-hosts.yml"), "model_hosts", addresses)
        testhosts("install-fake-gpus", guest, "--count", "8", timeout=300)
        model = _playbook(inventory, os.path.join(ROOT, "playbooks", "demo-model.yml"), guest)
        first = _playbook(inventory, os.path.join(ROOT, "deploy-k26.yml"), guest, timeout=1200)
        if model.rc != 0 or first.rc != 0:
            result["why"] = "the first deploy did not succeed (rc %s/%s): %s" % (
                model.rc, first.rc, (first.text or model.text)[-600:])
            return result
        before = _unit_state(guest, "sglang-k26.service")
        # As on an operator's machines: the test caches of Ansible's module runs off, the guest's
        # (tools/zipimport_cache.py) and the controller's (tools/module_deps_cache.py).
        testhosts("ssh", guest, "rm -f /usr/local/lib/python3*/dist-packages/modelwake-zipimport-cache.pth", timeout=60)
        # The same re-run RERUNS times: one run on this machine varies by about 2 s either way; the
        # figure is the median run's (its recap and task times too).
        runs = []
        for _ in range(RERUNS):
            start = time.monotonic()
            again = _playbook(inventory, os.path.join(ROOT, "deploy-k26.yml"), guest, timeout=1200,
                              env_extra={"MODELWAKE_MODULE_DEPS_CACHE": "off"})
            runs.append((time.monotonic() - start, again))
            if again.rc != 0:
                break
        walls = [round(run_wall, 1) for run_wall, _run in runs]
        wall, again = sorted(runs, key=lambda run: run[0])[len(runs) // 2] if again.rc == 0 else runs[-1]
        # The README's command itself, `ansible-playbook deploy-k26.yml`, as an operator types it: no
        # ansible-runner around it (whose event files give the task times above, at a cost of their own).
        cli_walls = []
        for _ in range(RERUNS if again.rc == 0 else 0):
            cli_wall, cli_rc = _cli_playbook(inventory, os.path.join(ROOT, "deploy-k26.yml"), guest,
                                             env_extra={"MODELWAKE_MODULE_DEPS_CACHE": "off"})
            if cli_rc != 0:
                result["why"] = "ansible-playbook deploy-k26.yml exited %d on the re-run" % cli_rc
                break
            cli_walls.append(round(cli_wall, 1))
        after = _unit_state(guest, "sglang-k26.service")
        recap = again.recap.get(guest, {})
        ran = [t for t in again.task_times if not t["skipped"]]
        result.update(status="measured" if again.rc == 0 else "failed", rc=again.rc,
                      wall_s=round(wall, 1), walls_s=walls, changed=recap.get("changed"), recap=recap,
                      cli_wall_s=sorted(cli_walls)[len(cli_walls) // 2] if cli_walls else None, cli_walls_s=cli_walls,
                      tasks=len(again.task_times), tasks_run=len(ran),
                      task_seconds=round(sum(t["seconds"] for t in again.task_times), 1),
                      slowest_tasks=sorted(ran, key=lambda t: -t["seconds"])[:12],
                      restarts=int(after.get("NRestarts", 0)) - int(before.get("NRestarts", 0)),
                      same_invocation=before.get("InvocationID") == after.get("InvocationID") != "",
                      invocation=after.get("InvocationID"))
        if again.rc != 0:
            result["why"] = again.text[-600:]
        return result
    finally:
        testhosts("down", guest, timeout=300)


FANOUT_GUESTS = ("bench-fan1", "bench-fan2", "bench-fan3", "bench-fan4")


def _cli_playbook(inventory, playbook, limit, env_extra=None, timeout=900):
    """PLAYBOOK run by ansible-playbook itself (its output dropped): (wall seconds, exit status)."""
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_NOCOLOR="1", **ansible_env(env_extra))
    start = time.monotonic()
    proc = subprocess.run([ANSIBLE_PLAYBOOK, "-i", inventory, "-i", os.path.join(ROOT, "inventories", "demo"),
                           "--limit", limit, playbook], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL, timeout=timeout)
    return time.monotonic() - start, proc.returncode


def _playbook(inventory, playbook, limit, extra=None, timeout=900, env_extra=None):
    """PLAYBOOK (a path, or a file of bench/) on `limit` of our inventory + the demo's: a Play."""
    return Play(os.path.join(HERE, playbook), [inventory, os.path.join(ROOT, "inventories", "demo")], extra,
                limit, env=ansible_env(env_extra), timeout=timeout)


def measure_fanout(work, counts=(1, 2, 4)):
    """Start the engine on 1, 2 and 4 guests at once and wait for all with the module (one play):
    wall time against one host. The guests share this machine's cores, so their engines start slower together."""
    result = {"status": "not measured", "levels": []}
    guests = FANOUT_GUESTS[:max(counts)]
    try:
        try:
            addresses = _guests_up(list(guests))
        except RuntimeError as exc:
            result["why"] = str(exc)
            return result
        inventory = _inventory(os.path.join(work, "fanout-hosts.yml"), "bench_fanout", addresses)
        prepared = _playbook(inventory, "fanout-prepare.yml", ",".join(guests))
        if prepared.rc != 0:
            result["why"] = "bench/fanout-prepare.yml failed: %s" % prepared.text[-600:]
            return result
        for count in counts:
            limit = ",".join(guests[:count])
            unit = "bench-sim-%d-%d" % (count, int(time.time()))
            start = time.monotonic()
            run = _playbook(inventory, "fanout.yml", limit, {"bench_fanout_unit": unit})
            wall = time.monotonic() - start
            _playbook(inventory, "fanout-stop.yml", limit, {"bench_fanout_unit": unit})
            result["levels"].append({"hosts": count, "wall_s": round(wall, 1), "rc": run.rc,
                                     "failed": sum(r.get("failed", 0) for r in run.recap.values())})
            if run.rc != 0:
                result["why"] = "bench/fanout.yml failed on %d hosts: %s" % (count, run.text[-600:])
                return result
        result["status"] = "measured"
        return result
    finally:
        testhosts("down", *guests, timeout=600)


def measure_real_vllm(work):
    """The module watching a start of the real vLLM CPU build (tools/vllm_cpu.py, its cached venv and
    tiny model) with poll_interval 1: bench/REPORT.md's "A real vLLM start". Skipped when the cache lacks them."""
    from tools import vllm_cpu
    base = os.path.join(work, "real-vllm")
    os.makedirs(base, exist_ok=True)
    model = os.path.join(vllm_cpu.cache_root(), "models", "tiny")
    if not os.path.exists(vllm_cpu.venv_python()) or not os.path.isdir(model):
        return {"status": "not measured", "why": "no real vLLM CPU venv and tiny model in the cache: run "
                "python3 tools/vllm_cpu.py ensure-venv and make-model %s --tiny" % model}
    log_path = _fresh(os.path.join(base, "engine.log"))
    progress = _fresh(os.path.join(base, "progress.jsonl"))
    port = free_port()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(vllm_cpu.serve_command(model, port), stdout=log, stderr=subprocess.STDOUT,
                                env=vllm_cpu.engine_env(), cwd=base, start_new_session=True)
    try:
        extra = {"bench_url": "http://127.0.0.1:%d" % port, "bench_pid": proc.pid, "bench_port": port,
                 "bench_engine": "vllm", "bench_log_path": log_path, "bench_model_path": model,
                 "bench_progress_path": progress, "bench_module_timeout": 600, "bench_stall_timeout": 120,
                 "bench_poll_interval": 1}
        waiter = Waiter("module", extra, ansible_env(), os.path.join(base, "wait-module.log"), timeout=700)
        waiter.join()
    finally:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(proc.pid, sig)
                proc.wait(timeout=20)
                break
            except ProcessLookupError:
                break
            except subprocess.TimeoutExpired:
                continue
    verdict = last_verdict(progress)
    return {"status": "measured" if verdict else "failed", "progress": progress,
            "phase": verdict["phase"] if verdict else None, "msg": verdict["msg"] if verdict else None,
            "phases": verdict["phases"] if verdict else []}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=os.path.join(HERE, "out"))
    parser.add_argument("--only", default=",".join(STEPS),
                        help="comma-separated steps: %s (default: all)" % ", ".join(STEPS))
    parser.add_argument("--report-only", action="store_true",
                        help="measure nothing: write report.md and its pictures again from results.json")
    parser.add_argument("--scenarios", default="",
                        help="only these engine-scenario pairs, e.g. vllm-normal,sglang-hang-loading (default: all)")
    parser.add_argument("--disk-engines", default=",".join(disk.ENGINES),
                        help="the disk step's engines: vllm (the real vLLM CPU, ~15 minutes), sim (the simulated "
                             "TP 8, a minute or two); default: both")
    parser.add_argument("--fleet-counts", default=",".join(str(n) for n in fleet.COUNTS),
                        help="the fleet step's host counts (default: %(default)s)")
    args = parser.parse_args(argv)
    fleet_counts = tuple(int(n) for n in args.fleet_counts.split(","))
    disk_engines = tuple(args.disk_engines.split(","))
    if not disk_engines or set(disk_engines) - set(disk.ENGINES):
        parser.error("--disk-engines: choose from %s (got %r)" % (", ".join(disk.ENGINES), args.disk_engines))
    args.out = os.path.abspath(args.out)  # the module resolves paths on the host, from elsewhere
    if args.report_only:
        with open(os.path.join(args.out, "results.json")) as handle:
            report.write(json.load(handle), args.out)
        print("bench: wrote %s" % os.path.join(args.out, "report.md"))
        return 0
    steps = set(args.only.split(","))
    unknown = steps - set(STEPS)
    if unknown:
        parser.error("--only: unknown step(s) %s; choose from %s" % (", ".join(sorted(unknown)), ", ".join(STEPS)))
    os.makedirs(args.out, exist_ok=True)
    work = os.path.join(args.out, "work")
    os.makedirs(work, exist_ok=True)
    model = make_model(os.path.join(work, "model"), MODEL_MIB, MODEL_SHARDS)
    fake_nvml.build(NVML_DIR)
    results_path = os.path.join(args.out, "results.json")
    results = {}
    if os.path.exists(results_path):
        with open(results_path) as handle:
            results = json.load(handle)  # steps not run this time keep their last numbers
    results["settings"] = dict(SETTINGS, sim_args=SIM_ARGS, model_mib=MODEL_MIB, model_shards=MODEL_SHARDS)
    results["steps"] = [step for step in STEPS if step in steps]  # what this run measured: the report says so
    started = time.monotonic()
    results["load_average_at_start"] = [round(x, 2) for x in os.getloadavg()]
    def save():
        # After every step: a later failure keeps what was measured.
        with open(results_path, "w") as handle:
            json.dump(results, handle, indent=1, sort_keys=True)

    if "scenarios" in steps:
        results["scenarios"] = []
        for engine in ("sglang", "vllm"):
            for name, fault, event in SCENARIOS:
                if args.scenarios and "%s-%s" % (engine, name) not in args.scenarios.split(","):
                    continue
                print("bench: %s %s" % (engine, name), flush=True)
                results["scenarios"].append(run_scenario(engine, name, fault, event, model, work))
                save()
    for step, what, measure in (("cost", "the module's own cost", lambda: dict((phase, measure_cost(model, work, phase))
                                                                                  for phase in COST_PHASES)),
                                ("stacks", "the ranks' stacks: cost and the spinning hang", lambda: measure_stacks(model, work)),
                                ("churn", "rank churn and rank death: false failed verdicts and the death's lag",
                                 lambda: measure_churn(model, work)),
                                ("arrivals", "weights from the network: a download, a stream, a stopped download",
                                 lambda: measure_arrivals(model, work)),
                                ("history", "the whole-start ETA from the host's record of earlier starts",
                                 lambda: measure_history(model, work)),
                                ("throughput", "throughput of the simulated engine", lambda: measure_throughput(model, work)),
                                ("rerun", "deploy-k26.yml re-run on a ready test host", lambda: measure_rerun(work)),
                                ("fanout", "fan-out over 1, 2 and 4 test hosts", lambda: measure_fanout(work)),
                                ("fleet", "one play waiting on 1, 8, 32 and 128 hosts (local connections)",
                                 lambda: fleet.measure(model, work, ansible_env(), fleet_counts)),
                                ("containers", "the time a container start adds: venv, Podman, Docker on one test host",
                                 lambda: containers.measure(work)),
                                ("containerdemo", "make demo RUNTIME=podman and RUNTIME=docker, as a user runs them",
                                 lambda: container_demo.measure(work)),
                                ("realvllm", "the module watching a real vLLM CPU start", lambda: measure_real_vllm(work)),
                                ("disk", "loading from this disk: default loader, prefetch, eager (real vLLM CPU, simulated TP 8)",
                                 lambda: disk.measure(work, engines=disk_engines))):
        if step in steps:
            print("bench: %s" % what, flush=True)
            results[step] = measure()
            save()
    results["bench_seconds"] = round(time.monotonic() - started, 1)
    results["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    save()
    report.write(results, args.out)
    print("bench: wrote %s" % os.path.join(args.out, "report.md"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
