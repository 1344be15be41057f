"""After ready, with the REAL simulated vLLM under the launcher: liveness judged from the engine's
work (its /metrics) rather than /health, and a stop that drains the requests in flight and says
how many were cut.

WatchdogSec=2 s (a probe and a ping every second), --liveness-failures 2. A busy engine whose
/health answers late stays alive under the work check (and is declared stalled under the health
check: the false restart the work check avoids); an engine whose work stopped while /health still
answers 200 is declared stalled with the numbers; SIGTERM during requests reports finished and cut.
Runs the launcher and the simulator as in test_launcher.py (its Launch harness and fixtures)."""
import json
import os
import re
import signal
import threading
import time
import urllib.request

from tests.integration.test_launcher import launch, model_dir, pythonpath  # noqa: F401 (fixtures)

VLLM = ["--engine", "vllm", "--tp", "1"]
WATCHDOG = {"WATCHDOG_USEC": "2000000"}


def ask(url, max_tokens, answers):
    """One completion in a thread of its own; its HTTP status (or the error) goes to `answers`."""
    def run():
        body = json.dumps({"prompt": "Tell me a long story", "max_tokens": max_tokens}).encode()
        request = urllib.request.Request(url + "/v1/completions", data=body, method="POST",
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=60) as answer:
                answers.append(answer.status)
        except Exception as exc:  # the engine ended with the request in flight: the cut one
            answers.append(type(exc).__name__)
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def keep_busy(url, seconds, answers):
    """Requests back to back, two at a time, for `seconds`."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        first, second = ask(url, 40, answers), ask(url, 40, answers)
        first.join(30)
        second.join(30)


def stop(run):
    run.watch_tree()
    os.kill(run.proc.pid, signal.SIGTERM)
    assert run.wait(30) == 0, run.stderr()
    assert run.survivors() == []


def test_a_busy_engine_whose_health_answers_late_stays_alive_on_its_work(launch):
    run = launch(sim_args=VLLM + ["--slow-health", "3"],
                 launcher_args=["--engine", "vllm", "--liveness-failures", "2", "--liveness-check", "work"], env=WATCHDOG)
    run.wait_ready()
    answers = []
    keep_busy(run.url, 8, answers)
    statuses = [value for _t, value in run.listener.fields("STATUS")]
    assert not [s for s in statuses if s.startswith("stalled")], run.stderr()
    assert any(re.match(r"ready: serving: \d+ tokens in the last \d+ s, \d requests? in flight", s) for s in statuses), statuses
    pings = [t for t, _v in run.listener.fields("WATCHDOG")]
    assert pings and time.monotonic() - pings[-1] < 3  # still pinging after 8 s of /health 3 s late
    assert answers and set(answers) == {200}
    assert "modelwake: liveness: serving: " in run.stderr()
    stop(run)


def test_the_same_busy_engine_fails_the_health_check(launch):
    """The contrast: under the health check its late /health ends the pings (a needless restart)."""
    run = launch(sim_args=VLLM + ["--slow-health", "3"],
                 launcher_args=["--engine", "vllm", "--liveness-failures", "2", "--liveness-check", "health"], env=WATCHDOG)
    run.wait_ready()
    busy = threading.Thread(target=keep_busy, args=(run.url, 8, []), daemon=True)
    busy.start()
    verdict = run.listener.wait_for("STATUS", 20, lambda value: value.startswith("stalled:"))
    assert verdict is not None and "/health timeout" in verdict[1], run.stderr()
    busy.join(30)
    stop(run)


def test_an_engine_whose_work_stopped_while_health_answers_is_declared_stalled(launch):
    """vLLM's /health stays 200 on a hung engine (hang:ready): the requests in flight make no token."""
    run = launch(sim_args=VLLM + ["--fault", "hang:ready", "--fault-after", "3"],
                 launcher_args=["--engine", "vllm", "--liveness-failures", "2", "--liveness-check", "work"], env=WATCHDOG)
    run.wait_ready()
    answers = []
    ask(run.url, 2000, answers)  # ~50 s of decoding: in flight when the engine hangs
    verdict = run.listener.wait_for("STATUS", 40, lambda value: value.startswith("stalled:"))
    assert verdict is not None, run.stderr()
    assert re.match(r"stalled: the engine stopped answering after it was ready \(\d+ requests? in flight \(\d+ running, "
                    r"0 waiting\), no token processed in \d+ s, 2 times in a row", verdict[1]), verdict
    with urllib.request.urlopen(run.url + "/health", timeout=5) as answer:
        assert answer.status == 200  # what a /health check would have believed
    assert run.proc.poll() is None  # systemd's watchdog ends it, not the launcher
    stop(run)


def test_a_stop_during_requests_drains_them_and_counts_the_cut_one(launch):
    """vLLM's --shutdown-timeout 3: two short requests finish during the drain, a long one is cut."""
    run = launch(sim_args=VLLM + ["--shutdown-timeout", "3"], launcher_args=["--engine", "vllm", "--stop-timeout", "8"])
    run.wait_ready()
    answers = []
    threads = [ask(run.url, 40, answers), ask(run.url, 40, answers), ask(run.url, 2000, answers)]
    time.sleep(0.4)  # all three running
    stop(run)
    for thread in threads:
        thread.join(10)
    err = run.stderr()
    assert "modelwake: stopping: 3 requests in flight, draining up to 8 s" in err, err
    assert re.search(r"modelwake: stopped: 2 requests finished during the drain, 1 cut; the engine ended after \d+ s "
                     r"\(exit status 0\)", err), err
    # The client side agrees: two answers, and the long one's connection closed without one.
    assert len(answers) == 3 and answers.count(200) == 2, answers
    assert "[shutdown] API server: stopping engine client mode=drain timeout=3s" in run.stdout()
