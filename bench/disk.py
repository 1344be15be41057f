"""`make bench`'s disk step: how fast the weights come off this machine's disk, three ways.

Issue #34: the engines' default loaders fault safetensors in through mmap page by page, far below
what the disk can do. This step generates a random-weight model of ~3 GB that the pinned vLLM CPU
build loads (tools/vllm_cpu.py's generator with a bigger Llama), empties the page cache before each
run (`sync; echo 3 > /proc/sys/vm/drop_caches`, checked with mincore), and measures

- the disk's cold sequential rate on the model's own files (host/storage.measure_read_rate,
  4 readers), the denominator of every ratio;
- the real vLLM CPU server: default loader, prefetch (host/prefetch.prefetch, 4 readers) then
  the default loader, and `--safetensors-load-strategy eager`; time to the first completion
  answered, and the load phase from vLLM's own `Loading weights took X seconds`;
- the simulated TP-8 engine (engines/sim, vLLM mode, `--shard-reads every-rank`: each of its 8
  ranks reads every shard whole through the shared page cache, as the real engines' TP ranks do)
  the same three ways: its reads through mmap (`--read-mode mmap`, the default loader's way),
  prefetch then those, and `pread` of every shard (`--read-mode pread`, its eager equivalent).

`bench/run.py --only disk --disk-engines sim` measures the simulator's rows alone (a minute or
two, without the real vLLM's quarter of an hour).

The pure parts (the model's planned size, the log parsing, the ratios and the goal) are tested in
tests/unit/test_bench_disk.py; the measurement itself runs only in `make bench`.
"""
import hashlib
import json
import os
import re
import statistics
import subprocess
import time

from ansible_collections.modelwake.serving.plugins.module_utils.host import prefetch, storage

# ~3 GB of float32: most bytes in the embedding and lm_head (240,000 x 1024 each, 0.98 GB, untied),
# 16 thin layers (67 MB each) so the CPU's post-processing and warm-up stay short and the load
# dominates. The model vocab is larger than the tokenizer's: completions come back as "", which is
# still a completion answered (a forward pass ran).
ARCH = dict(hidden_size=1024, intermediate_size=4096, num_hidden_layers=16, num_attention_heads=16,
            num_key_value_heads=16, head_dim=64, max_position_embeddings=512, torch_dtype="float32",
            vocab_size=240000)
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
MAX_SHARD = "1000MB"  # transformers' max_shard_size: ~1 GB shards, as the checkpoints on the hub
MARKER = ".modelwake-bench-model"
# The ways to load, in the order the step runs them.
METHODS = ("default", "prefetch", "eager")
ENGINES = ("vllm", "sim")
PREFETCH_READERS = 4
DISK_READERS = 4
GOAL_SHARE = 0.8  # the goal: the load phase at 80 % or more of the disk's measured rate

WEIGHTS_LINE = re.compile(r"Loading weights took ([0-9.]+) seconds")


# -- the generated model ------------------------------------------------------------------------

def parameter_count(arch):
    """Parameters of a LlamaForCausalLM with this config (untied lm_head, RMSNorm weights only)."""
    hidden, layers = arch["hidden_size"], arch["num_hidden_layers"]
    heads, kv_heads, head_dim = arch["num_attention_heads"], arch["num_key_value_heads"], arch["head_dim"]
    attention = 2 * hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim  # q, o; k, v
    mlp = 3 * hidden * arch["intermediate_size"]  # gate, up, down
    norms = 2 * hidden
    embeddings = 2 * arch["vocab_size"] * hidden  # embed_tokens and lm_head
    return embeddings + layers * (attention + mlp + norms) + hidden  # + the final norm


def planned_bytes(arch):
    """The tensor bytes the shards hold (each shard adds a small JSON header)."""
    return parameter_count(arch) * DTYPE_BYTES[arch["torch_dtype"]]


def cache_dir():
    """MODELWAKE_CACHE/bench: generated once, kept between runs (the tests' caches live beside it)."""
    return os.path.join(os.environ.get("MODELWAKE_CACHE")
                        or os.path.join(os.path.expanduser("~"), ".cache", "modelwake"), "bench")


def model_spec():
    from tools import vllm_cpu
    return {"arch": ARCH, "tokenizer_vocab": vllm_cpu.TOKENIZER_VOCAB, "chat_template": vllm_cpu.CHAT_TEMPLATE,
            "max_shard_size": MAX_SHARD}


def make_model(dest=None):
    """The bench model in dest (default MODELWAKE_CACHE/bench/disk-model), generated unless the
    marker says it holds this spec. Every file is fsynced: a page written moments ago is dirty, and
    neither drop_caches nor DONTNEED drops a dirty page, so the first cold run would read the cache."""
    from tools import vllm_cpu
    dest = dest or os.path.join(cache_dir(), "disk-model")
    spec = model_spec()
    wanted = json.dumps(dict(spec, generator=hashlib.sha256(vllm_cpu._MAKE_MODEL.encode()).hexdigest()[:16]),
                        sort_keys=True) + "\n"
    marker = os.path.join(dest, MARKER)
    if os.path.exists(marker):
        with open(marker) as handle:
            if handle.read() == wanted:
                return dest
    python = vllm_cpu.ensure_venv()
    os.makedirs(os.path.dirname(os.path.abspath(dest)), exist_ok=True)
    with vllm_cpu._built_aside(dest, ".disk-model.partial-") as partial:
        os.chmod(partial, 0o755)
        subprocess.run([python, "-c", vllm_cpu._MAKE_MODEL, partial, json.dumps(spec)], env=vllm_cpu.engine_env(),
                       check=True)
        for name in os.listdir(partial):
            path = os.path.join(partial, name)
            os.chmod(path, 0o644)
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        with open(os.path.join(partial, MARKER), "w") as handle:
            handle.write(wanted)
    return dest


def shards(model_dir):
    return storage.model_files(model_dir)


# -- what the logs say, and the ratios ----------------------------------------------------------

def load_seconds(text):
    """The load phase by the engine's own account, `Loading weights took X seconds`
    (default_loader.py): one line from vLLM's single CPU worker, one per rank from the simulated
    TP-8 engine, whose load ends with its slowest rank: {"weights_s": the largest X}, None when absent.
    (The GPU runner's `Model loading took ... seconds` is not logged by the CPU build.)"""
    found = [float(value) for value in WEIGHTS_LINE.findall(text)]
    return {"weights_s": max(found) if found else None}


def share_of_disk(model_bytes, seconds, disk_rate):
    """(load rate in bytes/s, its share of the disk's rate), None for what cannot be computed."""
    if not seconds or seconds <= 0:
        return None, None
    rate = model_bytes / seconds
    return rate, (rate / disk_rate if disk_rate else None)


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def summarise(runs, model_bytes, disk_rate, goal=GOAL_SHARE):
    """One row per method from its runs ({method, ready_s, weights_s, prefetch_s, ...}): medians,
    the load rate's share of the disk rate per run, and the goal (share >= goal) met in how many."""
    rows = []
    for method in [m for m in METHODS if any(r["method"] == m for r in runs)]:
        mine = [r for r in runs if r["method"] == method]
        shares = [share_of_disk(model_bytes, r.get("weights_s"), disk_rate)[1] for r in mine]
        measured = [s for s in shares if s is not None]
        prefetch_rates = [r["prefetch_rate"] for r in mine if r.get("prefetch_rate")]
        rows.append({"method": method, "runs": len(mine), "ready_s": median(r.get("ready_s") for r in mine),
                     "ready_with_prefetch_s": median(r.get("ready_with_prefetch_s") for r in mine),
                     "weights_s": median(r.get("weights_s") for r in mine),
                     "load_rate": share_of_disk(model_bytes, median(r.get("weights_s") for r in mine), disk_rate)[0],
                     "shares": shares, "share": median(measured),
                     "goal_runs": sum(1 for s in measured if s >= goal),
                     "goal_met": bool(measured) and median(measured) >= goal,
                     "prefetch_s": median(r.get("prefetch_s") for r in mine),
                     "prefetch_rate": median(prefetch_rates),
                     "prefetch_share": median(prefetch_rates) / disk_rate if prefetch_rates and disk_rate else None})
    return rows


# -- the measurement (root, this machine) ----------------------------------------------------------

def drop_caches(files):
    """`sync; echo 3 > /proc/sys/vm/drop_caches`, then how many of the model's bytes are still
    resident (mincore): the guest's page cache only, a hypervisor's cache below is out of reach."""
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as handle:
        handle.write("3\n")
    return sum(storage.resident_bytes(path) for path, _size in files)


def measure_disk(files, rounds=3):
    """The disk's cold rate on the model's own files: `rounds` reads with DISK_READERS readers and
    one with a single reader, each after drop_caches."""
    total = sum(size for _path, size in files)
    reads = []
    for readers in [DISK_READERS] * rounds + [1]:
        resident = drop_caches(files)
        got = storage.measure_read_rate(files, sample_bytes=total, max_seconds=120, readers=readers)
        reads.append({"readers": got["readers"], "rate": got["rate_bytes_per_s"], "bytes": got["sampled_bytes"],
                      "seconds": round(got["seconds"], 2), "cold": got["cold"],
                      "resident_after_drop": resident})
    return {"reads": reads, "rate": median(r["rate"] for r in reads[:rounds])}


def _wait_ready(url, proc, deadline, answer):
    """Seconds until `answer(url)` succeeds (a completion answered), or None when the process exits
    or the deadline passes first."""
    started = time.monotonic()
    while time.monotonic() - started < deadline:
        if proc.poll() is not None:
            return None
        if answer(url):
            return time.monotonic() - started
        time.sleep(0.5)
    return None


def run_vllm(model, files, method, log_path, deadline=900):
    """One cold start of the real vLLM CPU server, loaded `method`'s way."""
    from tools import vllm_cpu
    record = {"method": method, "resident_after_drop": drop_caches(files)}
    began = time.monotonic()
    if method == "prefetch":
        done = prefetch.prefetch(files, readers=PREFETCH_READERS)
        record.update(prefetch_s=round(done["seconds"], 2), prefetch_rate=done["rate_bytes_per_s"])
    port = vllm_cpu.free_port()
    command = vllm_cpu.serve_command(model, port, enforce_eager=True, disk_heavy=True)
    if method == "eager":
        command += ["--safetensors-load-strategy", "eager"]
    record["command"] = " ".join(["vllm"] + command[3:])
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=vllm_cpu.engine_env(), start_new_session=True)
    started = time.monotonic()
    try:
        ready = _wait_ready("http://127.0.0.1:%d" % port, proc, deadline,
                            lambda url: vllm_cpu.completion(url, timeout=60)[0] == 200)
    finally:
        vllm_cpu.stop_tree(proc)
    with open(log_path, errors="replace") as handle:
        record.update(load_seconds(handle.read()))
    record["ready_s"] = None if ready is None else round(ready, 1)
    record["ready_with_prefetch_s"] = None if ready is None else round(started - began + ready, 1)
    if ready is None:
        record["why"] = "no completion answered (exit %s): see %s" % (proc.returncode, log_path)
    return record


# Every rank reads every shard whole through the page cache (a real TP engine's loading), unpaced:
# the disk and the page cache set the rate.
SIM_ARGS = ["--tp", "8", "--fake-gpus", "--fake-gpu-count", "8", "--disable-cuda-graph", "--start-seconds", "0.5",
            "--init-seconds", "0.5", "--warmup-seconds", "0.5", "--load-rate-mib", "1000000",
            "--shard-reads", "every-rank"]
# The simulator's counterparts of vLLM's ways: its default loader faults the shards in through
# mmap; its eager strategy reads each file whole with read(2).
SIM_METHOD_ARGS = {"default": ["--read-mode", "mmap"], "prefetch": ["--read-mode", "mmap"],
                   "eager": ["--read-mode", "pread"]}


def sim_args(method):
    return SIM_ARGS + SIM_METHOD_ARGS[method]


def run_sim(model, files, method, log_path, work, deadline=600):
    """One cold start of the simulated TP-8 engine (vLLM mode, unpaced, every rank reading every
    shard) on the same files."""
    from bench import simrun
    record = {"method": method, "resident_after_drop": drop_caches(files)}
    began = time.time()
    if method == "prefetch":
        done = prefetch.prefetch(files, readers=PREFETCH_READERS)
        record.update(prefetch_s=round(done["seconds"], 2), prefetch_rate=done["rate_bytes_per_s"])
    gpu_dir = os.path.join(work, "sim-gpu")
    os.makedirs(gpu_dir, exist_ok=True)
    if os.path.exists(log_path):
        os.remove(log_path)
    record["command"] = " ".join(sim_args(method))
    sim = simrun.SimRun("vllm", model, log_path, sim_args(method), env={"MODELWAKE_FAKE_GPU_DIR": gpu_dir}).start()
    try:
        ready_at = sim.wait_for("Application startup complete.", deadline)
    finally:
        sim.stop()
    with open(log_path, errors="replace") as handle:
        record.update(load_seconds(handle.read()))
    ready = None if ready_at is None else ready_at - sim.started
    record["ready_s"] = None if ready is None else round(ready, 1)
    record["ready_with_prefetch_s"] = None if ready is None else round(ready_at - began, 1)
    if ready is None:
        record["why"] = "no ready line (exit %s): see %s" % (sim.exit_code, log_path)
    return record


def measure(work, runs=3, progress=print, engines=ENGINES):
    """The whole step: {model, disk, vllm, sim} (bench/report.py renders it). `engines`: which
    engines' rows to measure (the others' lists stay empty)."""
    from tools import vllm_cpu
    base = os.path.join(work, "disk")
    os.makedirs(base, exist_ok=True)
    # The venv generates the model (cached once made) and runs the real vLLM.
    if not os.path.exists(vllm_cpu.venv_python()):
        return {"status": "not measured", "why": "no real vLLM CPU venv in the cache: run "
                "python3 tools/vllm_cpu.py ensure-venv"}
    if os.geteuid() != 0:
        return {"status": "not measured", "why": "dropping the page cache needs root"}
    started = time.monotonic()
    model = make_model()
    files = shards(model)
    model_bytes = sum(size for _path, size in files)
    result = {"status": "measured", "model": {"path": model, "bytes": model_bytes, "shards": [s for _p, s in files],
                                              "arch": ARCH, "generated_s": round(time.monotonic() - started, 1)},
              "runs": runs, "goal_share": GOAL_SHARE, "prefetch_readers": PREFETCH_READERS,
              "mem_available_bytes": storage.read_meminfo().get("MemAvailable"), "engines": list(engines)}
    progress("bench: disk: the disk's cold rate on %d shards" % len(files))
    result["disk"] = measure_disk(files)
    result["vllm"], result["sim"] = [], []
    for engine, run in (("vllm", run_vllm), ("sim", run_sim)):
        if engine not in engines:
            continue
        for number in range(1, runs + 1):
            for method in METHODS:  # interleaved: a slow minute of the shared machine hits every method
                progress("bench: disk: %s %s run %d" % (engine, method, number))
                log_path = os.path.join(base, "%s-%s-%d.log" % (engine, method, number))
                args = (model, files, method, log_path) + ((base,) if engine == "sim" else ())
                record = run(*args)
                record["run"] = number
                result[engine].append(record)
    result["disk_after"] = measure_disk(files, rounds=1)
    disk_rate = result["disk"]["rate"]
    result["summary"] = {engine: summarise(result[engine], model_bytes, disk_rate) for engine in ("vllm", "sim")}
    return result
