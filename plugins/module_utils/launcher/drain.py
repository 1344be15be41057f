"""A stop after ready: the requests the engine had in flight, followed while it drains them.

The stop signal has already gone to the engine (the launcher forwards it at once). vLLM with
--shutdown-timeout N refuses new requests and lets those in flight finish for up to N s; SGLang
has no such option and ends them as it exits. Either way the launcher reads the engine's /metrics
(running + waiting), follows that count until the engine has exited or the launcher's stop timeout
ran out (then SIGKILL), and says how many finished and how many were cut: those still in flight at
the last reading before the engine ended. DrainAccount is the bookkeeping, pure; drain() the I/O.
"""
import signal

from .liveness import read_work

# How often the count is read while the engine drains, and how long one read may take.
FOLLOW_EVERY = 0.25
READ_TIMEOUT = 1.0


def _requests(count):
    return "%d request%s" % (count, "" if count == 1 else "s")


class DrainAccount(object):
    """In-flight counts seen during one stop: the first, and the last before the engine ended.
    A count that could not be read leaves the last one standing."""

    def __init__(self, first):
        self.first = first
        self.last = first

    def saw(self, in_flight):
        """A new reading; True when the count changed (worth saying)."""
        if in_flight is None or in_flight == self.last:
            return False
        if self.first is None:
            self.first = in_flight
        self.last = in_flight
        return True

    def stopping_message(self, limit, unreadable=None):
        if self.first is None:
            return ("stopping: requests in flight unknown (%s), the engine drains for up to %g s"
                    % (unreadable or "/metrics unreadable", limit))
        return "stopping: %s in flight, draining up to %g s" % (_requests(self.first), limit)

    def draining_message(self, seconds):
        return "draining: %s still in flight after %.0f s" % (_requests(self.last), seconds)

    def stopped_message(self, how):
        """`how`: the engine's end in words (exited by itself, or killed when the time ran out)."""
        if self.first is None:
            return "stopped: requests in flight unknown (/metrics never answered); %s" % how
        cut = self.last
        finished = max(self.first - cut, 0)
        return "stopped: %s finished during the drain, %d cut; %s" % (_requests(finished), cut, how)


def drain(engine, config, limit, clock, log, status):
    """Follow the engine's in-flight count until it exits, SIGKILL it after `limit` seconds; log what
    happened. `engine` already has the stop signal."""
    started = clock()
    engine.remember_tree()  # its workers too, for the SIGKILL sweep
    reading, unreadable = read_work(config, READ_TIMEOUT, clock)
    account = DrainAccount(reading.in_flight if reading else None)
    message = account.stopping_message(limit, unreadable)
    log(message)
    status(message)
    while not engine.exited.is_set() and clock() - started < limit:
        engine.exited.wait(min(FOLLOW_EVERY, max(limit - (clock() - started), 0)))
        if engine.exited.is_set():
            break
        reading, _unreadable = read_work(config, READ_TIMEOUT, clock)
        if account.saw(reading.in_flight if reading else None):
            message = account.draining_message(clock() - started)
            log(message)
            status(message)
    seconds = clock() - started
    if engine.exited.is_set():
        how = "the engine ended after %.0f s (%s)" % (seconds, engine.describe_exit())
    else:
        how = "the engine was still running after %g s: SIGKILL" % limit
    engine.stop(0, signum=signal.SIGKILL)  # whatever is left of its group
    if engine.exited.is_set() and "SIGKILL" in how:
        how += " (%s)" % engine.describe_exit()
    log(account.stopped_message(how))
    return account
