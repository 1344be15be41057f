"""wait_for_model_ready on the ways a model really arrives, run by real Ansible against the simulated
engine: a hub download (from a local hub server outside the watched tree, into a real hub-cache
layout), a download whose server stops sending, a streamed load over a socket, Python at work on one
hot line for longer than stall_timeout, and a rank that dies while its siblings block.

Each start is the engine's own process group (pid mode), held stopped until the module's first look
(test_module_sim.attached), so what the module sees begins with the engine's first instant.
"""
import json
import os

import pytest

from tests.helpers.simharness import SimRunner, make_model, start_hub
from tests.integration.test_module_sim import STALL, attached, wait_args

FAST = ["--start-seconds", "1", "--init-seconds", "1.5", "--warmup-seconds", "1"]
REPO = "org/k26"


@pytest.fixture
def sims(tmp_path):
    runner = SimRunner(tmp_path, FAST)
    yield runner
    runner.stop_all()


@pytest.fixture
def hubs():
    started = []

    def start(directory, **options):
        server = start_hub(directory, REPO, **options)
        started.append(server)
        return server
    yield start
    for server in started:
        server.stop()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_model(tmp_path_factory.mktemp("model"), size_mib=24, shards=6)


def looks(path):
    with open(path) as handle:
        return [json.loads(line) for line in handle]


def test_a_hub_download_longer_than_stall_timeout_is_watched_to_ready(tmp_path, sims, hubs, model_dir):
    # 24 MiB at 1.5 MiB/s: ~16 s of download with nothing in vLLM's log, over twice stall_timeout.
    server = hubs(model_dir, rate_mib=1.5)
    progress = str(tmp_path / "progress.jsonl")
    sim = sims.start("vllm", REPO, env={"HF_ENDPOINT": server.url, "HF_HUB_CACHE": str(tmp_path / "hub")})
    run = attached(sim, **wait_args(sim, "vllm", progress_path=progress))
    assert run.rc == 0 and run.result["phase"] == "ready", run
    verdicts = [look["verdict"] for look in looks(progress)]
    downloading = [v for v in verdicts if (v.get("source") or {}).get("kind") == "download"]
    assert len(downloading) >= 3, [v["msg"] for v in verdicts]
    assert all(v["phase"] == "loading" for v in downloading), [v["phase"] for v in downloading]
    assert downloading[-1]["source"]["file"].startswith(REPO + " ")
    assert downloading[-1]["source"]["bytes"] >= 8 * 1024 * 1024 and downloading[-1]["source"]["rate"] > 0
    assert any(v["last_progress"]["what"].startswith("download +") for v in downloading)
    assert not [v for v in verdicts if v["phase"] == "stalled"]
    # The log was silent while it downloaded: the files' bytes kept the wait from calling it a hang.
    with open(sim.log_path) as handle:
        assert "Time spent downloading weights for org/k26" in handle.read()


def test_a_download_whose_server_stops_sending_is_stalled_waiting_on_the_network(tmp_path, sims, hubs, model_dir):
    server = hubs(model_dir, rate_mib=4, stall_after_bytes=6 * 1024 * 1024)
    sim = sims.start("sglang", REPO, env={"HF_ENDPOINT": server.url, "HF_HUB_CACHE": str(tmp_path / "hub")})
    run = attached(sim, **wait_args(sim, "sglang", timeout=60))
    result = run.result
    assert run.rc != 0 and result["phase"] == "stalled", run
    assert "waiting on the network: the download of org/k26 " in result["msg"], result["msg"]
    assert result["last_progress"]["what"].startswith("download +"), result
    # Timed from the last byte: never before stall_timeout after it.
    assert result["elapsed"] - result["last_progress"]["t"] >= STALL


def test_a_streamed_load_with_no_log_followed_is_watched_to_ready(tmp_path, sims, hubs, model_dir):
    # No log_path: the socket reads alone (rchar beyond read_bytes) are the load's progress.
    server = hubs(model_dir)
    progress = str(tmp_path / "progress.jsonl")
    sim = sims.start("sglang", server.url + "/" + REPO, "--load-format", "runai_streamer", "--load-rate-mib", "1.5")
    options = wait_args(sim, "sglang", progress_path=progress)
    del options["log_path"]
    run = attached(sim, **options)
    assert run.rc == 0 and run.result["phase"] == "ready", run
    verdicts = [look["verdict"] for look in looks(progress)]
    streamed = [v for v in verdicts if (v.get("source") or {}).get("kind") == "stream"]
    assert len(streamed) >= 3 and streamed[-1]["source"]["bytes"] >= 8 * 1024 * 1024, [v["msg"] for v in verdicts]
    assert any(v["last_progress"]["what"].startswith("socket reads +") for v in streamed)
    assert "loading" in [p["phase"] for p in run.result["phases"]]
    assert not [v for v in verdicts if v["phase"] == "stalled"]


def test_python_at_work_on_one_hot_line_longer_than_stall_timeout_is_not_a_busy_wait(tmp_path, sims, model_dir):
    # Every rank runs one line of Python for 3 x stall_timeout, with no log, no disk, no new memory.
    progress = str(tmp_path / "progress.jsonl")
    sim = sims.start("sglang", model_dir, "--tp", "2", "--python-work-seconds", str(3 * STALL))
    run = attached(sim, **wait_args(sim, "sglang", progress_path=progress, timeout=120))
    assert run.rc == 0 and run.result["phase"] == "ready", run
    verdicts = [look["verdict"] for look in looks(progress)]
    assert not [v for v in verdicts if "busy-wait" in v["msg"] or v["phase"] == "stalled"]
    # The stacks were read in the silence, and showed the ranks in the hot loop.
    assert any("python_work" in (v.get("where") or "") for v in verdicts), [v.get("where") for v in verdicts]


@pytest.mark.parametrize("fault,how", [("rankdeath", "exit status 1"), ("rankkill", "killed by signal 9 (SIGKILL)")])
def test_a_rank_that_dies_is_named_with_its_exit_and_the_ranks_still_waiting(sims, model_dir, fault, how):
    sim = sims.start("sglang", model_dir, "--tp", "3", "--fault", "%s:initializing" % fault, "--fault-after", "0.5")
    run = attached(sim, **wait_args(sim, "sglang", timeout=60))
    result = run.result
    assert run.rc != 0 and result["phase"] == "failed", run
    assert "rank TP2 (pid " in result["msg"] and ") died (%s)" % how in result["msg"], result["msg"]
    assert "still alive: " in result["msg"] and "TP0 (pid " in result["msg"] and "TP1 (pid " in result["msg"]
    if fault == "rankdeath":
        assert result["msg"].startswith("failed: the server logged a fatal error: ")
        assert any("TP2] Scheduler hit an exception" in line for line in result["evidence"]), result["evidence"]
    else:
        assert "with no error in the log" in result["msg"]
