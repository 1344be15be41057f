"""The launcher's STATUS= text: written by the Type=notify launcher, read back by the classifier.

One definition for both sides. The text is one line (a newline would end the field) of at most
STATUS_CHARS characters, and its first word says the phase:
  starting the engine                                  launcher started, no verdict yet
  starting: <marker> (since 4s)                        a phase with the log line that began it
  loading 45% (29/64 shards, 412 MiB/s, ETA 6m12s)     loading, with what is known of it
  loading (3.0 GiB read, 575 MiB/s)  /  loading (since 12s)
  loading (downloading org/k26 model-00003.safetensors: 412 MiB at 30 MiB/s)   weights from the network
  loading 45% (29/64 shards, 575 MiB/s, ETA 6m12s) | 12x below this disk's 7.0 GB/s: page faults through mmap; ...
                                                       a load far below the disk's measured rate (bottleneck.py)
  initializing: <marker> (since 1m05s)
  starting: waiting for GPU 2's memory to be released by pid 4242 (sglang-a.service, stopping)
  starting: waiting for its turn on GPU 2: sglang-a.service (pid 4242) is starting (loading)
  starting: waiting for the disk: sglang-a.service (pid 4242) is prefetching its model
  starting: prefetching 12.0 GiB of 548.0 GiB (2%), 6.8 GB/s, ETA 1m18s
                                                       the launcher waits (or reads the model into the
                                                       page cache: launcher/prefetch_step.py) before it
                                                       starts the engine
  initializing: <marker> (since 9m00s) | usual: loading 16m00s, initializing 11m00s | ~2m00s left
                                                       with the host's earlier starts (history.usual_line)
  ready in 14m03s                                      after READY=1
  <the verdict's message>                              failed / stalled / timeout
The reader (status_phase) takes only starting, loading and initializing from it: whether the
server is ready is the ready check's to say, and a failure is the unit's state's.
"""
import re

from ..common.formatting import duration, size
from ..common.units import MIB
from .bottleneck import for_status
from .history import usual_line
from .phases import INITIALIZING, LOADING, NOT_STARTED, READY, STARTING, TERMINAL

# Phases a STATUS= text may open with and the reader believes.
STATUS_PHASES = (STARTING, LOADING, INITIALIZING)
STATUS_CHARS = 200
SUMMARY_CHARS = 60
# Engine log prefixes that say nothing in a one-line status: `[2026-05-25 19:06:14 TP0] `,
# `(EngineCore pid=7) INFO 11-30 12:00:01 [gpu_model_runner.py:1234] `, uvicorn's `INFO:     `.
LINE_PREFIX = re.compile(r"^(?:\s*(?:\[[^\]]*\]|\([^)]*\)|(?:INFO|WARNING|DEBUG):?|\d\d-\d\d|\d\d:\d\d:\d\d(?:\.\d+)?))+\s*")


def one_line(text):
    """A STATUS value: a newline would end the field and start an unknown key."""
    return " ".join(str(text).split())


def marker_summary(line):
    """The gist of a log marker: its text without timestamps and ranks, first sentence, short."""
    text = LINE_PREFIX.sub("", line or "").strip()
    text = text.split(". ")[0].rstrip(".").strip()
    text = re.sub(r"\s+\([^)]*\)?$", "", text)  # uvicorn's "(Press CTRL+C to quit)" and the like
    if len(text) > SUMMARY_CHARS:
        text = text[:SUMMARY_CHARS - 3].rstrip() + "..."
    return text


def format_status(verdict, elapsed):
    """The STATUS= text for a verdict: what `systemctl status` shows under the unit's state."""
    phase = verdict.phase
    if phase == READY:
        return "ready in %s" % duration(elapsed)
    if phase in TERMINAL:
        return one_line(verdict.msg)[:STATUS_CHARS]
    if phase == NOT_STARTED:
        return "starting the engine"
    since = " (since %s)" % duration(verdict.since)
    if phase == LOADING:
        head = "loading" if verdict.fraction is None else "loading %d%%" % int(verdict.fraction * 100)
        parts = []
        # While the weights come from the network, the disk's own figures say nothing (0 MiB read).
        disk = not getattr(verdict, "source", None) or (verdict.read_rate or 0) >= MIB
        if verdict.shards:
            parts.append("%d/%d shards" % tuple(verdict.shards))
        elif verdict.bytes_read and disk:
            parts.append("%s read" % size(verdict.bytes_read, mib_digits=0))
        if verdict.read_rate and disk:
            parts.append("%s/s" % size(verdict.read_rate, mib_digits=0))
        if verdict.eta is not None:
            parts.append("ETA %s" % duration(verdict.eta))
        if getattr(verdict, "source", None):
            parts.insert(0, source_words(verdict.source))
        text = head + (" (%s)" % ", ".join(parts) if parts else since)
        if getattr(verdict, "bottleneck", ""):
            # News like the rate beside it: it comes and goes with the load's speed.
            text += BOTTLENECK_SEPARATOR + for_status(verdict.bottleneck)
        return _with_where(_with_usual(text, verdict, elapsed), verdict)[:STATUS_CHARS]
    what = marker_summary(verdict.evidence[0]) if verdict.evidence else ""
    return _with_where(_with_usual(phase + (": " + what if what else "") + since, verdict, elapsed), verdict)


USUAL_SEPARATOR = " | usual: "
BOTTLENECK_SEPARATOR = " | "


def _with_usual(text, verdict, elapsed):
    """What the host's earlier starts say, when it has some: `... | usual: loading 16m00s, ... | ~2m00s left`."""
    words = usual_line(getattr(verdict, "usual", None) or {}, verdict.phase, max(0.0, elapsed - verdict.since),
                       verdict.eta)
    return text + " | " + words if words else text


SOURCE_WORDS = {"download": "downloading", "stream": "streamed", "infiniband": "received over InfiniBand"}


def source_words(source):
    """A verdict's `source` in words: `downloading org/k26 model-00003.safetensors: 1.2 GiB at 30 MiB/s`."""
    text = SOURCE_WORDS.get(source.get("kind"), source.get("kind") or "?")
    if source.get("file"):
        text += " " + source["file"]
    text += ": " + size(source.get("bytes") or 0, mib_digits=0)
    if source.get("expected"):
        text += " / " + size(source["expected"], mib_digits=0)
    if source.get("rate"):
        text += " at %s/s" % size(source["rate"], mib_digits=0)
    return text


def _with_where(text, verdict):
    """Where the ranks are, when their stacks were read (silent phases): `... | TP0-7 in f (x.py:1) for 40s`;
    when they could not be read, why (`... | no stacks: py-spy may not read process 42: ...`)."""
    where = getattr(verdict, "where", "")
    if where:
        return (text + WHERE_SEPARATOR + where)[:STATUS_CHARS]
    why = getattr(verdict, "stacks_unavailable", "")
    return (text + WHERE_SEPARATOR + "no stacks: " + why)[:STATUS_CHARS] if why else text


WHERE_SEPARATOR = " | "
# What _with_where() appends: the ranks' stacks (`TP0-7 in f (x.py:1) for 40s; ...`) or why none.
WHERE_PART = re.compile(r"^(?:no stacks: |[^|]* in (?:no Python frame|\S+ \([^()|]*:\d+\)))")


# Figures a status derives from the time as well as the work: a phase's age, a rate averaged over the load,
# the ETA, and the slow-load line's "12x below this disk's ..." beside them. They move at every look while
# nothing else does.
DERIVED_FIGURES = re.compile(r" \(since [\dhms]+\)|(?:, | at )[\d.]+ [KMGT]?i?B/s\b|, ETA [^,)|]+")
SLOW_LOAD_PART = re.compile(re.escape(BOTTLENECK_SEPARATOR) + r"[\d.]+x below .*$")


def status_news(status_text):
    """The part of a STATUS= text that changes only with the server's progress: without the ranks'
    stacks that _with_where() appends, whose `for 40s` grows at every look of a silent phase (a
    marker's own ` | `, as in a tqdm line, stays), and without the figures derived from the time (a
    hung load's average rate falls and its ETA grows at every look: a reader must not take that for work)."""
    if status_text is None:
        return None
    head, sep, tail = status_text.rpartition(WHERE_SEPARATOR)
    news = head if sep and WHERE_PART.match(tail) else status_text
    # The usual durations and the ETA counting down are no news of the server either.
    news = news.split(USUAL_SEPARATOR)[0]
    return DERIVED_FIGURES.sub("", SLOW_LOAD_PART.sub("", news))


def status_phase(status_text):
    """The phase a unit's StatusText names, or None (another service's text, or none)."""
    words = (status_text or "").split(None, 1)
    word = words[0].rstrip(":") if words else ""
    return word if word in STATUS_PHASES else None


# The launcher waits before it starts the engine (launcher/gpu_turns.py): for a stopped instance's GPU
# memory, for its turn on a GPU another start holds, or for the disk another start's prefetch reads
# (launcher/prefetch_step.py). Its own clock bounds the first, the other start's verdict or read the
# others: the reader must not take the engine's silence for a stall meanwhile.
WAITING_PREFIX = STARTING + ": "
# Its prefetch (launcher/prefetch_step.py) is bounded by its own stall rule the same way.
WAITING = re.compile(r"^" + re.escape(WAITING_PREFIX)
                     + r"(waiting for (?:GPU \d+'s memory to be released\b|its turn on GPU \d+\b|the disk: ).*"
                     r"|prefetching [\d.]+ \S+ of [\d.]+ \S+ \(\d+%\).*)$")


def waiting_status(what):
    """The STATUS= text of a launcher that waits before it starts the engine; `what` begins with
    "waiting for GPU <n>'s memory to be released", "waiting for its turn on GPU <n>" or "waiting for the
    disk:", or is its prefetch's progress."""
    return (WAITING_PREFIX + one_line(what))[:STATUS_CHARS]


def status_waiting(status_text):
    """What a launcher waits for before it starts the engine (waiting_status' `what`), or None."""
    match = WAITING.match(status_text or "")
    return match.group(1) if match else None
