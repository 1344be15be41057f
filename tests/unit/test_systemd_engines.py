"""systemctl show parsing, and the engines' marker tables on exact log lines the real engines print."""
import pytest

from ansible_collections.modelwake.serving.plugins.module_utils.host import systemd


from ansible_collections.modelwake.serving.plugins.module_utils.readiness import engines

MIB = 1024 * 1024

SHOW = """ActiveState=activating
SubState=auto-restart
MainPID=0
NRestarts=3
ExecMainStatus=0
ExecMainCode=1
Result=success
StatusText=
Type=simple
LoadState=loaded
InvocationID=4c1e0f6d2a8b4f5e9d1c3b2a1f0e9d8c
ControlGroup=/system.slice/sglang-k26.service
"""


def test_parse_show_converts_numbers_and_keeps_text():
    props = systemd.parse_show(SHOW)
    assert props["MainPID"] == 0 and props["NRestarts"] == 3 and props["ExecMainStatus"] == 0
    assert props["SubState"] == "auto-restart" and props["StatusText"] == ""
    assert props["ControlGroup"] == "/system.slice/sglang-k26.service"
    assert not systemd.is_running({"ActiveState": "inactive"})
    assert systemd.is_running({"ActiveState": "activating"})


def test_old_systemd_without_nrestarts_gives_none():
    assert systemd.parse_show("ActiveState=active\nMainPID=12\n")["NRestarts"] is None


def test_unit_properties_asks_systemctl_and_reports_its_failure():
    calls = []

    def runner(argv, timeout=30):
        calls.append(argv)
        return 0, SHOW, ""

    assert systemd.unit_properties("sglang-k26.service", runner)["NRestarts"] == 3
    assert calls[0][:3] == ["systemctl", "show", "sglang-k26.service"]
    assert set(calls[0][4].split(",")) == set(systemd.PROPERTIES)
    with pytest.raises(systemd.SystemdError, match="System has not been booted with systemd"):
        systemd.unit_properties("x", lambda argv, timeout=30: (1, "", "System has not been booted with systemd"))


P = "[2026-05-25 19:06:14 TP0] "
V = "(EngineCore_DP0 pid=812) INFO 11-30 04:40:00 [core.py:1] "


@pytest.mark.parametrize("engine,line,kind,phase", [
    ("sglang", P + "Init torch distributed begin.", "marker", "starting"),
    ("sglang", P + "Load weight begin. avail mem=85.20 GB", "marker", "loading"),
    ("sglang", P + "Load weight end. elapsed=449.70 s, type=KimiK25ForConditionalGeneration, dtype=torch.bfloat16, "
               "avail mem=9.1 GB, mem usage=76.1 GB.", "marker", "initializing"),
    ("sglang", P + "KV Cache is allocated. #tokens: 1000000, KV size: 8.1 GB", "marker", "initializing"),
    ("sglang", P + "Capture cuda graph begin. This can take up to several minutes. avail mem=8 GB", "marker", "initializing"),
    ("sglang", P + "Entering DeepGEMM JIT Pre-Compile session. It may take a long time", "marker", "initializing"),
    ("sglang", "INFO:     Uvicorn running on http://0.0.0.0:30001 (Press CTRL+C to quit)", "marker", "initializing"),
    ("sglang", "INFO:     Application startup complete.", "marker", "initializing"),
    ("sglang", P + "The server is fired up and ready to roll!", "marker", "ready_hint"),
    ("sglang", P + "Scheduler hit an exception: Traceback (most recent call last):", "fatal", None),
    ("sglang", "Received sigquit from a child proces. It usually means the child failed.", "fatal", None),
    ("sglang", "Initialization failed. warmup error: Traceback", "fatal", None),
    ("sglang", P + "Scheduler watchdog timeout (self.watchdog_timeout=300, self.soft=False)", "fatal", None),
    ("sglang", "[2026-11-30 05:12:09] Rank 0 scheduler is dead. Please check if there are relevant logs.", "fatal", None),
    ("sglang", "server_args=ServerArgs(model_path='/m', tp_size=8)", "run_start", "starting"),
    ("sglang", P + "Unexpected error during packa", "other", None),
    ("sglang", 'INFO:     127.0.0.1:50312 - "GET /health HTTP/1.1" 503 Service Unavailable', "probe", None),
    ("sglang", '[2026-11-30 04:58:28] INFO:     127.0.0.1:41406 - "GET /get_model_info HTTP/1.1" 200 OK', "probe", None),
    ("sglang", 'INFO:     127.0.0.1:41406 - "POST /generate HTTP/1.1" 200 OK', "other", None),
    ("vllm", V + "Initializing a V1 LLM engine (v0.32.0) with config: model='/m'", "marker", "starting"),
    ("vllm", "(Worker_TP0 pid=9) INFO 11-30 [gpu_model_runner.py:1] Starting to load model /m...", "marker", "loading"),
    ("vllm", "(Worker pid=9) INFO 11-30 [default_loader.py:1] Loading weights took 23.50 seconds", "marker", "initializing"),
    ("vllm", "(Worker pid=9) INFO 11-30 Model loading took 2.61 GiB memory and 24.1s", "marker", "initializing"),
    ("vllm", "(Worker pid=9) INFO 11-30 Warming up model for the compilation...", "marker", "initializing"),
    ("vllm", "(EngineCore pid=8) INFO torch.compile takes 31.2 s in total", "marker", "initializing"),
    # Recorded on the real vLLM CPU build at start-up, before any weight is read: not a phase marker.
    ("vllm", "(APIServer pid=1059) WARNING 11-30 09:14:12 [vllm.py:1703] Enforce eager set, disabling torch.compile, "
             "CUDAGraphs, and JIT kernel warmup.", "other", None),
    ("vllm", "Capturing CUDA graphs (mixed prefill-decode, PIECEWISE):  50%", "marker", "initializing"),
    ("vllm", V + "init engine (profile, create kv cache, warmup model) took 50.66 s", "marker", "initializing"),
    ("vllm", "(APIServer pid=7) INFO:     Application startup complete.", "marker", "ready_hint"),
    ("vllm", "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}", "fatal", None),
    ("vllm", "(Worker pid=9) ERROR WorkerProc failed to start.", "fatal", None),
    ("vllm", "Worker proc VllmWorker-0 died unexpectedly (exit code: -9)", "fatal", None),
    ("vllm", "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue.", "fatal", None),
    ("vllm", "OSError: [Errno 98] Address already in use", "fatal", None),
    ("vllm", "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", "fatal", None),
    ("vllm", "(EngineCore pid=8) WARNING [shm_broadcast.py:466] No available shared memory broadcast block found in 60 "
             "seconds. This typically happens when some processes are hanging", "heartbeat", None),
    ("vllm", "(APIServer pid=7) INFO non-default args: {'model': '/m'}", "run_start", "starting"),
])
def test_exact_engine_lines(engine, line, kind, phase):
    assert engines.classify_line(engine, line) == (kind, phase)


def test_auto_uses_both_tables_and_the_cautious_meaning():
    assert engines.classify_line("auto", "INFO:     Application startup complete.") == ("marker", "initializing")
    assert engines.classify_line("auto", "Loading weights took 3 seconds") == ("marker", "initializing")


@pytest.mark.parametrize("line,engine", [
    ("server_args=ServerArgs(model_path='/m')", "sglang"),
    ("[2026-05-25 19:06:14 TP3] Load weight begin.", "sglang"),
    ("(APIServer pid=7) INFO vLLM API server version 0.32.0", "vllm"),
    ("(EngineCore_DP0 pid=8) INFO 11-30 Initializing a V1 LLM engine", "vllm"),
    ("Loading safetensors checkpoint shards:  45% Completed | 29/64", None),
    ("INFO:     Application startup complete.", None),
])
def test_detect_engine(line, engine):
    assert engines.detect_engine(line) == engine


def test_shard_progress_takes_the_last_redraw():
    assert engines.shard_progress("Loading safetensors checkpoint shards:  45% Completed | 29/64 [05:00<06:00]") == (29, 64)
    joined = "Multi-thread loading shards:  10% Completed | 1/10 [..]Multi-thread loading shards:  20% Completed | 2/10"
    assert engines.shard_progress(joined) == (2, 10)
    assert engines.shard_progress("Load weight begin") is None


def test_root_cause_is_the_first_specific_error_then_the_traceback_tail():
    tail = ["INFO loading", "Traceback (most recent call last):"] + ['  File "x.py", line %d' % i for i in range(30)] + [
        "OSError: [Errno 98] Address already in use",
        "RuntimeError: Engine core initialization failed. See root cause above."]
    evidence = engines.root_cause(tail, tail[-1])
    assert evidence[0] == "OSError: [Errno 98] Address already in use"
    assert evidence[-1] == tail[-1]
    assert len(evidence) <= 1 + engines.TRACEBACK_TAIL
    with_banner = ["server_args=ServerArgs(model_path='/m')", "Traceback (most recent call last):",
                   '  File "x.py", line 1', "torch.OutOfMemoryError: CUDA out of memory."]
    assert engines.root_cause(with_banner) == ["torch.OutOfMemoryError: CUDA out of memory.",
                                               "Traceback (most recent call last):", '  File "x.py", line 1']
    assert engines.root_cause(["Scheduler hit an exception: boom"], "Scheduler hit an exception: boom")[0] == \
        "Scheduler hit an exception: boom"


def test_accounted_counters_and_what_systemd_shows_when_it_does_not_account():
    assert systemd.accounted({"CPUUsageNSec": "1500000000"}, "CPUUsageNSec") == 1500000000
    assert systemd.accounted({"IOReadBytes": "18446744073709551615"}, "IOReadBytes") is None  # IOAccounting=no
    assert systemd.accounted({"CPUUsageNSec": "[not set]"}, "CPUUsageNSec") is None
    assert systemd.accounted({}, "IOReadBytes") is None and systemd.accounted(None, "IOReadBytes") is None


def test_the_cgroup_counts_work_of_processes_that_left_the_tree():
    accounting = systemd.UnitAccounting()
    unit = {"CPUUsageNSec": str(40 * 10 ** 9), "IOReadBytes": str(10 * MIB)}
    assert accounting.combine(30.0, 8 * MIB, unit) == (30.0, 8 * MIB)  # the first look: the tree's totals
    # A compiler reparented to init burned 4 s and a loader read 100 MiB outside the tree: the cgroup
    # saw them, the tree saw 1 s and nothing read.
    unit = {"CPUUsageNSec": str(45 * 10 ** 9), "IOReadBytes": str(110 * MIB)}
    assert accounting.combine(31.0, 8 * MIB, unit) == (35.0, 108 * MIB)
    # The tree ahead (a child's time reaped into its parent at once): the tree's growth, nothing twice.
    unit = {"CPUUsageNSec": str(46 * 10 ** 9), "IOReadBytes": str(110 * MIB)}
    assert accounting.combine(38.0, 8 * MIB, unit) == (38.0, 108 * MIB)


def test_the_launchers_own_work_in_the_cgroup_is_not_the_servers():
    accounting = systemd.UnitAccounting()
    unit = {"CPUUsageNSec": str(40 * 10 ** 9), "IOReadBytes": str(10 * MIB)}
    assert accounting.combine(30.0, 8 * MIB, unit, (2.0, 1 * MIB)) == (30.0, 8 * MIB)
    # A stopped engine: its tree still; the launcher read its stacks (py-spy, reaped: 0.6 s) and the
    # cgroup grew by just that. No growth for the server.
    unit = {"CPUUsageNSec": str(int(40.6 * 10 ** 9)), "IOReadBytes": str(11 * MIB)}
    assert accounting.combine(30.0, 8 * MIB, unit, (2.6, 2 * MIB)) == (30.0, 8 * MIB)
    # A process outside the tree at work beside it: its growth counts, the launcher's does not.
    unit = {"CPUUsageNSec": str(int(45.6 * 10 ** 9)), "IOReadBytes": str(111 * MIB)}
    assert accounting.combine(30.0, 8 * MIB, unit, (3.6, 2 * MIB)) == pytest.approx((34.0, 108 * MIB))


def test_without_accounting_or_after_a_restart_the_tree_alone_counts():
    plain = systemd.UnitAccounting()
    unset = {"CPUUsageNSec": "[not set]", "IOReadBytes": "18446744073709551615"}
    assert plain.combine(3.0, None, unset) == (3.0, None)
    assert plain.combine(4.5, None, unset) == (4.5, None)
    restarted = systemd.UnitAccounting()
    restarted.combine(100.0, 5 * MIB, {"CPUUsageNSec": str(300 * 10 ** 9), "IOReadBytes": str(50 * MIB)})
    # The unit started again: its counters begin at 0, the tree's keep their totals.
    assert restarted.combine(101.0, 6 * MIB, {"CPUUsageNSec": str(10 ** 9), "IOReadBytes": "0"}) == (101.0, 6 * MIB)


@pytest.mark.parametrize("line", [
    # The launcher quoting the cause of a stopped crash loop at a manual start: not this start's crash.
    "modelwake: starting again after a stopped crash loop: 3 failed starts in 41m02s, each "
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
    # Its command line names the engine's flags, which are not the engine's run-start line.
    "modelwake: engine started as pid 685: /opt/venv/bin/python -m sglang.launch_server --model-path /m",
])
def test_the_launchers_own_lines_are_never_the_engines(line):
    for engine in ("sglang", "vllm", "auto"):
        assert engines.classify_line(engine, line) == ("other", None)


def test_the_error_a_launcher_line_quotes_is_fatal_from_the_engine():
    assert engines.classify_line("sglang", "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB") \
        == ("fatal", None)
