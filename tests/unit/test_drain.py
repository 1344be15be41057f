"""A stop after ready: the requests in flight, read from the engine's /metrics, followed while it
drains, and the account of how many finished and how many were cut.

The account is pure; drain() runs against a real loopback server whose /metrics the test scripts,
with a scripted engine (its exit decided by the test) and a real child process that ignores SIGTERM
until the launcher's SIGKILL."""
import os
import sys
import threading
import time

import pytest

from ansible_collections.modelwake.serving.plugins.module_utils.launcher.cli import build_launch_config, parse_args
from ansible_collections.modelwake.serving.plugins.module_utils.launcher.drain import DrainAccount, drain
from ansible_collections.modelwake.serving.plugins.module_utils.launcher.engine_process import Engine

from tests.unit.test_launcher_liveness import server  # noqa: F401 (a fixture: a scriptable loopback server)

METRICS = ("GET", "/metrics")


def in_flight(running, waiting=0):
    return (200, ("vllm:num_requests_running %d\nvllm:num_requests_waiting %d\nvllm:generation_tokens_total 7\n"
                  % (running, waiting)).encode())


@pytest.mark.parametrize("first,seen,stopped", [
    # All finished before the engine ended.
    (3, [2, None, 0], "stopped: 3 requests finished during the drain, 0 cut; HOW"),
    # One still running at the last reading: cut. An unreadable reading leaves the last one standing.
    (5, [4, 1, None], "stopped: 4 requests finished during the drain, 1 cut; HOW"),
    # Nothing in flight at the stop.
    (0, [], "stopped: 0 requests finished during the drain, 0 cut; HOW"),
    # /metrics never answered: the launcher does not guess.
    (None, [None], "stopped: requests in flight unknown (/metrics never answered); HOW"),
    # The first reading failed, a later one did not: counted from there.
    (None, [2, 1], "stopped: 1 request finished during the drain, 1 cut; HOW"),
])
def test_the_account_of_a_drain(first, seen, stopped):
    account = DrainAccount(first)
    for count in seen:
        account.saw(count)
    assert account.stopped_message("HOW") == stopped


def test_the_messages_name_the_count_and_the_limit():
    assert DrainAccount(3).stopping_message(60) == "stopping: 3 requests in flight, draining up to 60 s"
    assert DrainAccount(None).stopping_message(60, "/metrics refused") == (
        "stopping: requests in flight unknown (/metrics refused), the engine drains for up to 60 s")
    account = DrainAccount(3)
    assert account.saw(1) is True and account.saw(1) is False and account.saw(None) is False
    assert account.draining_message(4.2) == "draining: 1 request still in flight after 4 s"


class ScriptedEngine(object):
    """What drain() uses of the engine; the test decides when it has exited."""

    def __init__(self):
        self.exited = threading.Event()
        self.stops = []

    def remember_tree(self):
        pass

    def describe_exit(self):
        return "exit status 0" if self.exited.is_set() else "still running"

    def stop(self, grace, signum):
        self.stops.append((grace, signum))


def config_for(server):
    return build_launch_config(parse_args(["--url", server.url, "--engine", "vllm", "--", "true"]), {})


def test_a_drain_is_followed_until_the_engine_exits(server):
    """3 in flight at the stop, 1 a moment later, then the engine exits while 1 is still running."""
    engine = ScriptedEngine()
    server.routes[METRICS] = in_flight(2, waiting=1)
    logged, statuses = [], []

    def script():
        while len(server.seen) < 2:
            time.sleep(0.01)
        server.routes[METRICS] = in_flight(1)
        while len(server.seen) < 4:
            time.sleep(0.01)
        engine.exited.set()

    thread = threading.Thread(target=script)
    thread.start()
    account = drain(engine, config_for(server), 30, time.monotonic, logged.append, statuses.append)
    thread.join()
    assert (account.first, account.last) == (3, 1)
    assert logged[0] == "stopping: 3 requests in flight, draining up to 30 s"
    assert logged[1].startswith("draining: 1 request still in flight after ")
    assert logged[-1].startswith("stopped: 2 requests finished during the drain, 1 cut; the engine ended after ")
    assert logged[-1].endswith(" s (exit status 0)")
    assert statuses == logged[:2]
    assert engine.stops == [(0, 9)]  # a SIGKILL sweep of whatever is left of its group


def test_an_engine_that_does_not_drain_is_killed_at_the_limit_and_its_requests_counted_as_cut(server):
    """A real child that ignores SIGTERM: SIGKILL after the limit, the 2 still in flight are cut."""
    server.routes[METRICS] = in_flight(2)
    script = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(60)"
    engine = Engine([sys.executable, "-c", script], dict(os.environ), open(os.devnull, "wb"))
    try:
        while not engine.output.tail:
            time.sleep(0.01)
        engine.signal_group(15)
        logged = []
        started = time.monotonic()
        drain(engine, config_for(server), 1.0, time.monotonic, logged.append, lambda text: None)
        assert time.monotonic() - started < 8
        assert engine.exited.is_set()
        assert logged[0] == "stopping: 2 requests in flight, draining up to 1 s"
        assert logged[-1] == ("stopped: 0 requests finished during the drain, 2 cut; the engine was still running "
                              "after 1 s: SIGKILL (killed by signal 9 (SIGKILL))")
    finally:
        engine.stop(0.1)
