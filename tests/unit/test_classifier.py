"""The phase classifier on replayed snapshot traces: each verdict the issue names, as a case."""
import ast
import json
import os

import pytest

from ansible_collections.modelwake.serving.plugins.lookup.launcher_sources import MODULE_UTILS, closure
from ansible_collections.modelwake.serving.plugins.module_utils.readiness.classifier import Classifier

from tests.helpers.traces import (K26_EXPECTED_BYTES, MIB, SGLANG_PREFIX, Trace, config, hang, http, k26_start,
                    phases_seen, replay, vllm_cpu_start, vllm_prefix)


# -- silent phases with progress are never stalled ------------------------------------------

def test_k26_start_silent_loading_then_silent_init_then_ready():
    cfg = config(engine="sglang", stall_timeout=300, poll_interval=10, expected_bytes=K26_EXPECTED_BYTES)
    verdicts = replay(cfg, k26_start())
    assert phases_seen(verdicts) == ["starting", "loading", "initializing", "ready"]
    by_t = dict(verdicts)
    # Ten silent minutes (twice the stall timeout) of disk reading: loading, with progress figures.
    mid = by_t[500]
    assert mid.phase == "loading"
    assert mid.read_rate == pytest.approx(575 * MIB, rel=0.01)
    assert mid.fraction == pytest.approx(480 / 900.0, abs=0.02)
    assert mid.eta == pytest.approx(420, abs=15)
    assert "read_bytes" in mid.last_progress["what"]
    # CPU-bound initialisation, silent for 300 s, GPU memory flat and utilisation 0: initializing.
    assert by_t[1100].phase == "initializing"
    assert by_t[1100].fraction == 1.0
    assert "CPU 1.50 cores" in by_t[1100].last_progress["what"]
    final = verdicts[-1][1]
    assert final.phase == "ready" and verdicts[-1][0] == 1250
    assert "answered 200 with choices" in final.msg
    assert [p["phase"] for p in final.phases] == ["starting", "loading", "initializing", "ready"]
    assert final.phases[1]["start"] == 20.0


def test_k26_start_without_expected_bytes_leaves_loading_once_reads_stop_and_cpu_works():
    cfg = config(engine="auto", stall_timeout=300, poll_interval=10)
    verdicts = dict(replay(cfg, k26_start()))
    assert verdicts[920].phase == "loading"
    # 60 s after the last read, with the CPU busy, the silent init is recognised.
    assert verdicts[970].phase == "loading"
    assert verdicts[980].phase == "initializing"
    assert verdicts[980].engine == "sglang"
    assert verdicts[500].fraction is None and verdicts[500].eta is None


def test_vllm_cpu_start_17_s_silence_after_loading_is_not_stalled():
    # stall_timeout shorter than the silence: only the CPU time (0.75 core) shows progress.
    cfg = config(engine="vllm", stall_timeout=15, poll_interval=5)
    verdicts = replay(cfg, vllm_cpu_start())
    assert phases_seen(verdicts) == ["starting", "loading", "initializing", "ready"]
    by_t = dict(verdicts)
    assert by_t[65].shards == [2, 3] and by_t[65].fraction == pytest.approx(0.6667, abs=0.001)
    assert by_t[65].eta == pytest.approx(10.0, abs=0.1)  # loading began at 45: 20 s for 2 shards, 1 left
    assert by_t[80].phase == "initializing"
    assert by_t[80].last_progress == {"t": 80.0, "what": "CPU 0.75 cores"}
    assert verdicts[-1][1].phase == "ready"


@pytest.mark.parametrize("engine,log_path,first_lines,phase", [
    # A followed log still without the run's first line: the reads are imports, the CPU too.
    ("auto", "/var/log/engine.log", [], "starting"),
    # vLLM logs `Starting to load model` before it reads a weight: reads before it are not loading.
    ("vllm", "/var/log/engine.log", [vllm_prefix("APIServer", 100) + "non-default args: {'model': '/m'}"], "starting"),
    # SGLang may load silently after its first lines (the K2.6 story): the reads are loading.
    ("sglang", "/var/log/engine.log", ["server_args=ServerArgs(model_path='/m')"], "loading"),
    # No log to follow: only the disk can tell.
    ("auto", None, [], "loading"),
    # The launcher follows the engine's output through its pipe (no unit, no log_path): the
    # reads before the first line are imports, as with a followed file.
    ("vllm", "pipe", [], "starting"),
])
def test_busy_cpu_and_reads_before_any_load_marker(engine, log_path, first_lines, phase):
    trace = Trace()
    follows_pipe = log_path == "pipe"
    cfg = config(engine=engine, log_path=None if follows_pipe else log_path, expected_bytes=2 * MIB)
    cfg.follows_log = follows_pipe
    verdicts = replay(cfg, [
        trace.step(0, lines=first_lines),
        trace.step(5, cpu=1.0, read=3 * MIB),
        trace.step(10, cpu=1.0, read=3 * MIB),
    ])
    assert [v.phase for _t, v in verdicts[1:]] == [phase, "initializing" if phase == "loading" else phase]


def test_phases_never_go_backwards_on_a_late_run_start_line():
    trace = Trace()
    api = vllm_prefix("APIServer", 100)
    verdicts = replay(config(engine="vllm", log_path="/var/log/engine.log"), [
        trace.step(0, lines=[vllm_prefix("Worker", 300) + "Starting to load model /m..."]),
        trace.step(5, cpu=1.0, lines=[vllm_prefix("Worker", 300) + "Loading weights took 1.0 seconds"]),
        trace.step(10, cpu=1.0, lines=[api + "vLLM API server version 0.32.0", api + "non-default args: {}"]),
        trace.step(15, cpu=1.0),
    ])
    assert [v.phase for _t, v in verdicts] == ["loading", "initializing", "initializing", "initializing"]


def test_auto_engine_treats_sglang_startup_complete_as_warmup_not_ready():
    cfg = config(engine="auto")
    trace = Trace()
    verdicts = replay(cfg, [
        trace.step(0, lines=["server_args=ServerArgs(model_path='/m')"]),
        trace.step(5, cpu=1, lines=["INFO:     Application startup complete."], http_result=http(503)),
    ])
    assert verdicts[-1][1].phase == "initializing"
    assert verdicts[-1][1].engine == "sglang"
    assert "the engine logged that it is ready" not in verdicts[-1][1].msg


# -- hangs: stalled exactly once stall_timeout has passed -------------------------------------

@pytest.mark.parametrize("stall_timeout,poll", [(600, 5), (300, 10), (30, 1), (45, 5)])
def test_hang_is_stalled_exactly_at_stall_timeout_not_a_poll_earlier(stall_timeout, poll):
    cfg = config(engine="vllm", stall_timeout=stall_timeout, poll_interval=poll, timeout=3600)
    verdicts = replay(cfg, hang(stall_timeout, poll, until=3600))
    t_end, final = verdicts[-1]
    assert final.phase == "stalled" and final.terminal
    assert t_end == 100 + stall_timeout  # last progress at t=100
    assert dict(verdicts)[100 + stall_timeout - poll].phase != "stalled"
    assert "no progress for %d s in phase loading" % stall_timeout in final.msg
    assert "process 300 state T (stopped)" in final.msg
    assert "utilisation 100/100 %" in final.msg
    assert final.last_progress["t"] == 100.0 and final.last_progress["what"].startswith("CPU 1.00 cores")


def test_hang_heartbeat_lines_and_gpu_utilisation_are_not_progress():
    cfg = config(engine="vllm", stall_timeout=600, poll_interval=5)
    verdicts = replay(cfg, hang(600, 5, until=3600))
    for t, verdict in verdicts:
        if t > 100:
            assert verdict.last_progress["t"] == 100.0, "shm heartbeat or GPU util counted at t=%s" % t


def test_access_log_lines_of_our_own_probes_are_neither_progress_nor_evidence():
    cfg = config(engine="sglang", stall_timeout=30, poll_interval=5)
    trace = Trace()
    access = 'INFO:     127.0.0.1:%d - "GET /health HTTP/1.1" 503 Service Unavailable'
    snaps = [trace.step(0, lines=["INFO:     Uvicorn running on http://0.0.0.0:30001"], http_result=http(503))]
    snaps += [trace.step(t, lines=[access % (40000 + t)], http_result=http(503)) for t in range(5, 100, 5)]
    t_end, final = replay(cfg, snaps)[-1]
    assert (t_end, final.phase) == (30, "stalled")
    assert final.evidence == ["INFO:     Uvicorn running on http://0.0.0.0:30001"]


def test_tqdm_redraw_of_the_same_shard_is_not_progress():
    cfg = config(engine="sglang", stall_timeout=20, poll_interval=5)
    trace = Trace()
    bar = SGLANG_PREFIX + "Loading safetensors checkpoint shards:  45% Completed | 29/64 [05:00<06:00, 10.1s/it]"
    snaps = [trace.step(0, lines=[SGLANG_PREFIX + "Load weight begin. avail mem=85 GB"])]
    snaps += [trace.step(t, lines=[bar]) for t in range(5, 60, 5)]
    verdicts = replay(cfg, snaps)
    t_end, final = verdicts[-1]
    assert final.phase == "stalled" and t_end == 25
    assert final.shards == [29, 64]


# -- crashes: failed on the first poll after, with the root cause ------------------------------

def test_crash_process_gone_is_failed_on_the_first_poll_with_the_exception_as_evidence():
    cfg = config(engine="sglang")
    trace = Trace()
    traceback = [SGLANG_PREFIX + "Load weight begin. avail mem=85 GB", "Traceback (most recent call last):",
                 '  File "/opt/venv/lib/python3.11/site-packages/sglang/srt/layers/quantization/compressed_tensors.py", line 80',
                 "    CompressionFormat.nvfp4_pack_quantized.value,",
                 "AttributeError: type object 'CompressionFormat' has no attribute 'nvfp4_pack_quantized'"]
    verdicts = replay(cfg, [
        trace.step(0, lines=["server_args=ServerArgs(model_path='/m')"]),
        trace.step(5, cpu=1, lines=traceback),
        trace.step(10, alive=False),
        trace.step(15, alive=False),
    ])
    t_end, final = verdicts[-1]
    assert (t_end, final.phase, final.terminal) == (10, "failed", True)
    assert "process 100 exited" in final.msg and "in phase loading" in final.msg
    assert final.evidence[0].startswith("AttributeError: type object 'CompressionFormat'")
    assert "Traceback (most recent call last):" in final.evidence


@pytest.mark.parametrize("lines,cause,in_msg", [
    # SGLang's scheduler killed without a traceback (crash0, the OOM killer): the API process says so, exits 0.
    (["[2026-11-30 05:12:09] Rank 0 scheduler is dead. Please check if there are relevant logs.",
      "[2026-11-30 05:12:09] Exit code: -9"], "Rank 0 scheduler is dead", "the server logged a fatal error: "),
    # An exception nobody wraps (a missing model directory): the message names it, not only the evidence.
    (["Traceback (most recent call last):", '  File "/v/transformers/utils/hub.py", line 470, in cached_files',
      "OSError: Incorrect path_or_model_id: '/m'. Please provide either the path to a local folder"],
     "OSError: Incorrect path_or_model_id: '/m'", "exited 10 s into the wait, in phase starting: OSError: Incorrect"),
], ids=["sglang-scheduler-dead-exit-0", "uncaught-exception-at-exit"])
def test_crash_names_its_cause_first_in_the_evidence_and_in_the_message(lines, cause, in_msg):
    cfg = config(engine="sglang")
    trace = Trace()
    verdicts = replay(cfg, [trace.step(0, lines=["server_args=ServerArgs(model_path='/m')"]),
                            trace.step(5, cpu=1, lines=lines), trace.step(10, alive=False)])
    t_end, final = verdicts[-1]
    assert (t_end, final.phase) == (10, "failed")
    assert cause in final.evidence[0]
    assert in_msg in final.msg


@pytest.mark.parametrize("alive,lines,words", [
    (True, [], "failed: port 30001 is held by another process (pid 4242, python3), not by the server"),
    # The engine died of it before the first look: the fatal line, and who holds the port.
    (True, ["OSError: [Errno 98] Address already in use"],
     "fatal error: OSError: [Errno 98] Address already in use; port 30001 is held by another process (pid 4242"),
    (False, ["Traceback (most recent call last):", "OSError: [Errno 98] Address already in use"],
     "OSError: [Errno 98] Address already in use; port 30001 is held by another process (pid 4242, python3)"),
], ids=["alive", "fatal-line", "exited"])
def test_port_held_by_another_process_is_named_also_when_the_server_died_of_it(alive, lines, words):
    cfg = config(engine="sglang")
    trace = Trace(pids=(100,))
    listener = [{"pid": 4242, "comm": "python3"}]
    verdicts = replay(cfg, [trace.step(0, lines=["server_args=ServerArgs(model_path='/m')"] + lines, alive=alive,
                                       http_result=http(404), listeners=listener),
                            trace.step(5, alive=False, http_result=http(404), listeners=listener)])
    final = verdicts[-1][1]
    assert final.phase == "failed"
    assert words in final.msg


VLLM_TRUNCATED_SHARD = [
    "(Worker pid=311) INFO 11-30 04:40:01 [gpu_model_runner.py:1] Starting to load model /m...",
    "Loading safetensors checkpoint shards:   0% Completed | 0/3 [00:00<?, ?it/s]",
    "(Worker pid=311) ERROR 11-30 04:40:02 [multiproc_executor.py:671] WorkerProc failed to start.",
    "(Worker pid=311) ERROR 11-30 04:40:02 [multiproc_executor.py:671] Traceback (most recent call last):",
    '(Worker pid=311) ERROR 11-30 04:40:02 [multiproc_executor.py:671]   File "/v/safetensors/torch.py", line 315, in load_file',
    "(Worker pid=311) ERROR 11-30 04:40:02 [multiproc_executor.py:671]     with safe_open(filename, framework=\"pt\") as f:",
    "(Worker pid=311) ERROR 11-30 04:40:02 [multiproc_executor.py:671] safetensors_rust.SafetensorError: Error while "
    "deserializing header: incomplete metadata, file not fully covered",
]
VLLM_FINAL = [
    "(EngineCore pid=200) ERROR 11-30 04:40:08 [core.py:700] EngineCore failed to start.",
    "(EngineCore pid=200) ERROR 11-30 04:40:08 [core.py:700] Exception: WorkerProc initialization failed due to an "
    "exception in a background process. See stack trace for root cause.",
    "(APIServer pid=100) RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}",
]


@pytest.mark.parametrize("batches", [
    [VLLM_TRUNCATED_SHARD + VLLM_FINAL],  # all in one poll
    [VLLM_TRUNCATED_SHARD, VLLM_FINAL],  # root cause one poll, the wrapper the next
], ids=["one-poll", "two-polls"])
def test_truncated_shard_names_the_safetensor_error_not_only_the_final_runtime_error(batches):
    cfg = config(engine="vllm")
    trace = Trace(pids=(100, 200, 311))
    snaps = [trace.step(0, lines=[vllm_prefix("APIServer", 100) + "vLLM API server version 0.32.0"])]
    snaps += [trace.step(5 * (i + 1), cpu=1, lines=batch) for i, batch in enumerate(batches)]
    t_end, final = replay(cfg, snaps)[-1]
    assert final.phase == "failed" and t_end == 5
    assert "SafetensorError: Error while deserializing header" in final.evidence[0]
    assert "SafetensorError" in final.msg
    assert any("Traceback (most recent call last)" in line for line in final.evidence)


def test_fatal_line_whose_traceback_comes_a_poll_later_waits_one_look_for_the_cause():
    cfg = config(engine="vllm")
    trace = Trace(pids=(100, 200, 311))
    verdicts = replay(cfg, [trace.step(0), trace.step(5, cpu=1, lines=VLLM_TRUNCATED_SHARD[:3]),
                            trace.step(10, cpu=1, lines=VLLM_TRUNCATED_SHARD[3:] + VLLM_FINAL)])
    assert [v.phase for _t, v in verdicts] == ["starting", "loading", "failed"]
    assert "SafetensorError" in verdicts[-1][1].evidence[0]


def test_fatal_line_without_any_cause_fails_on_the_next_look():
    cfg = config(engine="sglang")
    trace = Trace()
    watchdog = SGLANG_PREFIX + "Scheduler watchdog timeout (self.watchdog_timeout=300, self.soft=False)"
    verdicts = replay(cfg, [trace.step(0), trace.step(5, cpu=1, lines=[watchdog]), trace.step(10, cpu=1)])
    assert [v.phase for _t, v in verdicts] == ["starting", "starting", "failed"]
    assert verdicts[-1][1].evidence[0] == watchdog


def test_only_a_final_wrapper_still_names_the_first_specific_error():
    cfg = config(engine="vllm")
    trace = Trace()
    lines = ["pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig",
             "  Value error, Invalid repository ID or local directory specified: '/m'",
             "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}"]
    _t, final = replay(cfg, [trace.step(0), trace.step(5, cpu=1, lines=lines)])[-1]
    assert final.phase == "failed"
    assert final.evidence[0].startswith("pydantic_core._pydantic_core.ValidationError")
    assert final.evidence[-1].startswith("RuntimeError: Engine core initialization failed")


def test_ambiguous_sglang_unexpected_error_line_alone_is_not_fatal():
    cfg = config(engine="sglang", stall_timeout=600)
    trace = Trace()
    _t, final = replay(cfg, [trace.step(0), trace.step(5, cpu=1, lines=["[2026-05-25 19:08:04 TP4] Unexpected error during packa"])])[-1]
    assert final.phase == "starting"


def unit_props(state="active", sub="running", main_pid=500, restarts=0, status=0, result="success"):
    return {"ActiveState": state, "SubState": sub, "MainPID": main_pid, "NRestarts": restarts,
            "ExecMainStatus": status, "ExecMainCode": 1, "Result": result, "StatusText": "",
            "Type": "simple", "LoadState": "loaded"}


@pytest.mark.parametrize("after,words", [
    (unit_props(main_pid=600, restarts=1), "restarted 1 time(s) during the wait (NRestarts 0 -> 1"),
    (unit_props(main_pid=600, restarts=None), "main process changed from 500 to 600"),
    (unit_props(state="activating", sub="auto-restart", main_pid=0), "waits to restart it"),
    (unit_props(state="inactive", sub="dead", main_pid=0), "stopped 10 s into the wait"),
    (unit_props(state="failed", sub="failed", main_pid=0, status=1, result="exit-code"), "failed (ActiveState=failed"),
], ids=["nrestarts-up", "mainpid-changed", "auto-restart", "exit-0-inactive", "unit-failed"])
def test_unit_mode_crash_that_exits_0_or_restarts_is_failed(after, words):
    cfg = config(unit="sglang-k26.service")
    trace = Trace(pids=(500, 501))
    verdicts = replay(cfg, [
        trace.step(0, unit=unit_props(), lines=["server_args=ServerArgs(model_path='/m')"]),
        trace.step(5, cpu=1, unit=unit_props()),
        trace.step(10, cpu=1, unit=after, pids=(600,) if after["MainPID"] == 600 else None),
    ])
    t_end, final = verdicts[-1]
    assert (t_end, final.phase) == (10, "failed")
    assert words in final.msg


def test_unit_not_started_yet_is_not_started_and_not_failed():
    cfg = config(unit="sglang-k26.service")
    trace = Trace(pids=(1,))
    _t, final = replay(cfg, [trace.step(0, unit=unit_props(state="inactive", sub="dead", main_pid=0), alive=False)])[-1]
    assert final.phase == "not_started" and not final.terminal


def test_unit_restart_count_is_reported():
    cfg = config(unit="sglang-k26.service")
    trace = Trace(pids=(500,))
    verdicts = replay(cfg, [trace.step(0, unit=unit_props(restarts=3)), trace.step(5, cpu=1, unit=unit_props(restarts=4, main_pid=700))])
    assert verdicts[-1][1].restarts == 1


# -- HTTP: answering endpoints that do not prove readiness -------------------------------------

@pytest.mark.parametrize("engine,answer", [
    ("sglang", http(503, models=200)),  # SGLang's static model list during warm-up
    ("vllm", http(200, models=200, completion="timeout", model="tiny")),  # hung engine: /health 200, completion hangs
    ("vllm", http(200, models=200, completion=404, model="wrong")),
    ("sglang", http(200, models=401)),  # a server that wants an api_key: its model list is refused
], ids=["sglang-models-200-warming", "vllm-health-200-completion-timeout", "vllm-completion-404", "sglang-models-401"])
def test_endpoints_that_answer_before_ready_are_not_ready(engine, answer):
    cfg = config(engine=engine)
    trace = Trace()
    _t, final = replay(cfg, [trace.step(0), trace.step(5, cpu=1, http_result=answer)])[-1]
    assert final.phase == "initializing" and not final.terminal


@pytest.mark.parametrize("listen_line", [
    "[2026-11-30 05:12:09] INFO:     Uvicorn running on http://127.0.0.1:30002 (Press CTRL+C to quit)",
    "(APIServer pid=100) INFO 11-30 05:12:09 [api_server.py:1912] Starting vLLM server on http://127.0.0.1:30002",
], ids=["sglang", "vllm"])
def test_url_to_a_closed_port_while_the_server_logged_another_says_where_it_listens(listen_line):
    cfg = config(engine="auto", stall_timeout=10)
    trace = Trace()
    verdicts = replay(cfg, [trace.step(0, lines=[listen_line])] + [trace.step(t) for t in range(5, 30, 5)])
    t_end, final = verdicts[-1]
    assert (t_end, final.phase) == (10, "stalled")
    assert "HTTP /health refused" in final.msg
    assert final.msg.endswith("; the server logged that it listens on http://127.0.0.1:30002, "
                              "not on port 30001 of the url: fix the url")


def test_url_of_the_logged_port_gets_no_port_note():
    cfg = config(engine="sglang", stall_timeout=10)
    trace = Trace()
    lines = ["INFO:     Uvicorn running on http://0.0.0.0:30001 (Press CTRL+C to quit)"]
    _t, final = replay(cfg, [trace.step(0, lines=lines), trace.step(5), trace.step(10)])[-1]
    assert final.phase == "stalled" and "not on port" not in final.msg


@pytest.mark.parametrize("api_key,words", [(None, "/models answers 401: the server wants an api_key"),
                                           ("wrong", "/models answers 401: the api_key was refused")])
def test_models_401_says_what_to_do_about_the_api_key(api_key, words):
    cfg = config(engine="sglang", api_key=api_key)
    trace = Trace()
    _t, final = replay(cfg, [trace.step(0, http_result=http(200, models=401))])[-1]
    assert final.phase == "initializing" and words in final.msg
    assert "wrong" not in final.msg


def test_hung_completion_is_the_first_evidence_of_a_stall():
    cfg = config(engine="vllm", stall_timeout=30)
    trace = Trace()
    hung = http(200, models=200, completion="timeout", model="tiny")
    hung["completion"]["error"] = "no answer in 30 s"
    ready_line = "(APIServer pid=100) INFO:     Application startup complete."
    verdicts = replay(cfg, [trace.step(0, lines=[ready_line], http_result=hung)]
                      + [trace.step(t, http_result=hung) for t in range(30, 100, 30)])
    t_end, final = verdicts[-1]
    assert (t_end, final.phase) == (30, "stalled")
    assert "HTTP /health 200, /models 200, /completion timeout" in final.msg
    assert final.evidence[0] == ("POST /v1/completions (model 'tiny'): no answer in 30 s, while GET /health "
                                 "answered 200")
    assert final.evidence[1:] == [ready_line]


def test_vllm_health_503_is_a_dead_engine():
    cfg = config(engine="vllm")
    trace = Trace()
    _t, final = replay(cfg, [trace.step(0), trace.step(5, cpu=1, http_result=http(503))])[-1]
    assert final.phase == "failed" and "engine core is dead" in final.msg


def test_port_held_by_another_process_is_failed_naming_its_pid():
    cfg = config(engine="vllm")
    trace = Trace(pids=(100, 200))
    _t, final = replay(cfg, [trace.step(0, http_result=http(200, models=200, completion=200, ready=True),
                                        listeners=[{"pid": 4242, "comm": "python3"}])])[-1]
    assert final.phase == "failed"
    assert "port 30001 is held by another process (pid 4242, python3)" in final.msg


def test_port_held_by_the_server_itself_is_ready():
    cfg = config(engine="vllm")
    trace = Trace(pids=(100, 200))
    _t, final = replay(cfg, [trace.step(0, http_result=http(200, models=200, completion=200, ready=True, model="m"),
                                        listeners=[{"pid": 100, "comm": "python3"}])])[-1]
    assert final.phase == "ready"


def test_ready_needs_the_server_alive():
    cfg = config(engine="vllm")
    trace = Trace()
    _t, final = replay(cfg, [trace.step(0), trace.step(5, alive=False, http_result=http(200, completion=200, ready=True))])[-1]
    assert final.phase == "failed"


# -- deadlines ----------------------------------------------------------------------------------

def test_overall_timeout_while_still_progressing_is_timeout():
    cfg = config(engine="sglang", timeout=100, stall_timeout=600, poll_interval=10)
    trace = Trace()
    snaps = [trace.step(t, cpu=1.0, read=10 * MIB) for t in range(0, 200, 10)]
    t_end, final = replay(cfg, snaps)[-1]
    assert (t_end, final.phase, final.terminal) == (100, "timeout", True)
    assert final.msg.startswith("timeout: not ready after 100 s; in phase loading since +10 s")


def test_timeout_zero_never_gives_a_timeout_verdict():
    cfg = config(engine="sglang", timeout=0)
    trace = Trace()
    _t, final = replay(cfg, [trace.step(0, lines=[SGLANG_PREFIX + "Load weight begin. avail mem=85 GB"])])[-1]
    assert final.phase == "loading" and not final.terminal


# -- logs from earlier runs ---------------------------------------------------------------------

OLD_CRASH = ["[2026-05-25 18:00:00 TP0] Scheduler hit an exception: Traceback (most recent call last):",
             "Received sigquit from a child proces. It usually means the child failed."]


@pytest.mark.parametrize("context,expected", [
    (OLD_CRASH, "starting"),  # cannot tell which run: not taken at face value
    (["server_args=ServerArgs(model_path='/old')"] + OLD_CRASH + ["server_args=ServerArgs(model_path='/m')"], "starting"),
    # After a start marker, but the tail may be an earlier run's whose own start line it is: held while alive.
    (["server_args=ServerArgs(model_path='/m')"] + OLD_CRASH, "starting"),
], ids=["no-run-marker", "crash-of-earlier-run", "crash-of-this-run-or-an-earlier-one"])
def test_fatal_lines_in_a_file_tail_count_only_when_they_follow_a_run_start(context, expected):
    cfg = config(engine="sglang")
    trace = Trace()
    # Two looks: a crash line without a named cause waits one look for its traceback.
    _t, final = replay(cfg, [trace.step(0, context=context), trace.step(5, cpu=1)])[-1]
    assert final.phase == expected


TAIL_WITH_A_CRASH = ["server_args=ServerArgs(model_path='/m')"] + OLD_CRASH


def test_a_crash_in_a_file_tail_fails_once_no_run_started_for_a_minute_or_at_once_when_the_server_is_gone():
    cfg = config(engine="sglang")
    trace = Trace()
    looks = [trace.step(0, context=TAIL_WITH_A_CRASH)] + [trace.step(t, cpu=0.5) for t in range(5, 70, 5)]
    seen = replay(cfg, looks)
    # At 60 s, and one more look for a traceback that names the cause (OLD_CRASH has none).
    assert [t for t, v in seen if v.phase == "failed"] == [65], [(t, v.phase) for t, v in seen]
    assert seen[-1][1].msg.startswith("failed: the server logged a fatal error (in the log before this wait began, and "
                                      "no run started since): ")
    trace = Trace()
    gone = replay(cfg, [trace.step(0, context=TAIL_WITH_A_CRASH), trace.step(5, alive=False)])[-1][1]
    assert gone.phase == "failed" and gone.rule in ("fatal_log_line", "process_exited")


def test_a_crash_of_an_earlier_run_in_a_file_tail_is_cleared_by_this_runs_start_line():
    # The log appended to across restarts: the earlier run crashed; this one prints its first line after its imports.
    cfg = config(engine="sglang")
    trace = Trace()
    looks = [trace.step(0, context=TAIL_WITH_A_CRASH), trace.step(5, cpu=0.9),
             trace.step(10, cpu=0.9, lines=["server_args=ServerArgs(model_path='/m')"]),
             trace.step(15, cpu=0.9, lines=[SGLANG_PREFIX + "Load weight begin. avail mem=94.13 GB"])]
    looks += [trace.step(t, cpu=0.9) for t in range(20, 80, 5)]
    assert set(v.phase for _t, v in replay(cfg, looks)) <= {"starting", "loading", "initializing"}


# -- state persistence --------------------------------------------------------------------------


# -- pure -----------------------------------------------------------------------------------

# The standard library the classifier may use: no file, socket, process or clock anywhere below it.
PURE_STDLIB = {"copy", "dataclasses", "re", "typing", "urllib.parse"}


def test_the_classifier_and_everything_it_imports_do_no_io():
    files = closure(["readiness.classifier"])
    assert "readiness/spin.py" in files and "readiness/peers.py" in files and "readiness/verdict.py" in files
    assert not [f for f in files if f.startswith("host/")], files
    for path in files:
        with open(os.path.join(MODULE_UTILS, path)) as handle:
            tree = ast.parse(handle.read(), path)
        stdlib = set(alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names)
        stdlib |= set(node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and not node.level)
        assert stdlib <= PURE_STDLIB, "%s imports %s" % (path, sorted(stdlib - PURE_STDLIB))
