"""The simulated engines' environment is copied from pool threads (tests/integration/test_module_sim.py) while
pytest sets and removes PYTEST_CURRENT_TEST in its own thread: the copy must never fail on a key removed
between its iteration and its read (the cold run of 2026-12-07 lost a scenario to that KeyError)."""
import os
import threading
import time

from tests.helpers.simharness import sim_env


def test_the_environment_is_copied_while_another_thread_changes_it():
    stop = threading.Event()

    def churn():
        while not stop.is_set():
            os.environ["MODELWAKE_ENV_RACE"] = "1"
            os.environ.pop("MODELWAKE_ENV_RACE", None)

    thread = threading.Thread(target=churn)
    thread.start()
    copies = 0
    try:
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline:
            env = sim_env({"EXTRA": "x"})
            assert env["EXTRA"] == "x" and "MODELWAKE_API_KEY" not in env
            copies += 1
    finally:
        stop.set()
        thread.join()
    assert copies > 1000
