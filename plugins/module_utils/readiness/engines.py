"""What SGLang's and vLLM's log lines mean: phase markers, crash signatures, hang-time chatter.

Every pattern is an exact string from the engines' source or real logs (the recorded vLLM logs
are in tests/fixtures/traces/); log prefixes (`[2026-05-25 19:06:14 TP0]`, `(EngineCore pid=7)
INFO 11-30 ...`) vary, so patterns search anywhere in the line. What each phase means:
docs/readiness.md.
"""
import re

from .phases import INITIALIZING, LOADING, STARTING

READY_HINT = "ready_hint"  # the engine says it is ready; the ready check still decides

# A new run of the server starts: lines before it belong to an earlier run.
RUN_START = {
    "sglang": [r"server_args=ServerArgs\("],
    "vllm": [r"vLLM API server version ", r"non-default args: \{"],
}

# Ordered: the first pattern that matches a line gives its phase hint.
MARKERS = {
    "sglang": [
        (r"Init torch distributed begin", STARTING),
        (r"Load weight begin", LOADING),
        (r"Loading safetensors checkpoint shards", LOADING),
        (r"Multi-thread loading shards", LOADING),
        (r"Load weight end", INITIALIZING),
        (r"KV Cache is allocated", INITIALIZING),
        (r"Memory pool end", INITIALIZING),
        (r"Capture cuda graph begin", INITIALIZING),
        (r"Capturing batches \(bs=", INITIALIZING),
        (r"Entering DeepGEMM JIT", INITIALIZING),
        (r"max_total_num_tokens=", INITIALIZING),
        (r"Uvicorn running on", INITIALIZING),
        (r"Application startup complete\.", INITIALIZING),  # SGLang warms up after this
        (r"The server is fired up and ready to roll!", READY_HINT),
    ],
    "vllm": [
        (r"Initializing a V1 LLM engine", STARTING),
        (r"Waiting for init message from front-end", STARTING),
        (r"Starting to load model", LOADING),
        (r"Using model weights format", LOADING),
        (r"Loading safetensors checkpoint shards", LOADING),
        (r"Loading weights took", INITIALIZING),
        (r"Model loading took", INITIALIZING),
        (r"Memory profiling takes", INITIALIZING),
        (r"Warming up model", INITIALIZING),
        # The compile's own summary only: "Enforce eager set, disabling torch.compile, ..." is a
        # configuration warning printed at start, long before the weights load.
        (r"torch\.compile takes", INITIALIZING),
        (r"Capturing CUDA graphs", INITIALIZING),
        (r"GPU KV cache size|CPU KV cache size", INITIALIZING),
        (r"init engine", INITIALIZING),
        (r"Starting vLLM (API )?server", INITIALIZING),
        (r"Application startup complete\.", READY_HINT),
    ],
}

# Engines whose log always says when reading the weights begins: vLLM's worker logs `Starting to
# load model` first. With their log followed, disk reads and GPU memory before that line are the
# imports of the engine's processes and CUDA set-up (a cold page cache reads hundreds of MB for
# torch alone: more than a small model), not loading. SGLang may load silently (the K2.6 story).
LOGS_LOAD_START = ("vllm",)

# Lines that mean the start has failed, whatever else is seen.
FATAL = {
    "sglang": [
        r"Scheduler hit an exception",
        r"Received sigquit from a child proces",  # sic: "proces" in SGLang's source
        r"Initialization failed\. warmup error",
        r"[Ww]atchdog timeout \(self\.watchdog_timeout=",
        r"Rank \d+ scheduler is dead",  # a scheduler killed without a traceback (OOM killer, SIGKILL)
    ],
    "vllm": [
        r"Engine core initialization failed",
        r"WorkerProc failed to start",
        r"WorkerProc initialization failed",
        r"EngineDeadError",
        r"died unexpectedly",
        r"Timed out waiting for engine core processes to start",
    ],
    "both": [
        r"Address already in use",
        r"CUDA out of memory",
        r"OutOfMemoryError",
        r"SafetensorError",
    ],
}

# Printed during legitimate slow work AND during real hangs: never evidence of progress.
HEARTBEAT = [
    r"No available shared memory broadcast block found in \d+ seconds",
    r"Waiting for \d+ local, \d+ remote core engine proc",
    r"Health check failed",
    r"Health check request received during shutdown",
]
# Access-log lines of the probes (ours, and SGLang's own warm-up polling): neither progress nor
# evidence worth showing.
PROBE_ACCESS = re.compile(r"\"(GET|POST) /(health|health_generate|v1/models|v1/completions|get_model_info)\S* HTTP/[\d.]+\" \d{3}")

# Lines only one engine prints: how `engine: auto` decides.
SIGNATURES = {
    "sglang": [r"server_args=ServerArgs\(", r"Init torch distributed begin", r"Load weight begin",
               r"sglang::", r"\d\d:\d\d:\d\d TP\d+\]", r"ready to roll"],
    "vllm": [r"vLLM API server version", r"Initializing a V1 LLM engine", r"\((APIServer|EngineCore\w*|Worker\w*) pid=\d+\)",
             r"Starting to load model", r"VLLM::"],
}

# Where the server says it listens (SGLang's uvicorn line; vLLM's API server line).
LISTEN_URL = re.compile(r"(?:Uvicorn running on|Starting vLLM (?:API )?server(?: \d+)? on) (https?://[^\s()]+)")

SHARDS = re.compile(r"(?:Loading safetensors checkpoint shards|Multi-thread loading shards):\s*(\d+)% Completed \| (\d+)/(\d+)")

# A specific exception line: `SafetensorError: ...`, `OSError: [Errno 98] ...`, `pydantic_core...ValidationError: ...`.
EXCEPTION_LINE = re.compile(r"(?:^|[\s:])((?:[A-Za-z_][\w]*\.)*[A-Z]\w*(?:Error|Exception|Exit|Interrupt)):(?:\s|$)")
# Wrappers that only say "see above": never the root cause when a specific error precedes them.
GENERIC_ERRORS = [
    r"Engine core initialization failed",
    r"EngineDeadError",
    r"WorkerProc (initialization failed|failed to start)",
    r"Received sigquit from a child proces",
]
TRACEBACK_TAIL = 20
WARNING = re.compile(r"\bWARNING\b|\bWarning: ")

_compiled = {}


def _rx(pattern):
    if pattern not in _compiled:
        _compiled[pattern] = re.compile(pattern)
    return _compiled[pattern]


def _any(patterns, line):
    return any(_rx(p).search(line) for p in patterns)


def engines_for(engine):
    """The engines whose tables apply: one, or both while `auto` has not decided yet."""
    return ["sglang", "vllm"] if engine == "auto" else [engine]


def detect_engine(line):
    """'sglang', 'vllm' or None: which engine printed this line, if it tells."""
    for engine in ("sglang", "vllm"):
        if _any(SIGNATURES[engine], line):
            return engine
    return None


# The notify launcher's own lines in the unit's journal (launcher/supervisor.py). They are news, but
# never the engine's: they quote its errors ("starting again after a stopped crash loop: ..., each
# torch.OutOfMemoryError ...") and its command line, which must not count as a new run's crash or marker.
LAUNCHER_LINE_PREFIX = "modelwake: "


def classify_line(engine, line):
    """(kind, phase hint) of one log line: kind is run_start, fatal, heartbeat, probe, marker or other.

    With engine 'auto', a line both engines print with different meanings gets the more
    cautious one (`Application startup complete.` is ready for vLLM, only warm-up for SGLang).
    """
    if line.startswith(LAUNCHER_LINE_PREFIX):
        return "other", None
    names = engines_for(engine)
    if _any([p for n in names for p in RUN_START[n]], line):
        return "run_start", STARTING
    if _any([p for n in names for p in FATAL[n]] + FATAL["both"], line):
        return "fatal", None
    if _any(HEARTBEAT, line):
        return "heartbeat", None
    if PROBE_ACCESS.search(line):
        return "probe", None
    hints = []
    for name in names:
        for pattern, phase in MARKERS[name]:
            if _rx(pattern).search(line):
                hints.append(phase)
                break
    if hints:
        return "marker", min(hints, key=PHASE_ORDER.index)
    return "other", None


PHASE_ORDER = [STARTING, LOADING, INITIALIZING, READY_HINT]


def shard_progress(line):
    """(n, N) from a tqdm shard-loading line, else None."""
    found = None
    for match in SHARDS.finditer(line):
        found = (int(match.group(2)), int(match.group(3)))  # the last redraw in a \r-joined record
    return found


def listen_url(line):
    """The URL a server logged that it listens on, else None."""
    match = LISTEN_URL.search(line)
    return match.group(1).rstrip("/") if match else None


def is_generic(line):
    return _any(GENERIC_ERRORS, line)


def root_cause(tail, fatal_line=None):
    """The evidence for a crash: the root-cause line first, then the tail of the traceback.

    The root cause is the FIRST specific exception line in the tail (vLLM's truncated shard:
    `SafetensorError: ...`, printed before `RuntimeError: Engine core initialization failed.
    See root cause above.`); without one, the fatal line itself.
    """
    cause = None
    for line in tail:
        # A WARNING may quote an exception it only fears (vLLM's ulimit warning names OSError).
        if EXCEPTION_LINE.search(line) and not is_generic(line) and not WARNING.search(line):
            cause = line
            break
    if cause is None:
        cause = fatal_line
    # The tail of the last traceback (not the banner or config lines before it), at most TRACEBACK_TAIL lines.
    starts = [i for i, line in enumerate(tail) if "Traceback (most recent call last)" in line]
    recent = tail[starts[-1]:] if starts else tail
    evidence = [cause] if cause is not None else []
    evidence.extend(line for line in recent[-TRACEBACK_TAIL:] if line != cause)
    return evidence


def crash_evidence(tail):
    """The evidence kept for a server that died, from the last lines of its output: the root cause
    and its traceback when any line names an exception, else the last TRACEBACK_TAIL lines. One rule
    for the wait's verdicts and the launcher's exit after ready."""
    if any(EXCEPTION_LINE.search(line) for line in tail):
        return root_cause(tail)
    return tail[-TRACEBACK_TAIL:]
