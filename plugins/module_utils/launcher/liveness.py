"""After READY=1: does the engine still work? Asked before each watchdog ping (--liveness-failures).

Three checks: `health` (GET /health 200), `completion` (a real one), and `work`, which judges from
the engine's own Prometheus /metrics: requests in flight and its token counters moving mean it
works, whatever /health says (a busy engine answers /health late, a dead one can keep answering it);
with nothing in flight a 1-token completion must come back; /metrics unreadable falls back to
/health and says so. judge_work() is the rule, pure; WorkProbe does the I/O around it.
"""
import collections
import json
import time

from ..common.formatting import http_result
from ..host import http_probe

# What a liveness probe after ready asks: /health (cheap), a real completion (vLLM's /health stays
# 200 on a hung engine; SGLang's runs a 1-token generation itself), or the engine's work (/metrics).
LIVENESS_CHECKS = ("health", "completion", "work")

# The engines' own Prometheus names (every series of a name is summed: vLLM labels them by model
# and engine index). vLLM: vllm/v1/metrics/loggers.py, the gauges vllm:num_requests_running and
# vllm:num_requests_waiting, the counters vllm:prompt_tokens and vllm:generation_tokens (exposed with
# _total); gonka-ai/gonka PR #1421 reads vllm:iteration_tokens_total, the histogram of the same
# tokens per engine step. SGLang (--enable-metrics): python/sglang/srt/metrics/collector.py and
# docs/references/production_metrics.md, the gauges sglang:num_running_reqs and sglang:num_queue_reqs,
# the counters sglang:prompt_tokens_total and sglang:generation_tokens_total. Prompt tokens count
# too: a long prefill is work before the first generated token.
EngineMetrics = collections.namedtuple("EngineMetrics", "running waiting tokens")
ENGINE_METRICS = {
    "vllm": EngineMetrics("vllm:num_requests_running", "vllm:num_requests_waiting",
                          ("vllm:prompt_tokens_total", "vllm:generation_tokens_total")),
    "sglang": EngineMetrics("sglang:num_running_reqs", "sglang:num_queue_reqs",
                            ("sglang:prompt_tokens_total", "sglang:generation_tokens_total")),
}
# The idle check: the least generation that proves the engine generates.
IDLE_COMPLETION = {"prompt": "2+2=", "max_tokens": 1, "temperature": 0}


class WorkReading(collections.namedtuple("WorkReading", "running waiting tokens at")):
    """One read of the engine's /metrics: requests running and waiting, tokens processed so far
    (prompt and generated), and when it was read (monotonic seconds)."""

    @property
    def in_flight(self):
        return self.running + self.waiting


# What decided a probe: `alive` True or False, or None when the idle completion must decide.
Judgement = collections.namedtuple("Judgement", "evidence alive words")
SERVING, STUCK, IDLE, FALLBACK = "serving", "no work", "idle", "/health"


def metric_sums(text):
    """{name: sum of its series} from a Prometheus text exposition (comments and bad lines skipped)."""
    sums = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if "{" in line:
            name, _sep, rest = line.partition("{")
            rest = rest.rpartition("}")[2]
        else:
            name, _sep, rest = line.partition(" ")
        fields = rest.split()
        if not fields:
            continue
        try:
            value = float(fields[0])
        except ValueError:
            continue
        sums[name.strip()] = sums.get(name.strip(), 0.0) + value
    return sums


def parse_work(text, engine, at):
    """(WorkReading, None), or (None, why not) when the text lacks the engine's work metrics.
    `engine` auto takes whichever engine's names the text holds."""
    sums = metric_sums(text)
    flavours = [engine] if engine in ENGINE_METRICS else sorted(ENGINE_METRICS)
    for flavour in flavours:
        names = ENGINE_METRICS[flavour]
        if names.running in sums and any(name in sums for name in names.tokens):
            return WorkReading(int(sums[names.running]), int(sums.get(names.waiting, 0)),
                               sum(sums.get(name, 0.0) for name in names.tokens), at), None
    wanted = " or ".join(ENGINE_METRICS[f].running for f in flavours)
    return None, "no %s in it" % wanted


def _requests(count):
    return "%d request%s" % (count, "" if count == 1 else "s")


def judge_work(previous, current):
    """The rule, from the last reading and this one (previous None: the first, or after a gap)."""
    if current.in_flight == 0:
        return Judgement(IDLE, None, "idle: no request in flight")
    flight = "%s in flight (%d running, %d waiting)" % (_requests(current.in_flight), current.running,
                                                        current.waiting)
    if previous is None or current.tokens < previous.tokens:
        # No baseline (or the counters started again): the next look decides.
        return Judgement(SERVING, True, "serving: %s, first look at its token counters" % flight)
    seconds = current.at - previous.at
    done = current.tokens - previous.tokens
    if done > 0:
        return Judgement(SERVING, True, "serving: %d tokens in the last %.0f s, %s" % (done, seconds, flight))
    if previous.in_flight == 0:
        # They arrived within the period: no period of theirs without work yet.
        return Judgement(SERVING, True, "serving: %s arrived since the last look" % flight)
    return Judgement(STUCK, False, "%s, no token processed in %.0f s" % (flight, seconds))


def read_work(config, timeout, clock=time.monotonic):
    """GET /metrics once: (WorkReading, None) or (None, what went wrong, in words)."""
    answer = http_probe.request(config.url.rstrip("/") + "/metrics", api_key=config.api_key, timeout=timeout)
    if answer["kind"] != "status" or answer["code"] != 200:
        return None, "/metrics %s" % http_result(answer)
    reading, missing = parse_work(answer["body"] or "", config.engine, clock())
    return reading, (None if reading else "/metrics has %s" % missing)


def _answer_json(answer):
    """The JSON body of a 200 answer, or None."""
    if answer["kind"] != "status" or answer["code"] != 200:
        return None
    try:
        return json.loads(answer["body"] or "")
    except ValueError:
        return None


def _model_name(config, timeout):
    """The model to ask: the configured one, else the first of /v1/models; (name, failure)."""
    if config.model:
        return config.model, None
    listed = http_probe.request(config.url.rstrip("/") + "/v1/models", api_key=config.api_key, timeout=timeout)
    body = _answer_json(listed)
    ids = [m.get("id") for m in (body if isinstance(body, dict) else {}).get("data", []) if isinstance(m, dict)]
    return (ids[0], None) if ids else (None, "/v1/models %s" % http_result(listed))


def idle_completion(config, timeout):
    """A 1-token completion, bounded by `timeout`: (answered, what failed)."""
    model, failure = _model_name(config, timeout)
    if model is None:
        return False, failure
    answer = http_probe.request(config.url.rstrip("/") + "/v1/completions", method="POST",
                                body=dict(IDLE_COMPLETION, model=model), api_key=config.api_key, timeout=timeout)
    body = _answer_json(answer)
    if isinstance(body, dict) and body.get("choices"):
        return True, None
    return False, "a 1-token /v1/completions %s" % http_result(answer)


class WorkProbe(object):
    """The `work` check: one /metrics read per probe, judged against the previous one; the idle
    completion or the /health fallback when the rule asks for them. Says what decided: in the
    journal when the kind of evidence changes, in STATUS= at every probe."""

    def __init__(self, config, timeout, fallback, clock=time.monotonic, log=None, status=None):
        self.config = config
        self.timeout = timeout
        self.fallback = fallback
        self.clock = clock
        self.log = log or (lambda text: None)
        self.status = status or (lambda text: None)
        self.previous = None
        self.evidence = None

    def __call__(self):
        reading, unreadable = read_work(self.config, min(self.timeout, http_probe.HEALTH_TIMEOUT), self.clock)
        if reading is None:
            self.previous = None
            answered, failure = self.fallback()
            words = "%s, /health decides: %s" % (unreadable, "answered" if answered else failure)
            return self._said(FALLBACK, answered, words)
        judgement = judge_work(self.previous, reading)
        self.previous = reading
        if judgement.alive is not None:
            return self._said(judgement.evidence, judgement.alive, judgement.words)
        answered, failure = idle_completion(self.config, self.timeout)
        words = "%s, a 1-token completion %s" % (judgement.words, "answered" if answered else "failed: " + failure)
        return self._said(IDLE, answered, words)

    def _said(self, evidence, alive, words):
        if alive:
            if evidence != self.evidence:
                self.log("liveness: %s" % words)
            self.status("ready: %s" % words)
        self.evidence = evidence
        return (True, None) if alive else (False, words)


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
        # Each of its (at most three) requests gets the whole `timeout`: a liveness failure is counted per probe.
        found = http_probe.probe_ready(config.url, ready_check=check, model=config.model, api_key=config.api_key,
                                       health_timeout=timeout, completion_timeout=timeout, budget=3 * timeout)
        if found["ready"]:
            return True, None
        for name, path in (("completion", "/v1/completions"), ("models", "/v1/models"), ("health", "/health")):
            if found[name] is not None:
                return False, "%s %s" % (path, http_result(found[name]))
        return False, "no answer"
    return probe


def watchdog_liveness(config, check, failures, ping, log=None, status=None):
    """The Liveness that decides each WATCHDOG=1 sent every `ping` seconds; `status` gets the work
    check's evidence (STATUS=)."""
    # A probe and its ping fit in the watchdog's period: at most half a ping interval each.
    limit = http_probe.COMPLETION_TIMEOUT if check in ("completion", "work") else http_probe.HEALTH_TIMEOUT
    timeout = min(limit, ping / 2)
    if check == "work":
        fallback = liveness_probe(config, "health", min(http_probe.HEALTH_TIMEOUT, ping / 2))
        probe = WorkProbe(config, timeout, fallback, log=log, status=status)
    else:
        probe = liveness_probe(config, check, timeout)
    return Liveness(probe, failures, log=log)


def unresponsive_message(liveness, ping):
    return ("stalled: the engine stopped answering after it was ready (%s, %d times in a row, every %g s): "
            "no more WATCHDOG=1, systemd's watchdog restarts it"
            % (liveness.last_failure, liveness.missed, ping))
