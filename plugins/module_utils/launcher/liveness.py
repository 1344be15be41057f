"""After READY=1: does the engine still answer? Asked before each watchdog ping (--liveness-failures)."""
from ..common.formatting import http_result
from ..host import http_probe

# What a liveness probe after ready asks: /health (cheap), or a real completion (vLLM's /health stays
# 200 on a hung engine; SGLang's runs a 1-token generation itself).
LIVENESS_CHECKS = ("health", "completion")


class Liveness(object):
    """After READY=1: does the engine still answer? One probe before each watchdog ping.

    `probe()` returns (answered, what failed). After `failures` failed probes in a row the verdict is
    final: no more pings, ever, for this run (systemd's watchdog then kills the unit and Restart=
    starts it again). An answer before that resets the count. No clock, no I/O of its own."""

    def __init__(self, probe, failures, log=None):
        self.probe = probe
        self.failures = failures
        self.log = log or (lambda text: None)
        self.missed = 0
        self.last_failure = None
        self.gave_up = False

    def answers(self):
        """Probe once: True while the pings may go on."""
        if self.gave_up:
            return False
        answered, failure = self.probe()
        if answered:
            if self.missed:
                self.log("liveness: the engine answers again after %d failed probe(s)" % self.missed)
            self.missed = 0
            return True
        self.missed += 1
        self.last_failure = failure
        self.gave_up = self.missed >= self.failures
        if not self.gave_up:
            self.log("liveness: %s (%d of %d failed probes in a row)" % (failure, self.missed, self.failures))
        return not self.gave_up


def liveness_probe(config, check, timeout):
    """The engine asked once, as the ready check asks it (http_probe.probe_ready, the key from the
    launcher's environment), every request bounded by `timeout`: (answered, what failed)."""
    def probe():
        found = http_probe.probe_ready(config.url, ready_check=check, model=config.model, api_key=config.api_key,
                                       health_timeout=timeout, completion_timeout=timeout)
        if found["ready"]:
            return True, None
        for name, path in (("completion", "/v1/completions"), ("models", "/v1/models"), ("health", "/health")):
            if found[name] is not None:
                return False, "%s %s" % (path, http_result(found[name]))
        return False, "no answer"
    return probe


def watchdog_liveness(config, check, failures, ping, log=None):
    """The Liveness that decides each WATCHDOG=1 sent every `ping` seconds."""
    # A probe and its ping fit in the watchdog's period: at most half a ping interval each.
    limit = http_probe.COMPLETION_TIMEOUT if check == "completion" else http_probe.HEALTH_TIMEOUT
    return Liveness(liveness_probe(config, check, min(limit, ping / 2)), failures, log=log)


def unresponsive_message(liveness, ping):
    return ("stalled: the engine stopped answering after it was ready (%s, %d times in a row, every %g s): "
            "no more WATCHDOG=1, systemd's watchdog restarts it"
            % (liveness.last_failure, liveness.missed, ping))
