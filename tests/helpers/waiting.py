"""Waiting for something a test cannot be told about, up to a deadline on the monotonic clock (never
a count of tries, which lasts as long as the machine is slow)."""
import time


def poll(predicate, timeout, interval=0.05, stop=lambda: False):
    """Call predicate() until it returns something true, and return that.

    Gives up at the deadline, or as soon as stop() is true (the process that would have done it
    has exited): predicate() is then called once more, and its last (false) answer returned, so
    what came just before the end is not missed.
    """
    deadline = time.monotonic() + timeout
    while True:
        stopped = stop()
        value = predicate()
        if value or stopped or time.monotonic() >= deadline:
            return value
        time.sleep(interval)


def until(what, predicate, timeout=300, interval=0.5):
    """poll() that fails the test at the deadline, naming what was awaited."""
    value = poll(predicate, timeout, interval)
    if not value:
        raise AssertionError("%s: not seen within %s s" % (what, timeout))
    return value
