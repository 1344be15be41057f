"""The simulated engine as a real process: ports, HTTP semantics, process tree, disk reads, faults.

Every engine is started in its own session on a free loopback port, with a tiny model and short
phases, and killed by process group in a finalizer whatever the test's outcome.
"""
import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request

import pytest

from tests.helpers import FAKES, simharness, until
from tests.helpers.simharness import SimRunner, descendants, make_model

NVIDIA_SMI = os.path.join(FAKES, "nvidia-smi")
FAST = ["--start-seconds", "0.2", "--init-seconds", "0.6", "--warmup-seconds", "0.6", "--load-rate-mib", "64"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_model(tmp_path_factory.mktemp("model"))


@pytest.fixture
def start_sim(tmp_path):
    runner = SimRunner(tmp_path, FAST)
    yield runner.start
    runner.stop_all()


def http(url, body=None, headers=None, timeout=5):
    """(status, parsed body or text); a refused connection raises ConnectionRefusedError."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers=dict(headers or {}, **{"Content-Type": "application/json"}))
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            raw, code = resp.read(), resp.status
    except urllib.error.HTTPError as exc:
        raw, code = exc.read(), exc.code
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, ConnectionRefusedError):
            raise exc.reason
        raise
    try:
        return code, json.loads(raw or b"null")
    except ValueError:
        return code, raw.decode()


def port_open(port):
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def proc_field(pid, name):
    if name == "comm":
        with open("/proc/%d/comm" % pid) as fileobj:
            return fileobj.read().strip()
    with open("/proc/%d/io" % pid) as fileobj:
        for line in fileobj:
            key, _, value = line.partition(":")
            if key == name:
                return int(value)
    raise KeyError(name)


def cpu_ticks(pids):
    total = 0
    for pid in pids:
        try:
            with open("/proc/%d/stat" % pid) as fileobj:
                fields = fileobj.read().rsplit(")", 1)[1].split()
            total += sum(int(v) for v in fields[11:15])  # utime stime cutime cstime
        except OSError:
            pass
    return total


# How often the checks below look: the simulated engine's phases last a second or two.
LOOK = 0.05


def test_sglang_port_closed_while_loading_then_models_before_health_then_answers(model_dir, start_sim):
    sim = start_sim("sglang", model_dir, "--load-rate-mib", "16", "--warmup-seconds", "1.5")
    sim.wait_log("Load weight begin.")
    with pytest.raises(ConnectionRefusedError):
        http(sim.url + "/health")
    sim.wait_log("Uvicorn running on http://127.0.0.1:%d" % sim.port)
    # The trap: /v1/models and /get_model_info answer while /health still says 503.
    assert http(sim.url + "/v1/models")[0] == 200
    assert http(sim.url + "/get_model_info")[0] == 200
    assert http(sim.url + "/health")[0] == 503
    code, body = http(sim.url + "/v1/completions", {"model": model_dir, "prompt": "2+2=", "max_tokens": 4})
    assert code == 503
    sim.wait_log("The server is fired up and ready to roll!")
    assert http(sim.url + "/health")[0] == 200
    code, body = http(sim.url + "/v1/completions",
                      {"model": model_dir, "prompt": "2+2=", "max_tokens": 4, "temperature": 0})
    assert code == 200
    assert "4" in body["choices"][0]["text"]
    assert body["usage"]["completion_tokens"] >= 1 and body["usage"]["prompt_tokens"] >= 1
    log = sim.log()
    assert "\rLoading safetensors checkpoint shards: 100% Completed | 8/8 [" in log
    order = [log.index(s) for s in ("server_args=ServerArgs(", "Init torch distributed begin.",
                                    "Load weight begin. avail mem=", "Load weight end. elapsed=",
                                    "KV Cache is allocated. #tokens:", "max_total_num_tokens=",
                                    "INFO:     Uvicorn running on", '"GET /get_model_info HTTP/1.1" 200 OK',
                                    '"POST /generate HTTP/1.1" 200 OK', "The server is fired up and ready to roll!")]
    assert order == sorted(order)


def test_sglang_schedulers_are_titled_children(model_dir, start_sim):
    sim = start_sim("sglang", model_dir, "--tp", "2", "--load-rate-mib", "8")
    sim.wait_log("Load weight begin.")
    comms = sorted(proc_field(pid, "comm") for pid in sim.tree())
    assert comms == ["sglang::schedul", "sglang::schedul"]
    # The full title is in the command line, as setproctitle leaves it: where the rank is read.
    titles = []
    for pid in sim.tree():
        with open("/proc/%d/cmdline" % pid, "rb") as handle:
            titles.append(handle.read().rstrip(b"\0").decode())
    assert sorted(titles) == ["sglang::scheduler_TP0", "sglang::scheduler_TP1"]


def test_vllm_grandchild_reads_the_weights_and_health_is_up_when_listening(model_dir, start_sim):
    sim = start_sim("vllm", model_dir, "--load-rate-mib", "16", "--served-model-name", "k26")
    sim.wait_log("Starting to load model")
    worker = until("worker", lambda: [p for p in sim.tree() if proc_field(p, "comm") == "VLLM::Worker"], 15, LOOK)[0]
    core = [p for p in sim.tree() if proc_field(p, "comm") == "VLLM::EngineCor"][0]
    assert worker in descendants(core) and core in descendants(sim.proc.pid)
    first = proc_field(worker, "read_bytes")
    until("read_bytes growth", lambda: proc_field(worker, "read_bytes") > first + 4 * 1024 * 1024, 15, LOOK)
    assert not port_open(sim.port)  # bound early but not listening
    sim.wait_log("Application startup complete.")
    until("listening", lambda: port_open(sim.port), 15, LOOK)
    assert http(sim.url + "/health")[0] == 200
    assert http(sim.url + "/v1/models")[1]["data"][0]["id"] == "k26"
    code, body = http(sim.url + "/v1/chat/completions",
                      {"model": "k26", "messages": [{"role": "user", "content": "2+2="}], "max_tokens": 4})
    assert code == 200 and "4" in body["choices"][0]["message"]["content"]
    assert http(sim.url + "/v1/completions", {"model": "other", "prompt": "x"})[0] == 404
    log = sim.log()
    assert "(Worker pid=%d) \rLoading safetensors checkpoint shards: 100%% Completed | 8/8" % worker in log
    assert "Loading weights took" in log and "init engine (profile, create kv cache, warmup model) took" in log


def test_vllm_truncated_shard_fails_with_the_safetensors_root_cause(model_dir, tmp_path, start_sim):
    broken = tmp_path / "broken"
    broken.mkdir()
    for name in os.listdir(model_dir):
        os.symlink(os.path.join(model_dir, name), str(broken / name))
    victim = broken / "model-00004-of-00008.safetensors"
    victim.unlink()
    with open(os.path.join(model_dir, victim.name), "rb") as src:
        victim.write_bytes(src.read(1000000))
    sim = start_sim("vllm", str(broken))
    assert sim.wait_exit() == 1
    log = sim.log()
    assert ("safetensors_rust.SafetensorError: Error while deserializing header: "
            "incomplete metadata, file not fully covered") in log
    assert "RuntimeError: Engine core initialization failed. See root cause above." in log
    assert log.index("SafetensorError") < log.index("RuntimeError: Engine core initialization failed")
    assert not sim.tree()


def test_missing_config_fails_like_the_engine(tmp_path, start_sim):
    sim = start_sim("sglang", str(tmp_path))
    assert sim.wait_exit() == 1
    assert "does not appear to have a file named config.json" in sim.log()
    sim = start_sim("vllm", str(tmp_path))
    assert sim.wait_exit() == 1
    assert "Invalid repository ID or local directory specified" in sim.log()


@pytest.mark.parametrize("engine,lines", [
    ("vllm", ["Worker proc VllmWorker-0 died unexpectedly (exit code: -9)", "EngineDeadError"]),
    ("sglang", ["Rank 0 scheduler is dead. Please check if there are relevant logs.", "Exit code: -9"]),
])
def test_crash0_exits_zero_after_rank0_died(model_dir, start_sim, engine, lines):
    sim = start_sim(engine, model_dir, "--fault", "crash0:loading", "--fault-after", "0.1")
    assert sim.wait_exit() == 0
    log = sim.log()
    for line in lines:
        assert line in log
    assert not sim.tree()


def test_crash1_in_starting_exits_one_with_a_traceback(model_dir, start_sim):
    sim = start_sim("sglang", model_dir, "--fault", "crash1:starting")
    assert sim.wait_exit() == 1
    log = sim.log()
    assert "Scheduler hit an exception: Traceback (most recent call last):" in log
    assert "AttributeError: type object 'CompressionFormat' has no attribute 'nvfp4_pack_quantized'" in log
    assert "Received sigquit from a child proces. It usually means the child failed." in log


def activity_over(sim, seconds):
    """What the engine's tree did in `seconds`: (CPU ticks, bytes read from disk, characters logged)."""
    pids = [sim.proc.pid] + sim.tree()
    ticks, size = cpu_ticks(pids), len(sim.log())
    reads = sum(proc_field(p, "read_bytes") for p in sim.tree())
    time.sleep(seconds)
    return (cpu_ticks(pids) - ticks, sum(proc_field(p, "read_bytes") for p in sim.tree()) - reads,
            len(sim.log()) - size)


def test_hang_while_loading_stops_cpu_reads_and_output(model_dir, start_sim):
    sim = start_sim("sglang", model_dir, "--load-rate-mib", "16", "--fault", "hang:loading", "--fault-after", "0.3")
    sim.wait_log("Load weight begin.")
    time.sleep(0.8)
    ticks, reads, output = activity_over(sim, 1.5)
    assert ticks <= 3  # scheduler ticks of a sleeping tree, not a busy loop
    assert reads == 0 and output == 0
    assert sim.proc.poll() is None and not port_open(sim.port)


def test_a_held_load_pauses_before_its_last_shard_until_its_file_is_removed(model_dir, tmp_path, start_sim):
    # 32 MiB at 64 MiB/s would be read in half a second: the hold keeps it loading, with nothing moving.
    hold = tmp_path / "hold"
    hold.write_text("")
    sim = start_sim("sglang", model_dir, "--tp", "2", "--hold-load", str(hold))
    sim.wait_log("Completed | 7/8")
    # Rank 0 draws the bar; on a busy machine rank 1 may still be reading shard 7. Once both are
    # held, nothing moves: wait for that moment instead of guessing how long it takes.
    until("both ranks held (no more reads)", lambda: activity_over(sim, 0.5)[1] == 0, 60, LOOK)
    ticks, reads, output = activity_over(sim, 1.5)
    assert ticks <= 5 and reads == 0 and output == 0
    assert "8/8" not in sim.log() and "Load weight end" not in sim.log()
    hold.unlink()
    # Rank 0's own end: it follows its bar's last line (rank 1, which draws none, may end first).
    sim.wait_log("TP0] Load weight end.")
    assert "Completed | 8/8" in sim.log()
    until("listening after the release", lambda: port_open(sim.port), 15, LOOK)


def test_silent_init_burns_cpu_without_output(model_dir, start_sim):
    sim = start_sim("sglang", model_dir, "--disable-cuda-graph", "--init-seconds", "3")
    sim.wait_log("Using CompressedTensorsWNA16MarlinMoEMethod")
    pids = [sim.proc.pid] + sim.tree()
    ticks, size = cpu_ticks(pids), len(sim.log())
    time.sleep(1.0)
    # A busy loop: well above the ~0 ticks of a sleeping tree even on a shared 2-core machine.
    assert cpu_ticks(pids) - ticks >= 15
    assert len(sim.log()) == size


def test_vllm_stopped_worker_keeps_health_but_completions_hang(model_dir, start_sim):
    sim = start_sim("vllm", model_dir)
    sim.wait_log("Application startup complete.")
    until("listening", lambda: port_open(sim.port), 15, LOOK)
    worker = [p for p in sim.tree() if proc_field(p, "comm") == "VLLM::Worker"][0]
    os.kill(worker, signal.SIGSTOP)
    try:
        assert http(sim.url + "/health")[0] == 200
        with pytest.raises(socket.timeout):
            http(sim.url + "/v1/completions", {"model": model_dir, "prompt": "2+2=", "max_tokens": 4}, timeout=1)
    finally:
        os.kill(worker, signal.SIGCONT)


def test_port_conflict_is_errno_98(model_dir, start_sim):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen(1)
        port = holder.getsockname()[1]
        for engine in ("vllm", "sglang"):
            sim = start_sim(engine, model_dir, port=port)
            assert sim.wait_exit() == 1
            assert "OSError: [Errno 98] Address already in use" in sim.log()


def test_api_key_guards_v1_but_not_health(model_dir, start_sim):
    sim = start_sim("vllm", model_dir, env={"MODELWAKE_API_KEY": "s3cret-key"})
    sim.wait_log("Application startup complete.")
    until("listening", lambda: port_open(sim.port), 15, LOOK)
    assert http(sim.url + "/health")[0] == 200
    assert http(sim.url + "/v1/models")[0] == 401
    assert http(sim.url + "/v1/models", headers={"Authorization": "Bearer wrong"})[0] == 401
    assert http(sim.url + "/v1/models", headers={"Authorization": "Bearer s3cret-key"})[0] == 200
    assert "s3cret-key" not in sim.log()


def test_sigterm_leaves_no_process_and_no_holder(model_dir, tmp_path, start_sim):
    gpu_dir = tmp_path / "gpu"
    sim = start_sim("vllm", model_dir, "--tp", "2", "--fake-gpus", "--load-rate-mib", "8",
                    env={"MODELWAKE_FAKE_GPU_DIR": str(gpu_dir)})
    sim.wait_log("Starting to load model")
    tree = until("tree", lambda: len(sim.tree()) >= 3 and sim.tree(), 15, LOOK)
    until("holders", lambda: len([n for n in os.listdir(str(gpu_dir)) if n.startswith("holder-")]) == 2, 15, LOOK)
    # Mid-load the scripted GPUs show memory climbing: above the CUDA context, below the weights.
    def first_two():
        values = [int(v) for v in smi(str(gpu_dir), "--query-gpu=memory.used",
                                      "--format=csv,noheader,nounits").split()[:2]]
        return values if all(v > 512 for v in values) else None

    used = until("memory climbing", first_two, 15, LOOK)
    assert all(v < 76000 * 0.8 for v in used)
    sim.proc.send_signal(signal.SIGTERM)
    assert sim.wait_exit() == 0
    until("tree gone", lambda: not any(os.path.exists("/proc/%d" % p) for p in tree), 5, LOOK)
    assert [n for n in os.listdir(str(gpu_dir)) if n.startswith("holder-")] == []


def smi(gpu_dir, *args):
    out = subprocess.run([NVIDIA_SMI] + list(args), env=dict(os.environ, MODELWAKE_FAKE_GPU_DIR=gpu_dir),
                         stdout=subprocess.PIPE, universal_newlines=True, check=True)
    return out.stdout


def test_nvidia_smi_reports_the_sims_gpus_and_ignores_dead_holders(model_dir, tmp_path, start_sim):
    gpu_dir = str(tmp_path / "gpu")
    os.makedirs(gpu_dir)
    with open(os.path.join(gpu_dir, "holder-stale.json"), "w") as fileobj:
        json.dump({"pid": 2 ** 22 + 12345, "name": "ddtree", "gpus": {"0": {"memory_mib": 55000, "utilization": 0}}},
                  fileobj)
    sim = start_sim("sglang", model_dir, "--tp", "2", "--fake-gpus", "--fake-gpu-count", "4",
                    "--gpu-memory-mib", "70000", env={"MODELWAKE_FAKE_GPU_DIR": gpu_dir})
    sim.wait_log("The server is fired up and ready to roll!")
    rows = smi(gpu_dir, "--query-gpu=index,memory.used,utilization.gpu", "--format=csv,noheader,nounits")
    used = [int(line.split(", ")[1]) for line in rows.splitlines()]
    assert used == [70000, 70000, 0, 0]  # the dead holder's 55000 MiB on GPU 0 is free
    apps = smi(gpu_dir, "--query-compute-apps=pid,process_name,used_memory", "--format=csv,noheader")
    assert sorted(line.split(", ")[1] for line in apps.splitlines()) == ["sglang::scheduler_TP0",
                                                                         "sglang::scheduler_TP1"]
    assert all(line.endswith(", 70000 MiB") for line in apps.splitlines())


def test_vllm_hang_after_ready_keeps_health_but_completions_never_answer(model_dir, start_sim):
    sim = start_sim("vllm", model_dir, "--fault", "hang:ready", "--fault-after", "0.5")
    sim.wait_log("Application startup complete.")
    until("listening", lambda: port_open(sim.port), 15, LOOK)
    time.sleep(1.5)  # past --fault-after plus one serving-loop wake-up
    assert http(sim.url + "/health")[0] == 200
    with pytest.raises(socket.timeout):
        http(sim.url + "/v1/completions", {"model": model_dir, "prompt": "2+2=", "max_tokens": 4}, timeout=1)
    assert sim.proc.poll() is None


# --- arrivals: a hub download, a streamed load; Python at work; one rank dead ------------------
@pytest.fixture
def harness():
    """simharness's hub server and py-spy finder."""
    servers = []

    def hub(directory, repo="org/k26", **options):
        server = simharness.start_hub(directory, repo, **options)
        servers.append(server)
        return server

    yield type("Harness", (), {"hub": staticmethod(hub), "py_spy": staticmethod(simharness.py_spy)})
    for server in servers:
        server.stop()


def io_counters(pid):
    with open("/proc/%d/io" % pid) as fileobj:
        return {key: int(value) for key, _, value in (line.partition(":") for line in fileobj)}


def stat_fields(pid):
    """/proc/<pid>/stat's fields after the command name: [0] is the state, [49] the exit code."""
    with open("/proc/%d/stat" % pid) as fileobj:
        return fileobj.read().rsplit(")", 1)[1].split()


def rank_pids(sim, title):
    """{rank: pid} of the tree's processes titled `title<rank>` (e.g. sglang::scheduler_TP)."""
    found = {}
    for pid in sim.tree():
        try:
            with open("/proc/%d/cmdline" % pid, "rb") as fileobj:
                name = fileobj.read().rstrip(b"\0").decode()
        except OSError:
            continue
        if name.startswith(title) and name[len(title):].isdigit():
            found[int(name[len(title):])] = pid
    return found


def test_hub_download_writes_the_cache_layout_with_recv_not_read(model_dir, tmp_path, start_sim, harness):
    server = harness.hub(model_dir, rate_mib=8)
    cache = tmp_path / "hub-cache"
    sim = start_sim("vllm", "org/k26", "--tp", "2",
                    env={"HF_ENDPOINT": server.url, "HF_HUB_CACHE": str(cache)})
    blobs = cache / "models--org--k26" / "blobs"
    until("a growing blobs/*.incomplete", lambda: blobs.is_dir() and any(n.endswith(".incomplete") for n in os.listdir(str(blobs))), 30, 0.05)
    workers = until("two workers", lambda: len(rank_pids(sim, "VLLM::Worker_TP")) == 2 and rank_pids(sim, "VLLM::Worker_TP"), 15, 0.05)
    before = {rank: io_counters(pid) for rank, pid in workers.items()}
    ticks = {rank: cpu_ticks([pid]) for rank, pid in workers.items()}
    time.sleep(1.0)
    after = {rank: io_counters(pid) for rank, pid in workers.items()}
    grew = {rank: after[rank]["wchar"] - before[rank]["wchar"] for rank in workers}
    downloader = max(grew, key=grew.get)
    waiter = 1 - downloader
    # The download: bytes written (wchar, write_bytes) at ~8 MiB/s, received with recv: rchar flat.
    assert grew[downloader] >= 2 * 1024 * 1024, (before, after)
    assert after[downloader]["write_bytes"] > before[downloader]["write_bytes"]
    assert after[downloader]["rchar"] == before[downloader]["rchar"], (before, after)
    # The other rank waits on the lock: it reads nothing and writes no more than a log line of its own
    # (one landed in the window once, in a cold CI-like run: 218 characters), ~0 CPU.
    assert all(after[waiter][key] == before[waiter][key] for key in ("rchar", "syscr", "read_bytes")), (before, after)
    assert grew[waiter] < 4096, (before, after)
    assert cpu_ticks([workers[waiter]]) - ticks[waiter] <= 3
    sim.wait_log("Application startup complete.", timeout=60)
    sha = (cache / "models--org--k26" / "refs" / "main").read_text()
    assert sha == server.sha
    snapshot = cache / "models--org--k26" / "snapshots" / sha
    for name in os.listdir(model_dir):
        link = snapshot / name
        assert os.readlink(str(link)) == "../../blobs/" + server.etag(name)
        with open(str(link), "rb") as got, open(os.path.join(model_dir, name), "rb") as want:
            assert got.read() == want.read()
    assert not [n for n in os.listdir(str(blobs)) if n.endswith(".incomplete")]
    log = sim.log()
    # Progress bars off: the format line, then nothing from the download until its time.
    worker_lines = [line for line in log.splitlines() if "(Worker_TP%d pid=" % downloader in line]
    start = [i for i, line in enumerate(worker_lines) if "Using model weights format ['*.safetensors']" in line][0]
    assert "Time spent downloading weights for org/k26: " in worker_lines[start + 1]
    assert "checkpoint shards: 100% Completed" in log


def test_a_stalled_hub_download_keeps_its_socket_open_and_writes_nothing(model_dir, tmp_path, start_sim, harness):
    server = harness.hub(model_dir, stall_after_bytes=6 * 1024 * 1024)
    cache = tmp_path / "hub-cache"
    sim = start_sim("sglang", "org/k26", env={"HF_ENDPOINT": server.url, "HF_HUB_CACHE": str(cache)})
    assert server.stalled.wait(30)
    rank = until("the scheduler", lambda: rank_pids(sim, "sglang::scheduler_TP").get(0), 15, 0.05)
    blobs = cache / "models--org--k26" / "blobs"
    partial = until("the .incomplete file", lambda: [blobs / n for n in os.listdir(str(blobs)) if n.endswith(".incomplete")], 15, 0.05)[0]
    time.sleep(0.5)  # the last bytes sent are in the file
    size, before = partial.stat().st_size, io_counters(rank)
    time.sleep(1.5)
    assert partial.stat().st_size == size > 0
    assert io_counters(rank) == before
    assert sim.proc.poll() is None and stat_fields(rank)[0] == "S"
    log = sim.log()
    assert "TP0] Using model weights format ['*.safetensors']" in log and "Load weight end" not in log


def test_a_streamed_load_reads_a_socket_not_a_file(model_dir, start_sim, harness):
    server = harness.hub(model_dir)
    sim = start_sim("sglang", server.url + "/org/k26", "--load-format", "runai_streamer", "--load-rate-mib", "8")
    sim.wait_log("Loading safetensors using Runai Model Streamer:   0% Completed | 0/32")
    rank = rank_pids(sim, "sglang::scheduler_TP")[0]
    before = io_counters(rank)
    time.sleep(1.0)
    after = io_counters(rank)
    assert after["rchar"] - before["rchar"] >= 4 * 1024 * 1024, (before, after)
    # Nothing read from a file, nothing downloaded (a fresh checkout's first imports may write bytecode).
    assert after["read_bytes"] == before["read_bytes"] and after["write_bytes"] - before["write_bytes"] < 1024 * 1024
    sim.wait_log("The server is fired up and ready to roll!", timeout=30)
    log = sim.log()
    assert "\rLoading safetensors using Runai Model Streamer: 100% Completed | 32/32 [" in log
    assert "INFO file_streamer.py:66: [RunAI Streamer] Overall time to stream 32.0 MiB of all files to cpu: " in log


def py_spy_threads(py_spy, pid):
    out = subprocess.run([py_spy, "dump", "--json", "--pid", str(pid)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, universal_newlines=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_a_spin_releases_the_gil_while_python_at_work_holds_it(model_dir, start_sim, harness):
    py_spy = harness.py_spy()
    if py_spy is None:
        pytest.skip("py-spy is not installed")
    spin = start_sim("sglang", model_dir, "--disable-cuda-graph", "--fault", "spin:initializing")
    work = start_sim("vllm", model_dir, "--python-work-seconds", "8")
    spin.wait_log("Using CompressedTensorsWNA16MarlinMoEMethod")
    work.wait_log("Model loading took")
    spinner = rank_pids(spin, "sglang::scheduler_TP")[0]
    worker = until("worker", lambda: [p for p in work.tree() if proc_field(p, "comm") == "VLLM::Worker"], 15, 0.05)[0]
    time.sleep(0.5)
    faults_before = int(stat_fields(spinner)[7])  # minflt
    seen = {}
    for name, pid in (("spin", spinner), ("work", worker)):
        main = py_spy_threads(py_spy, pid)[0]
        seen[name] = (main["owns_gil"], main["active"], main["frames"][0]["name"], main["frames"][0]["line"])
    again = py_spy_threads(py_spy, spinner)[0]
    assert seen["spin"][:3] == (False, True, "all_reduce"), seen
    assert (again["frames"][0]["name"], again["frames"][0]["line"]) == seen["spin"][2:]  # the stack stands still
    assert seen["work"][:3] == (True, True, "python_work"), seen
    assert int(stat_fields(spinner)[7]) - faults_before <= 50  # no new memory touched
    # Python at work is healthy: the start goes on to ready.
    work.wait_log("Application startup complete.", timeout=60)


@pytest.mark.parametrize("kind,code", [("rankdeath", 1 << 8), ("rankkill", 9)])
def test_one_rank_dies_and_the_others_park_with_the_launcher_alive(model_dir, start_sim, kind, code):
    sim = start_sim("sglang", model_dir, "--tp", "3", "--disable-cuda-graph", "--init-seconds", "30",
                    "--fault", "%s:initializing" % kind, "--fault-after", "0.3")
    ranks = until("three schedulers", lambda: len(rank_pids(sim, "sglang::scheduler_TP")) == 3
                       and rank_pids(sim, "sglang::scheduler_TP"), 15, 0.05)
    sim.wait_log("Using CompressedTensorsWNA16MarlinMoEMethod")
    # The last rank's end stays readable: a zombie (nobody waits for it) with its exit code.
    until("TP2 a zombie", lambda: stat_fields(ranks[2])[0] == "Z", 15, 0.05)
    assert int(stat_fields(ranks[2])[49]) == code
    time.sleep(0.5)
    ticks = cpu_ticks([sim.proc.pid, ranks[0], ranks[1]])
    time.sleep(1.0)
    assert cpu_ticks([sim.proc.pid, ranks[0], ranks[1]]) - ticks <= 4  # parked, not spinning
    assert sim.proc.poll() is None
    assert [stat_fields(ranks[r])[0] for r in (0, 1)] == ["S", "S"]
    log = sim.log()
    if kind == "rankdeath":
        assert "TP2] Scheduler hit an exception: Traceback (most recent call last):" in log
        assert "RuntimeError: CUDA error: an illegal memory access was encountered" in log
    else:
        assert "Scheduler hit an exception" not in log
    assert "Received sigquit" not in log and "scheduler is dead" not in log
    assert not port_open(sim.port)
