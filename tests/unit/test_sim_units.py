"""Pure pieces of the simulated engine and the scripted nvidia-smi: formats, files, parsing."""
import importlib.machinery
import importlib.util
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import time

import pytest

from modelwake_sim import __main__ as cli  # engines/sim: on sys.path by pytest.ini
from modelwake_sim import faults, logs, model, safetensors, textgen
from tests.helpers import FAKES, SIM_PATH


def load_nvidia_smi():
    path = os.path.join(FAKES, "nvidia-smi")
    loader = importlib.machinery.SourceFileLoader("fake_nvidia_smi", path)
    spec = importlib.util.spec_from_loader("fake_nvidia_smi", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


smi = load_nvidia_smi()


# --- log formats ----------------------------------------------------------------------------
@pytest.mark.parametrize("done,total,elapsed,expected", [
    (0, 64, 0.0, "Loading safetensors checkpoint shards:   0% Completed | 0/64 [00:00<?, ?it/s]"),
    (29, 64, 261.0, "Loading safetensors checkpoint shards:  45% Completed | 29/64 [04:21<05:15, 9.00s/it]"),
    (64, 64, 576.0, "Loading safetensors checkpoint shards: 100% Completed | 64/64 [09:36<00:00, 9.00s/it]"),
    (2, 8, 0.5, "Loading safetensors checkpoint shards:  25% Completed | 2/8 [00:00<00:01, 4.00it/s]"),
])
def test_tqdm_bar_matches_the_engines_format(done, total, elapsed, expected):
    assert logs.format_tqdm("Loading safetensors checkpoint shards", done, total, elapsed) == expected


def read_fd_output(write):
    read_end, write_end = os.pipe()
    write(write_end)
    os.close(write_end)
    data = os.read(read_end, 1 << 16)
    os.close(read_end)
    return data.decode()


def test_sglang_lines_carry_time_and_rank():
    out = read_fd_output(lambda fd: (logs.Logger("sglang", rank=3, fd=fd).info("Load weight begin. avail mem=9.00 GB"),
                                     logs.Logger("sglang", fd=fd).info("The server is fired up and ready to roll!")))
    first, second = out.splitlines()
    assert first[0] == "[" and first.endswith(" TP3] Load weight begin. avail mem=9.00 GB")
    assert len(first.split("]")[0]) == len("[2026-05-25 19:06:14 TP3")
    assert second.endswith("] The server is fired up and ready to roll!") and "TP" not in second


def test_progress_is_carriage_return_bar_newline():
    out = read_fd_output(lambda fd: logs.Logger("sglang", rank=0, fd=fd).progress("bar 1/2"))
    assert out == "\rbar 1/2\n"
    out = read_fd_output(lambda fd: logs.Logger("vllm", role="Worker", pid=42, fd=fd).progress("bar 1/2"))
    assert out == "(Worker pid=42) \rbar 1/2\n"


def test_vllm_traceback_records_end_inner_lines_with_crlf():
    def write(fd):
        logs.Logger("vllm", role="EngineCore", pid=7, fd=fd).traceback(
            [("/x.py", 1, "f", "g()")], "RuntimeError: boom", header="EngineCore failed to start.", source="core.py:720")
    out = read_fd_output(write)
    lines = out.split("\r\n")
    assert lines[0].startswith("(EngineCore pid=7) ERROR ") and lines[0].endswith("[core.py:720] EngineCore failed to start.")
    assert lines[1] == "(EngineCore pid=7) Traceback (most recent call last):"
    assert lines[-1] == "(EngineCore pid=7) RuntimeError: boom\n"


def test_sglang_scheduler_exception_starts_on_the_header_line():
    def write(fd):
        logs.Logger("sglang", rank=0, fd=fd).traceback([("/x.py", 1, "f", "g()")], "ValueError: v",
                                                       header="Scheduler hit an exception: ")
    out = read_fd_output(write).splitlines()
    assert out[0].endswith(" TP0] Scheduler hit an exception: Traceback (most recent call last):")
    assert out[-1] == "ValueError: v"


def test_benign_error_lines_are_written_as_the_real_engines_write_them():
    sglang = read_fd_output(lambda fd: logs.Logger("sglang", rank=1, fd=fd).benign_errors()).splitlines()
    assert len(sglang) == 2
    assert sglang[0][len("2026-04-14 16:08:51,862"):] == (
        " - CUTE_DSL - WARNING - [handle_import_error] - Unexpected error during package walk: cutlass.cute.experimental")
    assert sglang[1].endswith(" TP1] Unexpected error during package walk: cutlass.cute.experimental")
    vllm = read_fd_output(lambda fd: logs.Logger("vllm", role="APIServer", pid=7, fd=fd).benign_errors())
    assert vllm.startswith("(APIServer pid=7) WARNING ") and "[system_utils.py:255] Found ulimit of 20000 " in vllm
    assert "`OSError: [Errno 24] Too many open files`" in vllm and vllm.endswith("Consider increasing with ulimit -n\n")


# --- safetensors and make-model --------------------------------------------------------------
def write_shard(path, tensors, data_len=None):
    header = safetensors.encode_header(tensors, {"format": "pt"})
    size = sum(t[3] for t in tensors) if data_len is None else data_len
    path.write_bytes(header + b"\0" * size)
    return header


def test_header_round_trip_and_alignment(tmp_path):
    shard = tmp_path / "a.safetensors"
    header = write_shard(shard, [("w1", "U8", [10], 10), ("w2", "U8", [6], 6)])
    assert struct.unpack("<Q", header[:8])[0] % 8 == 0
    parsed, start, size = safetensors.check_file(str(shard))
    assert parsed["w2"]["data_offsets"] == [10, 16] and start == len(header) and size == len(header) + 16


@pytest.mark.parametrize("content,message", [
    (b"\x01\x02", "Error while deserializing header: header too small"),
    (struct.pack("<Q", 10 ** 9), "Error while deserializing header: header too large"),
    (struct.pack("<Q", 4096) + b"{}", "Error while deserializing header: invalid header length"),
    (struct.pack("<Q", 8) + b"not json", "Error while deserializing header: invalid JSON in header"),
])
def test_bad_headers_raise_the_libraries_messages(tmp_path, content, message):
    shard = tmp_path / "bad.safetensors"
    shard.write_bytes(content)
    with pytest.raises(safetensors.SafetensorError) as err:
        safetensors.check_file(str(shard))
    assert str(err.value).startswith(message)


def test_truncated_shard_is_incomplete_metadata(tmp_path):
    shard = tmp_path / "t.safetensors"
    write_shard(shard, [("w", "U8", [100], 100)], data_len=60)
    with pytest.raises(safetensors.SafetensorError) as err:
        safetensors.check_file(str(shard))
    assert str(err.value) == "Error while deserializing header: incomplete metadata, file not fully covered"


def test_make_model_writes_a_k26_like_directory_and_is_idempotent(tmp_path):
    target = tmp_path / "m"
    first = model.make_model(str(target), size_mib=2, shards=4, quantization="pack-quantized")
    assert sorted(first["written"]) == sorted(["config.json", "model.safetensors.index.json"] +
                                              ["model-%05d-of-00004.safetensors" % i for i in range(1, 5)])
    config = json.loads((target / "config.json").read_text())
    assert config["architectures"] == ["DeepseekV3ForCausalLM"]
    quant = config["quantization_config"]
    assert quant["quant_method"] == "compressed-tensors" and quant["format"] == "pack-quantized"
    assert quant["config_groups"]["group_0"]["format"] == "pack-quantized"
    index = json.loads((target / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"].values()) == {"model-%05d-of-00004.safetensors" % i for i in range(1, 5)}
    data = 0
    for name in set(index["weight_map"].values()):
        header, start, size = safetensors.check_file(str(target / name))
        data += size - start
    assert data == 2 * 1024 * 1024 == index["metadata"]["total_size"]
    again = model.make_model(str(target), size_mib=2, shards=4, quantization="pack-quantized")
    assert again["written"] == [] and len(again["kept"]) == 6


def test_make_model_repairs_a_truncated_shard_and_drops_stale_ones(tmp_path):
    target = tmp_path / "m"
    model.make_model(str(target), size_mib=1, shards=4)
    victim = target / "model-00002-of-00004.safetensors"
    with open(str(victim), "r+b") as fileobj:
        fileobj.truncate(100)
    assert model.make_model(str(target), size_mib=1, shards=4)["written"] == [victim.name]
    result = model.make_model(str(target), size_mib=1, shards=2)
    assert "model-00004-of-00004.safetensors" in result["written"]
    assert sorted(n for n in os.listdir(str(target)) if n.endswith(".safetensors")) == [
        "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]


@pytest.mark.parametrize("quantization,top,groups", [
    ("nvfp4-pack-quantized", "nvfp4-pack-quantized", ["nvfp4-pack-quantized"]),
    ("mixed-precision", "mixed-precision", ["pack-quantized", "float-quantized"]),
])
def test_quantization_formats(quantization, top, groups):
    quant = model.model_config(quantization)["quantization_config"]
    assert quant["format"] == top
    assert [g["format"] for g in quant["config_groups"].values()] == groups


def test_unquantized_model_has_no_quantization_config():
    assert "quantization_config" not in model.model_config("none")


@pytest.mark.parametrize("args,field", [((0, 4, "none"), "--size-mib"), ((4, 0, "none"), "--shards"),
                                        ((4, 4, "int3"), "--quantization")])
def test_make_model_bad_input_names_the_option(tmp_path, args, field):
    with pytest.raises(model.ModelError) as err:
        model.make_model(str(tmp_path / "x"), *args)
    assert field in str(err.value)
    assert not (tmp_path / "x").exists()


# --- faults, text, CLI -----------------------------------------------------------------------
def test_fault_parsing_and_timing():
    fault = faults.Fault.parse("hang:loading", 2.0)
    assert (fault.kind, fault.phase) == ("hang", "loading")
    assert not fault.due("loading", 1.9) and fault.due("loading", 2.0)
    assert fault.due("loading", 0.5, phase_over=True) and not fault.due("starting", 9.0)
    assert faults.Fault.parse("", 0) is None
    for bad in ("crash", "crash2:loading", "hang:serving"):
        with pytest.raises(faults.FaultError) as err:
            faults.Fault.parse(bad)
        assert "--fault" in str(err.value)


def test_arithmetic_prompts_get_the_answer():
    assert textgen.continuation("2+2=", 4) == (["4"], "stop")
    assert textgen.join_tokens(textgen.continuation("What is 6*7=", 4)[0]) == "42"
    tokens, finish = textgen.continuation("Tell me a story", 5)
    assert len(tokens) == 5 and finish == "length"
    assert textgen.continuation("Tell me a story", 5) == (tokens, finish)
    assert textgen.count_tokens("2+2=") == 4


def test_every_option_is_documented():
    parser = cli.build_parser()
    sub = parser._subparsers._group_actions[0]
    for name in ("serve", "make-model", "hub"):
        for action in sub.choices[name]._actions:
            assert action.help, "%s %s has no help" % (name, action.option_strings)


# --- scripted nvidia-smi ---------------------------------------------------------------------
def gpu_dir(tmp_path, holders):
    (tmp_path / "gpus.json").write_text(json.dumps({"gpus": [
        {"index": i, "name": "NVIDIA H200", "uuid": "GPU-%d" % i, "memory_total_mib": 143771,
         "memory_used_mib": 0, "utilization_gpu": 0} for i in range(2)]}))
    for name, holder in holders.items():
        (tmp_path / ("holder-%s.json" % name)).write_text(json.dumps(holder))
    return str(tmp_path)


def run_smi(monkeypatch, capsys, directory, *args):
    monkeypatch.setenv("MODELWAKE_FAKE_GPU_DIR", directory)
    code = smi.main(list(args))
    return code, capsys.readouterr().out


def test_holders_merge_and_dead_ones_are_ignored(tmp_path, monkeypatch, capsys):
    directory = gpu_dir(tmp_path, {
        "live": {"pid": os.getpid(), "name": "sglang::scheduler_TP0",
                 "gpus": {"0": {"memory_mib": 76000, "utilization": 30}, "1": {"memory_mib": 1000, "utilization": 0}}},
        "dead": {"pid": 2 ** 22 + 4321, "name": "python", "gpus": {"1": {"memory_mib": 55000, "utilization": 0}}},
    })
    code, out = run_smi(monkeypatch, capsys, directory,
                        "--query-gpu=index,name,uuid,memory.used,memory.total,utilization.gpu", "--format=csv")
    assert code == 0
    assert out.splitlines() == [
        "index, name, uuid, memory.used [MiB], memory.total [MiB], utilization.gpu [%]",
        "0, NVIDIA H200, GPU-0, 76000 MiB, 143771 MiB, 30 %",
        "1, NVIDIA H200, GPU-1, 1000 MiB, 143771 MiB, 0 %"]
    code, out = run_smi(monkeypatch, capsys, directory, "--query-compute-apps=gpu_uuid,used_memory,pid",
                        "--format=csv,noheader,nounits")
    assert out.splitlines() == ["GPU-0, 76000, %d" % os.getpid(), "GPU-1, 1000, %d" % os.getpid()]


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="a PID namespace needs root and unshare")
def test_a_holder_written_in_a_containers_pid_namespace_is_listed_by_its_host_pid(tmp_path, monkeypatch, capsys):
    """An engine in a container writes its holder with the PID it has there; NVML (and so nvidia-smi) names the
    process by its host PID. The simulator's own Holder, in a real PID namespace of its own (unshare), as
    Podman's and Docker's containers have one."""
    directory = gpu_dir(tmp_path, {})
    writer = ("import sys, time; from modelwake_sim.gpus import Holder; "
              "Holder(sys.argv[1], 'sglang::scheduler_TP0', 1).update(76000, 0); print('held', flush=True); "
              "time.sleep(60)")
    proc = subprocess.Popen(["unshare", "--pid", "--fork", "--kill-child", "--mount-proc", sys.executable, "-c", writer, directory],
                            stdout=subprocess.PIPE, universal_newlines=True,
                            env=dict(os.environ, PYTHONPATH=SIM_PATH))
    try:
        assert proc.stdout.readline().strip() == "held"
        # unshare forks the namespace's first process: its host PID is unshare's child.
        with open("/proc/%d/task/%d/children" % (proc.pid, proc.pid)) as handle:
            inner = int(handle.read().split()[0])
        (holder,) = [json.loads((tmp_path / name).read_text()) for name in os.listdir(directory) if name.startswith("holder-")]
        assert holder["pid"] == 1 and holder["pid_namespace"] != os.readlink("/proc/self/ns/pid"), holder
        code, out = run_smi(monkeypatch, capsys, directory, "--query-compute-apps=gpu_uuid,used_memory,pid",
                            "--format=csv,noheader,nounits")
        assert (code, out.splitlines()) == (0, ["GPU-1, 76000, %d" % inner])
    finally:
        proc.kill()  # --kill-child: the namespace's process goes with unshare
        proc.wait()
    deadline = time.monotonic() + 10
    while os.path.exists("/proc/%d" % inner) and time.monotonic() < deadline:
        time.sleep(0.05)
    # Gone with its namespace: the memory is free again.
    code, out = run_smi(monkeypatch, capsys, directory, "--query-compute-apps=pid", "--format=csv,noheader")
    assert (code, out.strip()) == (0, "")


def test_nounits_keeps_header_units_and_ids_filter(tmp_path, monkeypatch, capsys):
    directory = gpu_dir(tmp_path, {})
    code, out = run_smi(monkeypatch, capsys, directory, "-i", "1", "--query-gpu=memory.used,utilization.gpu",
                        "--format=csv,nounits")
    assert out.splitlines() == ["memory.used [MiB], utilization.gpu [%]", "0, 0"]
    code, out = run_smi(monkeypatch, capsys, directory, "-L")
    assert out.splitlines() == ["GPU 0: NVIDIA H200 (UUID: GPU-0)", "GPU 1: NVIDIA H200 (UUID: GPU-1)"]
    code, out = run_smi(monkeypatch, capsys, directory)
    assert code == 0 and "No running processes found" in out and "0MiB / 143771MiB" in out


def test_the_drivers_reserved_memory_is_off_free_and_out_of_used_as_on_an_h200(tmp_path, monkeypatch, capsys):
    (tmp_path / "gpus.json").write_text(json.dumps({"gpus": [
        {"index": 0, "memory_total_mib": 143771, "memory_used_mib": 0, "memory_reserved_mib": 616}]}))
    (tmp_path / "holder-torch.json").write_text(json.dumps({"pid": os.getpid(), "gpus": {"0": {"memory_mib": 2667}}}))
    code, out = run_smi(monkeypatch, capsys, str(tmp_path),
                        "--query-gpu=memory.used,memory.reserved,memory.free,memory.total", "--format=csv")
    # As driver 580's nvidia-smi printed it on an H200 with PyTorch holding 2.6 GiB (bench/REPORT.md),
    # but for free: 140490 there, each figure rounded up from bytes (615.06 MiB reserved), whole MiB here.
    assert (code, out.splitlines()) == (0, ["memory.used [MiB], memory.reserved [MiB], memory.free [MiB], memory.total [MiB]",
                                            "2667 MiB, 616 MiB, 140488 MiB, 143771 MiB"])


def test_errors_like_the_real_tool(tmp_path, monkeypatch, capsys):
    code, out = run_smi(monkeypatch, capsys, str(tmp_path), "--query-gpu=index", "--format=csv")
    assert code == 9 and out.startswith("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver")
    directory = gpu_dir(tmp_path, {})
    code, out = run_smi(monkeypatch, capsys, directory, "--query-gpu=index,bogus", "--format=csv")
    assert code == 2 and out.startswith('Field "bogus" is not a valid field to query.')


# --- arrivals: hub names, the local hub server, the download and stream clients ------------------
@pytest.fixture(scope="module")
def hub():
    from modelwake_sim import hub as module  # imported here so the module's head stays the shared one
    return module


@pytest.fixture
def served(tmp_path, hub):
    """A 2-MiB make-model directory served as hub repository org/k26 by the real server."""
    directory = str(tmp_path / "model")
    model.make_model(directory, size_mib=2, shards=2, quantization="none")
    servers = []

    def start(**options):
        server = hub.HubServer(directory, "org/k26", **options).start()
        servers.append(server)
        return server

    yield directory, start
    for server in servers:
        server.stop()


def test_hub_cache_names_and_places(hub, tmp_path):
    assert hub.repo_folder_name("moonshotai/Kimi-K2.6") == "models--moonshotai--Kimi-K2.6"
    assert hub.cache_root({"HF_HUB_CACHE": "/c", "HF_HOME": "/h"}) == "/c"
    assert hub.cache_root({"HF_HOME": "/h"}) == "/h/hub"
    assert hub.cache_root({}) == os.path.join(os.path.expanduser("~"), ".cache", "huggingface", "hub")
    assert hub.is_hub_id("moonshotai/Kimi-K2.6") and not hub.is_hub_id("/srv/models/k26")
    assert not hub.is_hub_id("http://host:1/org/name") and not hub.is_hub_id("a/b/c")
    (tmp_path / "org").mkdir()
    (tmp_path / "org" / "name").mkdir()
    cwd = os.getcwd()
    os.chdir(str(tmp_path))
    try:
        assert not hub.is_hub_id("org/name")  # an existing directory is a local model
    finally:
        os.chdir(cwd)


@pytest.mark.parametrize("size,text", [(512, "512 Bytes"), (33554432, "32.0 MiB"), (7623566950, "7.1 GiB"),
                                       (696565350, "664.3 MiB")])
def test_sizes_are_written_as_the_streamers_summary_writes_them(hub, size, text):
    assert hub.human_binary(size) == text


def test_the_hub_server_answers_like_the_hub(served):
    import hashlib
    import urllib.error
    import urllib.request

    directory, start = served
    server = start()
    base = server.url
    with urllib.request.urlopen(base + "/api/models/org/k26/revision/main") as resp:
        info = json.loads(resp.read().decode())
    assert info["sha"] == server.sha and len(info["sha"]) == 40
    assert sorted(s["rfilename"] for s in info["siblings"]) == sorted(os.listdir(directory))
    name = "model-00001-of-00002.safetensors"
    with open(os.path.join(directory, name), "rb") as fileobj:
        content = fileobj.read()
    head = urllib.request.Request("%s/org/k26/resolve/%s/%s" % (base, info["sha"], name), method="HEAD")
    with urllib.request.urlopen(head) as resp:
        assert resp.headers["ETag"] == '"%s"' % hashlib.sha256(content).hexdigest()
        assert resp.headers["X-Repo-Commit"] == server.sha
        assert int(resp.headers["Content-Length"]) == len(content)
    ranged = urllib.request.Request("%s/org/k26/%s" % (base, name), headers={"Range": "bytes=8-15"})
    with urllib.request.urlopen(ranged) as resp:
        assert resp.status == 206 and resp.read() == content[8:16]
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(base + "/org/k26/resolve/main/missing.bin")
    assert err.value.code == 404


def test_a_download_fills_the_hub_cache_layout(served, tmp_path, hub):
    directory, start = served
    server = start()
    cache = tmp_path / "cache"
    snapshot = hub.HubDownload(server.url, "org/k26", cache=str(cache)).snapshot()
    folder = cache / "models--org--k26"
    assert snapshot == str(folder / "snapshots" / server.sha)
    assert (folder / "refs" / "main").read_text() == server.sha
    for name in os.listdir(directory):
        link = os.readlink(os.path.join(snapshot, name))
        assert link == "../../blobs/" + server.etag(name)
        with open(os.path.join(directory, name), "rb") as want, open(os.path.join(snapshot, name), "rb") as got:
            assert got.read() == want.read()
    assert not [n for n in os.listdir(str(folder / "blobs")) if n.endswith(".incomplete")]


def test_a_stalled_server_stops_sending_with_the_connection_open(served, hub):
    import threading

    directory, start = served
    server = start(stall_after_bytes=100000)
    conn = hub.StreamConnection(server.url + "/org/k26")
    received = []
    reader = threading.Thread(target=lambda: received.append(
        conn.get("model-00001-of-00002.safetensors", into=lambda chunk: received.append(len(chunk)))), daemon=True)
    reader.start()
    assert server.stalled.wait(10)
    reader.join(0.5)
    assert reader.is_alive() and sum(received) == 100000  # blocked in read(2), the socket open
    conn.close()


def test_a_streamed_range_arrives_whole(served, hub):
    directory, start = served
    server = start(rate_mib=64)
    conn = hub.StreamConnection(server.url + "/org/k26")
    try:
        name = "model-00002-of-00002.safetensors"
        with open(os.path.join(directory, name), "rb") as fileobj:
            content = fileobj.read()
        assert conn.get(name, 0, 8) == content[:8]
        assert conn.get(name, 100, 300000) == content[100:300000]  # the same kept-alive connection
    finally:
        conn.close()


@pytest.mark.parametrize("argv,message", [
    (["--fault", "rankdeath:initializing"], "--tp must be 2 or more"),
    (["--fault", "rankreap:initializing"], "--tp must be 2 or more"),
    (["--load-format", "runai_streamer"], "--load-format runai_streamer and an http:// --model-path go together"),
    (["--tp", "2", "--churn", "node-rank"], "--churn node-rank: start with --node-rank 0"),
    (["--churn", "rank-party"], "argument --churn: invalid choice: 'rank-party'"),
])
def test_serve_refuses_arrivals_that_cannot_happen(argv, message, capsys):
    with pytest.raises(SystemExit):
        cli.main(["serve", "--engine", "sglang", "--model-path", "/nonexistent/model"] + argv)
    assert message in capsys.readouterr().err


def test_rank_death_faults_parse():
    fault = faults.Fault.parse("rankdeath:initializing", 2.0)
    assert (fault.kind, fault.phase, fault.after) == ("rankdeath", "initializing", 2.0)
    assert faults.Fault.parse("rankkill:loading").kind in faults.RANK_DEATHS
    assert faults.Fault.parse("rankreap:initializing").kind in faults.RANK_DEATHS


@pytest.mark.parametrize("argv,message", [
    (["--engine", "vllm", "--churn", "compile-workers"], "--churn: the churn is SGLang's process tree here"),
    (["--engine", "vllm", "--tp", "2", "--fault", "rankreap:loading"], "--fault rankreap: the launcher that reaps"),
])
def test_churn_and_rankreap_are_sglangs(argv, message, capsys):
    with pytest.raises(SystemExit):
        cli.main(["serve", "--model-path", "/nonexistent/model"] + argv)
    assert message in capsys.readouterr().err


def test_churn_kinds_repeat_and_node_rank_goes_with_the_option():
    args = cli.build_parser().parse_args(["serve", "--engine", "sglang", "--model-path", "/m", "--churn",
                                          "compile-workers", "--churn", "helper-sigterm", "--churn-seconds", "2"])
    assert (args.churn, args.churn_seconds, args.churn_record) == (["compile-workers", "helper-sigterm"], 2.0, None)
    assert cli.build_parser().parse_args(["serve", "--engine", "sglang", "--model-path", "/m"]).churn == []


def test_the_record_is_one_json_line_per_end_with_how_it_ended(tmp_path):
    path = str(tmp_path / "churn.jsonl")
    pid = os.fork()
    if pid == 0:
        os._exit(3)
    _, status = os.waitpid(pid, 0)
    faults.record(path, churn="node-rank", pid=pid, ended=faults.ended(status))
    faults.record(path, fault="rankreap", pid=7, killed="signal 9 (SIGKILL)", t=12.5)
    faults.record(None, churn="nowhere")  # no record file: nothing written, no error
    first, second = [json.loads(line) for line in open(path)]
    assert (first["churn"], first["pid"], first["ended"]) == ("node-rank", pid, "exit 3") and first["t"] > 0
    assert second == {"fault": "rankreap", "pid": 7, "killed": "signal 9 (SIGKILL)", "t": 12.5}
    pid = os.fork()
    if pid == 0:
        time.sleep(30)
        os._exit(0)
    # SIGKILL: a forked pytest worker may have its own SIGTERM handler, which the child would inherit.
    os.kill(pid, signal.SIGKILL)
    assert faults.ended(os.waitpid(pid, 0)[1]) == "signal 9 (SIGKILL)"


def test_the_api_key_comes_from_where_the_real_engine_takes_it(tmp_path, monkeypatch):
    # A deploy starts the simulator with the real engine's command line and key: SGLang's --config
    # YAML (a JSON string, as model_service writes it), vLLM's VLLM_API_KEY; MODELWAKE_API_KEY first.
    from modelwake_sim import engine
    for name in ("MODELWAKE_API_KEY", "VLLM_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    config = tmp_path / "unit.sglang.yaml"
    config.write_text('# Ansible managed\napi-key: "sk-a\\"b"\n')
    sglang = cli.build_parser().parse_args(["serve", "--engine", "sglang", "--model-path", "/m", "--enable-metrics",
                                            "--config", str(config)])
    vllm = cli.build_parser().parse_args(["serve", "--engine", "vllm", "--model", "/m", "--tensor-parallel-size", "2"])
    assert (engine.api_key(sglang), engine.api_key(vllm), vllm.tp) == ('sk-a"b', None, 2)
    monkeypatch.setenv("VLLM_API_KEY", "sk-vllm")
    assert (engine.api_key(sglang), engine.api_key(vllm)) == ('sk-a"b', "sk-vllm")
    monkeypatch.setenv("MODELWAKE_API_KEY", "sk-sim")
    assert (engine.api_key(sglang), engine.api_key(vllm)) == ("sk-sim", "sk-sim")
