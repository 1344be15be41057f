"""Building replayed snapshot traces for the classifier, waiter and launcher tests, and the fake
clock and probe that replay them through the polling core without sleeping.

A Trace integrates rates into the cumulative counters a real /proc would show (CPU seconds,
read_bytes), so a case reads like the story it replays: "from t=20 to t=920 the tree reads
575 MiB/s at 0.9 cores, silently".
"""
from ansible_collections.modelwake.serving.plugins.module_utils.readiness.classifier import Classifier
from ansible_collections.modelwake.serving.plugins.module_utils.readiness.config import WaitConfig
from ansible_collections.modelwake.serving.plugins.module_utils.readiness.snapshot import Snapshot

MIB = 1024 * 1024


def result(kind_or_code, body=None):
    if kind_or_code is None:
        return None
    if isinstance(kind_or_code, int):
        return {"kind": "status", "code": kind_or_code, "body": body or "", "error": None}
    return {"kind": kind_or_code, "code": None, "body": None, "error": kind_or_code}


def http(health="refused", models=None, completion=None, ready=False, model=None):
    """A probe_ready() result; health/models/completion are a status code or a kind."""
    return {"health": result(health), "models": result(models), "completion": result(completion),
            "model": model, "ready": ready, "listening": health not in ("refused", "error")}


def config(**overrides):
    values = dict(url="http://127.0.0.1:30001", pid=100, engine="auto", timeout=3600,
                  stall_timeout=600, poll_interval=5)
    values.update(overrides)
    if "unit" in overrides:
        values["pid"] = None
    return WaitConfig(**values)


class Trace(object):
    """Cumulative process/GPU counters advanced by rates, one Snapshot per step."""

    def __init__(self, pids=(100, 101, 102), gpus=0, gpu_total=97887):
        self.t = None
        self.cpu = 3.0
        self.read = 0
        self.pids = list(pids)
        self.gpu_mem = [500] * gpus
        self.gpu_util = [0] * gpus
        self.gpu_total = gpu_total

    def step(self, t, cpu=0.0, read=0, lines=(), context=(), http_result=None, gpu_mem=None,
             gpu_util=None, alive=True, states=None, unit=None, listeners=None, pids=None):
        """cpu in cores and read in bytes/s since the previous step; gpu_mem absolute MiB per GPU."""
        dt = 0 if self.t is None else t - self.t
        self.t = t
        self.cpu += cpu * dt
        self.read += int(read * dt)
        if gpu_mem is not None:
            self.gpu_mem = list(gpu_mem)
        if gpu_util is not None:
            self.gpu_util = list(gpu_util)
        if pids is not None:
            self.pids = list(pids)
        live = self.pids if alive else []
        process = {"root_pid": self.pids[0], "alive": alive, "pids": live,
                   "cpu_seconds": round(self.cpu, 2), "read_bytes": self.read,
                   "states": dict((str(p), (states or {}).get(p, "S")) for p in live),
                   "comms": dict((str(p), "python3") for p in live)}
        gpus = [{"index": i, "uuid": "GPU-%d" % i, "memory_used_mib": m, "memory_total_mib": self.gpu_total,
                 "utilization": u} for i, (m, u) in enumerate(zip(self.gpu_mem, self.gpu_util))]
        return Snapshot(t=t, process=process, unit=unit, gpus=gpus, log_lines=list(lines),
                        log_context=list(context), http=http_result or http(), listeners=listeners)


def replay(cfg, snapshots, stop_at_terminal=True):
    """Verdicts for each snapshot, in order (up to and including the first terminal one)."""
    classifier = Classifier(cfg)
    verdicts = []
    for snap in snapshots:
        verdict = classifier.observe(snap)
        verdicts.append((snap.t, verdict))
        if stop_at_terminal and (verdict.terminal or verdict.phase == "ready"):
            break
    return verdicts


def phases_seen(verdicts):
    seen = []
    for _t, verdict in verdicts:
        if not seen or seen[-1] != verdict.phase:
            seen.append(verdict.phase)
    return seen


# ---------------------------------------------------------------------------------------------
# The stories, as traces.

SGLANG_PREFIX = "[2026-05-25 19:06:14 TP0] "


def k26_start(poll=10):
    """SGLang K2.6: ten silent minutes of disk reading, five of CPU-bound init, then ready."""
    trace = Trace(gpus=8)
    p = SGLANG_PREFIX
    yield trace.step(0, lines=["server_args=ServerArgs(model_path='/root/models/Kimi-K2.6', tp_size=8, port=30001)",
                               p + "Init torch distributed begin."])
    yield trace.step(10, cpu=1.2, lines=[p + "Init torch distributed ends. mem usage=0.52 GB",
                                         p + "Multimodal attention backend not set. Use triton_attn.",
                                         p + "Using CompressedTensorsWNA16MarlinMoEMethod"])
    # t=20..920: 575 MiB/s from disk, GPU memory climbing to 76 GiB per GPU, no log line.
    for t in range(20, 921, poll):
        mem = 500 + int(76000 * (t - 20) / 900.0)
        yield trace.step(t, cpu=0.9, read=575 * MIB, gpu_mem=[mem] * 8)
    # t=930..1220: CPU-bound init (Marlin JIT): no reads, GPU memory flat, utilisation 0.
    for t in range(920 + poll, 1221, poll):
        yield trace.step(t, cpu=1.5, gpu_mem=[76500] * 8, gpu_util=[0] * 8)
    yield trace.step(1230, cpu=1.5, lines=[p + "max_total_num_tokens=1000000, chunked_prefill_size=8192",
                                           "INFO:     Uvicorn running on http://0.0.0.0:30001 (Press CTRL+C to quit)"],
                     http_result=http(503))
    yield trace.step(1240, cpu=1.0, http_result=http(503))
    yield trace.step(1250, cpu=1.0, lines=[p + "The server is fired up and ready to roll!"],
                     http_result=http(200, models=200, completion=200, ready=True, model="/root/models/Kimi-K2.6"))


K26_EXPECTED_BYTES = 575 * MIB * 900


def vllm_prefix(role, pid):
    return "(%s pid=%d) INFO 11-30 04:40:00 [x.py:1] " % (role, pid)


def vllm_cpu_start(poll=5):
    """The measured vLLM CPU start (vllm-cpu.md): 17 s of silence after `Loading weights took`."""
    trace = Trace(pids=(100, 200, 300))
    api, core, worker = vllm_prefix("APIServer", 100), vllm_prefix("EngineCore", 200), vllm_prefix("Worker", 300)
    script = {
        0: (1.0, 0, []),
        10: (1.0, 0, ["Triton is installed, but doesn't include CPU backend."]),
        15: (1.0, 0, [api + "vLLM API server version 0.32.0", api + "non-default args: {'model': '/m'}"]),
        30: (1.0, 0, [core + "Initializing a V1 LLM engine (v0.32.0) with config: model='/m'"]),
        45: (1.0, 0, [worker + "Starting to load model /m..."]),
        50: (1.0, 120 * MIB, ["Loading safetensors checkpoint shards:   0% Completed | 0/3 [00:00<?, ?it/s]"]),
        55: (1.0, 120 * MIB, []),
        60: (1.0, 120 * MIB, ["Loading safetensors checkpoint shards:  33% Completed | 1/3 [00:08<00:16, 8.1s/it]"]),
        65: (1.0, 120 * MIB, ["Loading safetensors checkpoint shards:  67% Completed | 2/3 [00:16<00:08, 8.0s/it]"]),
        70: (1.0, 120 * MIB, ["Loading safetensors checkpoint shards: 100% Completed | 3/3 [00:23<00:00, 7.8s/it]",
                              worker + "Loading weights took 23.50 seconds"]),
    }
    # 70..85: silence, 0.75 core of weight post-processing, no disk.
    for t in range(75, 86, poll):
        script[t] = (0.75, 0, [])
    script[90] = (0.8, 0, [worker + "Warming up model for the compilation..."])
    for t in range(95, 131, poll):
        script[t] = (1.8, 0, [])  # g++ children: seen only as the parent's reaped-children ticks
    script[135] = (1.0, 0, [worker + "Initial profiling/warmup run took 1.19 s", worker + "Warming up done.",
                            core + "init engine (profile, create kv cache, warmup model) took 50.66 s"])
    for t in sorted(script):
        cpu, read, lines = script[t]
        yield trace.step(t, cpu=cpu, read=read, lines=lines)
    yield trace.step(140, cpu=0.5, lines=[api + "Starting vLLM server on http://0.0.0.0:8011",
                                          "INFO:     Application startup complete."],
                     http_result=http(200, models=200, completion=200, ready=True, model="tiny"))


SHM = "(EngineCore pid=200) WARNING 11-30 04:40:00 [shm_broadcast.py:466] No available shared memory broadcast block " \
      "found in 60 seconds. This typically happens when some processes are hanging or doing some time-consuming work"


def hang(stall_timeout, poll, until):
    """Alive, GPUs at 100 %, but no CPU, disk, GPU-memory or log change after t=100 (SIGSTOPped worker)."""
    trace = Trace(pids=(100, 200, 300), gpus=2)
    api = vllm_prefix("APIServer", 100)
    yield trace.step(0, lines=[api + "vLLM API server version 0.32.0",
                               vllm_prefix("Worker", 300) + "Starting to load model /m..."])
    for t in range(poll, 101, poll):
        yield trace.step(t, cpu=1.0, gpu_mem=[500 + t * 10] * 2)
    t = 100 + poll
    while t <= until:
        lines = [SHM] if t % 60 == 0 else []
        yield trace.step(t, cpu=0.0, gpu_mem=[1500] * 2, gpu_util=[100] * 2, lines=lines,
                         states={300: "T"}, http_result=http("refused"))
        t += poll


class FakeClock(object):
    """The monotonic clock and the sleep the polling core is given: sleeping only moves the clock."""

    def __init__(self):
        self.now = 1000.0  # monotonic clocks do not start at 0
        self.sleeps = []

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        assert seconds >= 0
        self.sleeps.append(seconds)
        self.now += seconds


class ReplayProbe(object):
    """Answers snapshot(t) from a story function; each look costs `cost` seconds of the clock."""

    def __init__(self, clock, story, cost=0.0):
        self.clock = clock
        self.story = story
        self.cost = cost
        self.trace = Trace(pids=(100, 200, 300))
        self.looks = []

    def snapshot(self, t, remaining=None, stacks=False):
        self.looks.append((t, remaining))
        self.clock.now += self.cost
        return self.story(self.trace, t)
