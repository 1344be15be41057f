"""The simulated engine's serving side as the launcher's liveness and drain read it: the real
engines' /metrics names, counted as rank 0 works, and vLLM's drain on SIGTERM (--shutdown-timeout).
Real processes on loopback, as in test_sim_engine.py (its helpers and fixtures)."""
import json
import signal
import threading
import time
import urllib.request

import pytest

from tests.integration.test_sim_engine import http, model_dir, start_sim  # noqa: F401 (fixtures)

NAMES = {
    "vllm": ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:prompt_tokens_total",
             "vllm:generation_tokens_total"),
    "sglang": ("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:prompt_tokens_total",
               "sglang:generation_tokens_total"),
}

def read_metrics(url):
    """{name: value} of the unlabelled sums (one series each here)."""
    with urllib.request.urlopen(url + "/metrics", timeout=5) as answer:
        text = answer.read().decode()
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name = line.split("{")[0].split(" ")[0]
            values[name] = float(line.rsplit(" ", 1)[1])
    return values

def complete(url, max_tokens, answers):
    def run():
        body = json.dumps({"prompt": "Tell me a long story", "max_tokens": max_tokens}).encode()
        request = urllib.request.Request(url + "/v1/completions", data=body, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=30) as answer:
                answers.append(answer.status)
        except Exception as exc:
            answers.append(type(exc).__name__)
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread

@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_metrics_count_the_requests_in_flight_and_the_tokens_as_they_are_made(model_dir, start_sim, engine):
    sim = start_sim(engine, model_dir, "--token-seconds", "0.02")
    sim.wait_log("Application startup complete." if engine == "vllm" else "The server is fired up", timeout=60)
    running, waiting, prompt, generated = NAMES[engine]
    before = read_metrics(sim.url)
    assert before[running] == 0 and before[waiting] == 0
    answers = []
    thread = complete(sim.url, 200, answers)  # ~4 s of decoding
    time.sleep(1.0)
    during = read_metrics(sim.url)
    time.sleep(0.5)
    later = read_metrics(sim.url)
    # Running, and the counter moves while it runs, not only when it ends.
    assert during[running] == 1 and later[running] == 1
    assert later[generated] > during[generated] > before[generated]
    assert during[prompt] > before[prompt]
    thread.join(30)
    after = read_metrics(sim.url)
    assert answers == [200] and after[running] == 0
    assert after[generated] - before[generated] >= 200
    assert after["modelwake_sim_generation_tokens_total"] >= 200  # the simulator's own counter stays

def test_vllm_drains_on_sigterm_with_its_shutdown_timeout(model_dir, start_sim):
    sim = start_sim("vllm", model_dir, "--shutdown-timeout", "2", "--token-seconds", "0.02")
    sim.wait_log("Application startup complete.", timeout=60)
    answers = []
    short, long_one = complete(sim.url, 30, answers), complete(sim.url, 2000, answers)
    time.sleep(0.3)
    sim.proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    # Draining: no new request, /health says so, /metrics still counts what runs.
    assert http(sim.url + "/health")[0] == 503
    assert http(sim.url + "/v1/completions", {"prompt": "x", "max_tokens": 1})[0] == 503
    assert read_metrics(sim.url)["vllm:num_requests_running"] >= 1
    started = time.monotonic()
    assert sim.wait_exit(10) == 0
    assert time.monotonic() - started < 4  # the 2 s drain, then out
    short.join(5)
    long_one.join(5)
    assert answers[0] == 200 and len(answers) == 2 and answers[1] != 200  # the long one was cut
    assert "[shutdown] API server: stopping engine client mode=drain timeout=2s" in sim.log()

def test_without_a_shutdown_timeout_sigterm_ends_requests_at_once(model_dir, start_sim):
    sim = start_sim("vllm", model_dir, "--token-seconds", "0.02")
    sim.wait_log("Application startup complete.", timeout=60)
    answers = []
    thread = complete(sim.url, 2000, answers)
    time.sleep(0.3)
    sim.proc.send_signal(signal.SIGTERM)
    assert sim.wait_exit(10) == 0
    thread.join(5)
    assert answers and answers[0] != 200
