"""Serving as the real engines report it: their /metrics names, a drain on SIGTERM, a slow /health.

/metrics: vLLM's and SGLang's own names for the requests in flight and the tokens processed
(vllm:num_requests_running, vllm:num_requests_waiting, vllm:prompt_tokens_total,
vllm:generation_tokens_total; sglang:num_running_reqs, sglang:num_queue_reqs,
sglang:prompt_tokens_total, sglang:generation_tokens_total), counted as rank 0 works: the token
counters move at every decode step, not only when a request ends. modelwake_sim_generation_tokens_total
(tokens of finished requests) stays.

--shutdown-timeout N (vLLM's option, PR #36666, in 0.32.0's arg_utils.py: "0 = abort, >0 = wait";
with --engine sglang a stand-in of the simulator's own, SGLang has none): on SIGTERM after ready the
API process refuses new requests (503), lets those in flight finish for up to N s while it still
serves /metrics, then exits, logging vLLM's own `[shutdown] API server: ...` lines. /health answers
503 meanwhile: the simulator's choice, what vLLM's /health says during a drain is not pinned down.
The ranks keep generating (a SIGTERM of their own, from systemd's sweep of the cgroup, does not end
them early).

--slow-health S: while requests are in flight /health answers only after S s (an API loop starved
by a busy engine): the case where /health is a poor liveness signal.
"""
import signal
import time

# After the last request of a drain: uvicorn's shutdown, the engine core's, before the exit.
SHUTDOWN_PAUSE = 0.5
PROGRESS_EVERY = 0.2


def add_options(serve):
    serve.add_argument("--shutdown-timeout", type=float, default=0.0, metavar="SECONDS",
                       help="vLLM's drain: on SIGTERM after ready refuse new requests and let those in flight "
                            "finish for up to SECONDS, then exit (default 0: end them at once). With --engine "
                            "sglang a stand-in of the simulator's own: SGLang has no such option")
    serve.add_argument("--slow-health", type=float, default=0.0, metavar="SECONDS",
                       help="simulator only: while requests are in flight, /health answers after SECONDS "
                            "(a busy engine's late answer; default 0)")


def drains(opts):
    return getattr(opts, "shutdown_timeout", 0) > 0


def keep_serving_on_sigterm(opts):
    """A rank or the engine core with a drain configured: SIGTERM does not end it; the API process
    ends it once the drain is over (or its death does)."""
    if drains(opts):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)


class WorkCounters(object):
    """What the API process counts for /metrics (rank 0 reports its tokens as it goes)."""

    def __init__(self):
        self.prompt_tokens = 0
        self.generation_tokens = 0

    def add(self, event):
        self.prompt_tokens += event.get("prompt", 0)
        self.generation_tokens += event.get("generated", 0)


class TokenReporter(object):
    """Rank 0's side: tokens processed, sent to the API process (`emit`) every PROGRESS_EVERY seconds."""

    def __init__(self, emit):
        self.emit = emit
        self.prompt = 0
        self.generated = 0
        self.sent_at = time.monotonic()

    def step(self, prompt=0, generated=0):
        self.prompt += prompt
        self.generated += generated
        if time.monotonic() - self.sent_at >= PROGRESS_EVERY or not generated:
            self.flush()

    def flush(self):
        if self.prompt or self.generated:
            self.emit({"ev": "tokens", "prompt": self.prompt, "generated": self.generated})
        self.prompt = self.generated = 0
        self.sent_at = time.monotonic()


def metrics_text(app):
    """/metrics in the engine's own names, and the simulator's own counter."""
    running = app.in_flight()
    label = '{model_name="%s"}' % app.served_model_name.replace("\\", "\\\\").replace('"', '\\"')
    if app.engine == "vllm":
        label = label[:-1] + ',engine="0"}'
        series = [("vllm:num_requests_running", "gauge", running), ("vllm:num_requests_waiting", "gauge", 0),
                  ("vllm:prompt_tokens_total", "counter", app.work.prompt_tokens),
                  ("vllm:generation_tokens_total", "counter", app.work.generation_tokens)]
    else:
        series = [("sglang:num_running_reqs", "gauge", running), ("sglang:num_queue_reqs", "gauge", 0),
                  ("sglang:prompt_tokens_total", "counter", app.work.prompt_tokens),
                  ("sglang:generation_tokens_total", "counter", app.work.generation_tokens)]
    lines = []
    for name, kind, value in series:
        lines += ["# TYPE %s %s" % (name, kind), "%s%s %s" % (name, label, float(value))]
    lines += ["# HELP modelwake_sim_generation_tokens_total Generated tokens.",
              "# TYPE modelwake_sim_generation_tokens_total counter",
              "modelwake_sim_generation_tokens_total %d" % app.served_tokens]
    return "\n".join(lines) + "\n"


def slow_health(app):
    """--slow-health: a busy engine's /health answers late."""
    if app.opts.slow_health and app.in_flight():
        time.sleep(app.opts.slow_health)


def drain(app):
    """SIGTERM after ready with --shutdown-timeout: refuse new requests, wait for those in flight."""
    app.state = "draining"
    timeout = app.opts.shutdown_timeout
    if app.engine == "vllm":
        # vllm/entrypoints/launchers/launcher.py (0.32.0): the HTTP server serves on while the engine drains.
        app.log.info("[shutdown] API server: shutdown triggered", "launcher.py:101")
        app.log.info("[shutdown] API server: stopping engine client mode=drain timeout=%ss" % format(timeout, "g"),
                     "launcher.py:113")
    else:
        app.log.uvicorn("Shutting down")
        app.log.uvicorn("Waiting for connections to close. (CTRL+C to force quit)")
    deadline = time.monotonic() + timeout
    while app.in_flight() and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(SHUTDOWN_PAUSE)
    if app.engine == "vllm":
        app.log.info("[shutdown] API server: engine client stopped", "launcher.py:119")
        app.log.info("[shutdown] API server: signalling HTTP server shutdown", "launcher.py:122")
        app.log.uvicorn("Shutting down")
