"""Liveness after ready: the launcher asks the engine before each WATCHDOG=1 and stops pinging after
N failed answers in a row, so that systemd's watchdog restarts a hung engine.

The count is pure logic (a scripted probe); the probe is the ready check's own HTTP code against a
real loopback server; the supervising loop runs against that server and a real notify socket, its
watchdog periods passed at once (no real sleeping). Also the launcher's other exits without a
verdict: an engine gone before the first look, and one that exits after ready.
"""
import os
import re
import signal
import sys
import threading
import time

import pytest

from ansible_collections.modelwake.serving.plugins.module_utils.common.errors import ModelWakeError
from ansible_collections.modelwake.serving.plugins.module_utils.launcher.cli import API_KEY_ENV, build_launch_config, parse_args
from ansible_collections.modelwake.serving.plugins.module_utils.launcher.engine_process import Engine
from ansible_collections.modelwake.serving.plugins.module_utils.launcher.exit_codes import EXIT_ENGINE_EXITED, EXIT_USAGE
from ansible_collections.modelwake.serving.plugins.module_utils.launcher.liveness import Liveness, liveness_probe
from ansible_collections.modelwake.serving.plugins.module_utils.launcher.supervisor import Launcher, StopRequested
from ansible_collections.modelwake.serving.plugins.module_utils.launcher.notify import Notifier

from tests.helpers.http_server import SECRET, Server
from tests.unit.test_launcher import receiver  # noqa: F401 (a fixture: the test's own notify socket)

HEALTH = ("GET", "/health")


@pytest.fixture
def server():
    srv = Server()
    yield srv
    srv.close()


def scripted(answers):
    """A probe answering from a list: True, or the text of a failure."""
    answers = list(answers)

    def probe():
        answer = answers.pop(0)
        return (True, None) if answer is True else (False, answer)
    return probe


def test_pings_go_on_while_the_engine_answers_and_stop_after_n_failures_in_a_row():
    logged = []
    liveness = Liveness(scripted([True, "/health 503", True, "/health 503", "/health 503", "/health timeout (no answer in 5 s)",
                                  True, True]), failures=3, log=logged.append)
    pings = [liveness.answers() for _ in range(8)]
    # One failure is forgiven (the next answer resets the count); the third in a row ends the pings,
    # and an answer after that changes nothing: the verdict stands until the watchdog restarts the unit.
    assert pings == [True, True, True, True, True, False, False, False]
    assert liveness.gave_up and liveness.missed == 3
    assert liveness.last_failure == "/health timeout (no answer in 5 s)"
    assert logged == ["liveness: /health 503 (1 of 3 failed probes in a row)",
                      "liveness: the engine answers again after 1 failed probe(s)",
                      "liveness: /health 503 (1 of 3 failed probes in a row)",
                      "liveness: /health 503 (2 of 3 failed probes in a row)"]


def test_the_probe_asks_health_with_the_key_and_says_what_failed(server):
    options = parse_args(["--url", server.url, "--", "true"])
    cfg = build_launch_config(options, {API_KEY_ENV: SECRET})
    probe = liveness_probe(cfg, "health", timeout=0.3)
    server.routes[HEALTH] = (200, b"")
    assert probe() == (True, None)
    assert server.seen[-1]["headers"]["Authorization"] == "Bearer " + SECRET
    server.routes[HEALTH] = (503, b"")
    assert probe() == (False, "/health 503")
    server.routes[HEALTH] = "hang"
    started = time.monotonic()
    assert probe() == (False, "/health timeout (no answer in 0.3 s)")
    assert time.monotonic() - started < 2


def test_the_completion_check_needs_a_generation(server):
    cfg = build_launch_config(parse_args(["--url", server.url, "--model", "kimi", "--", "true"]), {})
    probe = liveness_probe(cfg, "completion", timeout=0.3)
    server.routes[HEALTH] = (200, b"")  # vLLM's /health on a hung engine
    server.routes[("POST", "/v1/completions")] = "hang"
    assert probe() == (False, "/v1/completions timeout (no answer in 0.3 s)")
    server.routes[("POST", "/v1/completions")] = (200, {"choices": [{"text": "4"}]})
    assert probe() == (True, None)


def test_liveness_without_a_watchdog_is_refused():
    options = parse_args(["--url", "http://127.0.0.1:30001", "--liveness-failures", "3", "--", "true"])
    with pytest.raises(ModelWakeError, match="^liveness-failures: needs systemd's watchdog"):
        build_launch_config(options, {})
    build_launch_config(options, {"WATCHDOG_USEC": "30000000"})
    with pytest.raises(ModelWakeError, match="^liveness-failures: must be 0"):
        build_launch_config(parse_args(["--url", "http://127.0.0.1:1", "--liveness-failures", "-1", "--", "true"]), {})
    with pytest.raises(SystemExit):
        parse_args(["--url", "http://127.0.0.1:1", "--liveness-check", "models", "--", "true"])


class Periods(object):
    """The engine's wake event as the supervising loop waits on it: each wait is one watchdog period,
    passed at once (no real sleeping); `on_period(n)` changes the world between two periods."""

    def __init__(self, on_period):
        self.on_period = on_period
        self.count = 0
        self.waited = []

    def wait(self, seconds):
        self.count += 1
        self.waited.append(seconds)
        self.on_period(self.count)
        return False

    def clear(self):
        pass


class QuietEngine(object):
    """What _supervise reads of the engine: it runs (never exits) and wakes the loop each period."""

    def __init__(self, on_period):
        self.exited = threading.Event()
        self.wake = Periods(on_period)


def test_the_supervising_loop_stops_pinging_a_silent_engine_and_says_why(server, receiver):
    """WatchdogSec=30 s: a probe and a ping every 15 s. /health answers for three periods, turns 503
    for four, then answers again: with --liveness-failures 2 the pings stop at the second failure and
    do not resume; STATUS= and the journal say why; the launcher does not end (the watchdog does)."""
    errors = []
    environ = {"NOTIFY_SOCKET": receiver.address, "WATCHDOG_USEC": "30000000", API_KEY_ENV: SECRET}
    options = parse_args(["--url", server.url, "--liveness-failures", "2", "--", "true"])
    cfg = build_launch_config(options, environ)
    launcher = Launcher(options, environ=environ, err=Err(errors))
    script = {1: (200, b""), 4: (503, b""), 8: (200, b"")}

    def on_period(n):
        receiver.drain(n)  # what the period that just ended sent
        if n in script:
            server.routes[HEALTH] = script[n]
        if n == 10:
            launcher.stop_signal = signal.SIGTERM

    server.routes[HEALTH] = (200, b"")
    launcher.engine = engine = QuietEngine(on_period)
    with pytest.raises(StopRequested):
        launcher._supervise(Notifier(environ), cfg)
    assert engine.wake.waited == [15.0] * 10
    # Periods 1-4 answered (the 4th probe ran before /health turned 503), the 5th failed once and
    # was forgiven, the 6th was the second failure in a row: no ping from then on, not even after
    # /health answered again (periods 9 and 10).
    assert receiver.times("WATCHDOG") == [1, 2, 3, 4, 5]
    assert receiver.values("STATUS") == [
        "stalled: the engine stopped answering after it was ready (/health 503, 2 times in a row, every 15 s): "
        "no more WATCHDOG=1, systemd's watchdog restarts it"]
    assert receiver.times("STATUS") == [6]
    # One probe per period until the verdict, none after it; each with the key from the environment.
    probes = [seen for seen in server.seen if seen["path"] == "/health"]
    assert len(probes) == 6
    assert all(seen["headers"]["Authorization"] == "Bearer " + SECRET for seen in probes)
    text = "".join(errors)
    assert "modelwake: liveness: /health 503 (1 of 2 failed probes in a row)\n" in text
    assert "modelwake: stalled: the engine stopped answering after it was ready (/health 503" in text
    assert SECRET not in text


def test_without_liveness_the_loop_pings_every_period(server, receiver):
    environ = {"NOTIFY_SOCKET": receiver.address, "WATCHDOG_USEC": "30000000"}
    options = parse_args(["--url", server.url, "--", "true"])
    launcher = Launcher(options, environ=environ, err=Err([]))

    def on_period(n):
        receiver.drain(n)
        if n == 3:
            launcher.stop_signal = signal.SIGTERM

    launcher.engine = QuietEngine(on_period)
    with pytest.raises(StopRequested):
        launcher._supervise(Notifier(environ), build_launch_config(options, environ))
    assert receiver.times("WATCHDOG") == [1, 2, 3]
    assert server.seen == []  # nobody asked the engine


class Err(object):
    def __init__(self, lines):
        self.lines = lines

    def write(self, text):
        self.lines.append(text)

    def flush(self):
        pass


def test_an_engine_refusing_its_options_before_the_first_look_ends_with_the_usage_status(receiver):
    """An engine that exits with argparse's status 2 before the launcher's first look (how fast it
    exits decides which path sees it): the launcher exits 2 there too, so RestartPreventExitStatus=
    stops systemd's loop (EXIT_FAILED on this path would let Restart= try again)."""
    errors = []
    environ = {"NOTIFY_SOCKET": receiver.address}
    options = parse_args(["--url", "http://127.0.0.1:9", "--", "true"])
    launcher = Launcher(options, environ=environ, err=Err(errors))
    launcher.engine = engine = Engine([sys.executable, "-c", "import sys; sys.exit(2)"], dict(os.environ), Err([]))
    assert engine.exited.wait(30)
    cfg = build_launch_config(options, environ)
    assert launcher._watch(Notifier(environ), cfg.for_started_server(engine.pid)) == EXIT_USAGE
    text = "".join(errors)
    assert "failed: the engine ended at once (exit status 2)" in text
    assert "the engine refused its options (exit status 2)" in text


@pytest.mark.parametrize("printed,evidence", [
    # No line names an exception: the last lines, as many as the wait keeps for a crash.
    (["step %d" % i for i in range(30)], ["step %d" % i for i in range(10, 30)]),
    # One does: the root cause first, then its traceback, as the wait's failed verdict shows them.
    (["step 1", "Traceback (most recent call last):", '  File "x.py", line 1', "ValueError: the scheduler is dead"],
     ["ValueError: the scheduler is dead", "Traceback (most recent call last):", '  File "x.py", line 1']),
])
def test_an_exit_after_ready_is_logged_with_the_waits_crash_evidence(receiver, printed, evidence):
    """The same evidence rule as the wait's (readiness/engines.py, crash_evidence)."""
    errors = []
    environ = {"NOTIFY_SOCKET": receiver.address}
    options = parse_args(["--url", "http://127.0.0.1:9", "--", "true"])
    launcher = Launcher(options, environ=environ, err=Err(errors))
    script = "import sys; sys.stdout.write(%r)" % "".join(line + "\n" for line in printed)
    launcher.engine = engine = Engine([sys.executable, "-c", script], dict(os.environ), Err([]))
    assert engine.exited.wait(30)
    assert launcher._supervise(Notifier(environ), build_launch_config(options, environ)) == EXIT_ENGINE_EXITED
    text = "".join(errors)
    assert "modelwake: failed: the engine exited after it was ready (exit status 0)\n" in text
    logged = [line[len("modelwake:   | "):] for line in text.splitlines() if line.startswith("modelwake:   | ")]
    assert logged == evidence


# --- The work check: the engine's own /metrics decide, a 1-token completion when idle -------------

from ansible_collections.modelwake.serving.plugins.module_utils.launcher.liveness import (  # noqa: E402
    WorkProbe, WorkReading, judge_work, parse_work, watchdog_liveness)

# As vLLM writes them: one series per engine core (data parallel 2 here), summed; counters with _total.
VLLM_METRICS = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="kimi"} 2.0
vllm:num_requests_running{engine="1",model_name="kimi"} 1.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="kimi"} 4.0
vllm:num_requests_waiting{engine="1",model_name="kimi"} 0.0
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="kimi"} 1200.0
vllm:prompt_tokens_total{engine="1",model_name="kimi"} 300.0
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="kimi"} 5.5e+03
vllm:generation_tokens_total{engine="1",model_name="kimi"} 500.0
vllm:generation_tokens_created{engine="0",model_name="kimi"} 1.79e+09
"""
SGLANG_METRICS = """# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="kimi"} 0.0
sglang:num_queue_reqs{model_name="kimi"} 0.0
sglang:prompt_tokens_total{model_name="kimi"} 7.0
sglang:generation_tokens_total{model_name="kimi"} 8.0
"""


def test_the_engines_metrics_are_read_by_their_own_names_and_summed_over_series():
    assert parse_work(VLLM_METRICS, "vllm", 12.0) == (WorkReading(3, 4, 7500.0, 12.0), None)
    assert parse_work(VLLM_METRICS, "auto", 12.0)[0] == WorkReading(3, 4, 7500.0, 12.0)
    assert parse_work(SGLANG_METRICS, "sglang", 1.0) == (WorkReading(0, 0, 15.0, 1.0), None)
    # SGLang's names in vLLM's text are not there, and the launcher says which it looked for.
    assert parse_work(VLLM_METRICS, "sglang", 1.0) == (None, "no sglang:num_running_reqs in it")
    assert parse_work("# nothing\nprocess_cpu_seconds_total 3.0\n", "auto", 1.0) == (
        None, "no sglang:num_running_reqs or vllm:num_requests_running in it")


def reading(in_flight, tokens, at, waiting=0):
    return WorkReading(in_flight - waiting, waiting, tokens, at)


@pytest.mark.parametrize("previous,current,evidence,alive,words", [
    # Busy and generating: alive, whatever /health would say.
    (reading(3, 1000, 0), reading(3, 1812, 30), "serving", True,
     "serving: 812 tokens in the last 30 s, 3 requests in flight (3 running, 0 waiting)"),
    # Busy and nothing processed for a whole period: the failure, in numbers.
    (reading(3, 1000, 0), reading(3, 1000, 30), "no work", False,
     "3 requests in flight (3 running, 0 waiting), no token processed in 30 s"),
    # Only waiting requests and no progress: the scheduler is not working either.
    (reading(2, 50, 0, waiting=2), reading(2, 50, 30, waiting=2), "no work", False,
     "2 requests in flight (0 running, 2 waiting), no token processed in 30 s"),
    # Nothing in flight: the rule cannot tell, the idle completion decides.
    (reading(3, 1000, 0), reading(0, 1500, 30), "idle", None, "idle: no request in flight"),
    (None, reading(0, 0, 30), "idle", None, "idle: no request in flight"),
    # The first look, or counters that started again: no baseline, the next look decides.
    (None, reading(1, 90, 30), "serving", True,
     "serving: 1 request in flight (1 running, 0 waiting), first look at its token counters"),
    (reading(1, 900, 0), reading(1, 90, 30), "serving", True,
     "serving: 1 request in flight (1 running, 0 waiting), first look at its token counters"),
    # Requests that arrived within the period have not had a period without work yet.
    (reading(0, 90, 0), reading(2, 90, 30), "serving", True,
     "serving: 2 requests in flight (2 running, 0 waiting) arrived since the last look"),
])
def test_the_work_rule(previous, current, evidence, alive, words):
    assert tuple(judge_work(previous, current)) == (evidence, alive, words)


class Clock(object):
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def metrics(running, tokens, engine="vllm"):
    if engine == "vllm":
        text = ("vllm:num_requests_running{engine=\"0\"} %d\nvllm:num_requests_waiting{engine=\"0\"} 0\n"
                "vllm:generation_tokens_total{engine=\"0\"} %d\n" % (running, tokens))
    else:
        text = "sglang:num_running_reqs %d\nsglang:generation_tokens_total %d\n" % (running, tokens)
    return (200, text.encode())


def work_probe(server, clock, logged, statuses, engine="vllm", model="kimi"):
    args = ["--url", server.url, "--engine", engine] + (["--model", model] if model else []) + ["--", "true"]
    cfg = build_launch_config(parse_args(args), {API_KEY_ENV: SECRET})
    fallback = liveness_probe(cfg, "health", timeout=0.3)
    return WorkProbe(cfg, 0.3, fallback, clock=clock, log=logged.append, status=statuses.append)


def test_the_work_probe_reads_metrics_and_says_which_evidence_decided(server):
    """A busy engine whose /health hangs stays alive on its token counters; one that stops
    generating fails although /health answers; an idle one is asked for one token."""
    clock, logged, statuses = Clock(), [], []
    probe = work_probe(server, clock, logged, statuses)
    server.routes[HEALTH] = "hang"  # busy: /health is never asked
    server.routes[("GET", "/metrics")] = metrics(3, 1000)
    assert probe() == (True, None)
    clock.now += 15
    server.routes[("GET", "/metrics")] = metrics(3, 1812)
    assert probe() == (True, None)
    assert statuses[-1] == "ready: serving: 812 tokens in the last 15 s, 3 requests in flight (3 running, 0 waiting)"
    # The work stops while requests wait for it: a failed probe, in numbers, /health or not.
    server.routes[HEALTH] = (200, b"")
    clock.now += 15
    assert probe() == (False, "3 requests in flight (3 running, 0 waiting), no token processed in 15 s")
    # Idle: a 1-token completion with the key must come back.
    server.routes[("GET", "/metrics")] = metrics(0, 1812)
    server.routes[("POST", "/v1/completions")] = (200, {"choices": [{"text": "4"}]})
    clock.now += 15
    assert probe() == (True, None)
    asked = server.seen[-1]
    assert asked["path"] == "/v1/completions" and asked["body"]["max_tokens"] == 1 and asked["body"]["model"] == "kimi"
    assert asked["headers"]["Authorization"] == "Bearer " + SECRET
    assert statuses[-1] == "ready: idle: no request in flight, a 1-token completion answered"
    server.routes[("POST", "/v1/completions")] = "hang"
    clock.now += 15
    assert probe() == (False, "idle: no request in flight, a 1-token completion failed: a 1-token "
                              "/v1/completions timeout (no answer in 0.3 s)")
    # The journal hears of each change of evidence once, not of every probe.
    assert logged == ["liveness: serving: 3 requests in flight (3 running, 0 waiting), first look at its token counters",
                      "liveness: idle: no request in flight, a 1-token completion answered"]
    assert not [s for s in statuses if SECRET in s]


def test_unreadable_metrics_fall_back_to_health_and_say_so(server):
    clock, logged, statuses = Clock(), [], []
    probe = work_probe(server, clock, logged, statuses, engine="sglang", model=None)
    server.routes[("GET", "/metrics")] = (404, {"detail": "Not Found"})  # SGLang without --enable-metrics
    server.routes[HEALTH] = (200, b"")
    assert probe() == (True, None)
    assert logged == ["liveness: /metrics 404, /health decides: answered"]
    server.routes[HEALTH] = (503, b"")
    assert probe() == (False, "/metrics 404, /health decides: /health 503")
    # Metrics without the engine's names count as unreadable too.
    server.routes[("GET", "/metrics")] = (200, b"process_cpu_seconds_total 1.0\n")
    assert probe() == (False, "/metrics has no sglang:num_running_reqs in it, /health decides: /health 503")
    # Readable again: the idle completion (the model from /v1/models, none was given) decides.
    server.routes[("GET", "/metrics")] = metrics(0, 5, engine="sglang")
    server.routes[("GET", "/v1/models")] = (200, {"data": [{"id": "k26"}]})
    server.routes[("POST", "/v1/completions")] = (200, {"choices": [{"text": "4"}]})
    assert probe() == (True, None)
    assert server.seen[-1]["body"]["model"] == "k26"


def test_the_work_check_is_chosen_on_the_command_line_and_fits_the_ping(server):
    options = parse_args(["--url", server.url, "--liveness-failures", "2", "--liveness-check", "work", "--", "true"])
    environ = {"WATCHDOG_USEC": "2000000"}
    liveness = watchdog_liveness(build_launch_config(options, environ), "work", 2, 1.0)
    assert isinstance(liveness.probe, WorkProbe)
    # Each request of a probe gets half the ping interval at most: the probe and its ping fit in WatchdogSec.
    assert liveness.probe.timeout == 0.5
    server.routes[("GET", "/metrics")] = "hang"
    server.routes[HEALTH] = "hang"
    started = time.monotonic()
    assert liveness.answers() is True  # one failure forgiven
    assert time.monotonic() - started < 2
    assert liveness.last_failure == ("/metrics timeout (no answer in 0.5 s), /health decides: "
                                     "/health timeout (no answer in 0.5 s)")


def test_the_supervising_loop_with_the_work_check_says_its_evidence_and_stops_on_no_work(server, receiver):
    """WatchdogSec=30 s: each period the loop reads /metrics. Tokens move for two periods (STATUS= says
    so), then three requests make no token: with --liveness-failures 2 the pings stop, the verdict in
    numbers, although /health answers 200 all along."""
    environ = {"NOTIFY_SOCKET": receiver.address, "WATCHDOG_USEC": "30000000"}
    options = parse_args(["--url", server.url, "--engine", "vllm", "--liveness-failures", "2",
                          "--liveness-check", "work", "--", "true"])
    launcher = Launcher(options, environ=environ, err=Err([]))
    script = {1: metrics(3, 1500), 2: metrics(3, 2000)}

    def on_period(n):
        receiver.drain(n)
        if n in script:
            server.routes[("GET", "/metrics")] = script[n]
        if n == 6:
            launcher.stop_signal = signal.SIGTERM

    server.routes[HEALTH] = (200, b"")
    server.routes[("GET", "/metrics")] = metrics(3, 1000)
    launcher.engine = QuietEngine(on_period)
    with pytest.raises(StopRequested):
        launcher._supervise(Notifier(environ), build_launch_config(options, environ))
    statuses = receiver.values("STATUS")
    assert statuses[0] == "ready: serving: 3 requests in flight (3 running, 0 waiting), first look at its token counters"
    assert re.match(r"ready: serving: 500 tokens in the last \d+ s, 3 requests in flight", statuses[1]), statuses
    assert re.match(r"stalled: the engine stopped answering after it was ready \(3 requests in flight \(3 running, "
                    r"0 waiting\), no token processed in \d+ s, 2 times in a row, every 15 s\)", statuses[-1]), statuses
    # Pings in periods 1-3 (the third look saw 500 more tokens) and 4 (the first look without work is
    # forgiven), none once the counters stood still twice in a row.
    assert receiver.times("WATCHDOG") == [1, 2, 3, 4]
    assert not [seen for seen in server.seen if seen["path"] == "/health"]  # /health never decided
