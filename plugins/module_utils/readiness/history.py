"""What the host's earlier starts say of this one: the usual phase durations, an ETA for the whole
start, "slower than usual", and stall and ready budgets derived from evidence.

A fixed budget is too short for someone and too long for a real hang; the host itself has started
the same model before, so its own record is the evidence. Pure: records in, figures out (the record
file is host/start_history.py's; a start is summed up by StartObserver from the verdicts it sees).

A record is one JSON object (RECORD_VERSION):
  {"v": 1, "unit", "engine", "engine_version", "model", "model_bytes", "started_at" (epoch s),
   "phases": [{"phase", "duration", "longest_silence"}], "bytes_read", "load_rate" (bytes/s),
   "verdict", "verdict_after" (s), "host": {"gpus": [index, ...], "page_cache": "warm"|"cold"|null},
   "invocation": systemd's InvocationID of the start (null in pid mode): one start, one record,
   "totals": {phase: {"sum", "count"}} over every start of the unit so far (the Prometheus summary:
   kept in the newest record, so it never drops when the oldest records are)}
"""
from ..common.formatting import duration
from .phases import INITIALIZING, LOADING, NOT_STARTED, READY, STARTING

RECORD_VERSION = 1

# The phases a start goes through before ready, in order: what the ETA adds up.
TIMED_PHASES = (STARTING, LOADING, INITIALIZING)

# How many of the latest comparable starts speak for "usual": old enough ones describe another host.
USUAL_FROM = 10

# A phase past this many times its usual duration is flagged (not a failure).
SLOWER_FACTOR = 1.5
# Phases shorter than this are never flagged: seconds of jitter are not news.
SLOWER_FLOOR = 30.0

# A duration more than OUTLIER_FACTOR times the median of its kind is one start's accident (a
# cold page cache after a reboot, a hang that ended), not the usual: it is left out of the budgets.
OUTLIER_FACTOR = 3.0

# stall_timeout: auto = the longest silence seen x STALL_MARGIN + STALL_SLACK, never below STALL_FLOOR.
STALL_MARGIN = 1.5
STALL_SLACK = 60.0
STALL_FLOOR = 120.0
# ready_timeout: auto = the longest whole start seen x READY_MARGIN, never below READY_FLOOR.
READY_MARGIN = 2.0
READY_FLOOR = 600.0


def comparable(records, unit, engine_version, model):
    """The latest starts of the same unit, engine version and model that became ready: what this
    start can be compared with. Another engine version starts a new comparable set."""
    same = [r for r in records
            if r.get("v") == RECORD_VERSION and r.get("unit") == unit and r.get("engine_version") == engine_version
            and r.get("model") == model and r.get("verdict") == READY]
    return same[-USUAL_FROM:]


def _median(values):
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2.0


def _without_outliers(values):
    """values without the ones far above their median (kept as they are with fewer than three)."""
    if len(values) < 3:
        return list(values)
    limit = OUTLIER_FACTOR * _median(values)
    return [v for v in values if v <= limit]


def _phase_values(records, key):
    """{phase: [the record's `key` for that phase, per record that has it]}."""
    found = {}
    for record in records:
        for entry in record.get("phases", []):
            if entry.get("phase") in TIMED_PHASES and entry.get(key) is not None:
                found.setdefault(entry["phase"], []).append(float(entry[key]))
    return found


def usual_durations(records):
    """{phase: its median duration in seconds} over comparable records: one slow start moves a
    median little, where it would drag a mean."""
    return {phase: _median(values) for phase, values in _phase_values(records, "duration").items()}


def whole_start_eta(usual, phase, in_phase, load_eta=None):
    """Seconds left until ready: what the current phase usually has left (the byte-based `load_eta`
    while loading, when known: it follows this start's own rate) plus the usual later phases. None
    without a usual figure for the phases still to come; a phase already past its usual length
    counts as ending now (the flag says it is late)."""
    if phase == NOT_STARTED and usual and all(p in usual for p in TIMED_PHASES):
        return sum(usual[p] for p in TIMED_PHASES)  # the whole start is still to come
    if phase not in TIMED_PHASES or not usual:
        return None
    later = TIMED_PHASES[TIMED_PHASES.index(phase) + 1:]
    if any(p not in usual for p in later):
        return None
    if phase == LOADING and load_eta is not None:
        current = load_eta
    elif phase in usual:
        current = max(0.0, usual[phase] - in_phase)
    else:
        return None
    return current + sum(usual[p] for p in later)


def slower_than_usual(usual, phase, in_phase):
    """True when the current phase has run past SLOWER_FACTOR times its usual duration."""
    typical = usual.get(phase)
    return typical is not None and in_phase > max(SLOWER_FLOOR, SLOWER_FACTOR * typical)


def usual_line(usual, phase, in_phase, load_eta=None):
    """The status line's history part: `usual: loading 16m00s, initializing 11m00s | ~2m00s left`,
    `| slower than usual (x1.8)` when late; "" without history."""
    if not usual:
        return ""
    parts = ["usual: " + ", ".join("%s %s" % (p, duration(usual[p])) for p in TIMED_PHASES if p in usual)]
    eta = whole_start_eta(usual, phase, in_phase, load_eta)
    if eta is not None:
        parts.append("~%s left" % duration(eta))
    if slower_than_usual(usual, phase, in_phase):
        parts.append("slower than usual (x%.1f)" % (in_phase / usual[phase]))
    return " | ".join(parts)


class Budgets(object):
    """stall_timeout and ready_timeout for a wait, and how they were found (said once, at its start)."""

    def __init__(self, stall_timeout, ready_timeout, derivation, stall_words="", ready_words="", source=""):
        self.stall_timeout = stall_timeout
        self.ready_timeout = ready_timeout
        self.derivation = derivation
        # Each budget's own words and where they come from: a wait that takes only one as `auto` says only it.
        self.stall_words = stall_words
        self.ready_words = ready_words
        self.source = source

    def said(self, stall=True, ready=True):
        """The derivation of the budgets taken (`auto`), in one line."""
        words = [w for w, taken in ((self.stall_words, stall), (self.ready_words, ready)) if taken and w]
        return "%s: %s" % (self.source, "; ".join(words))


def auto_budgets(records, default_stall, default_ready):
    """The budgets `auto` stands for, from comparable records: the longest silence seen inside any
    phase with a margin (so the usual silent initialisation is never called a hang), and the longest
    whole start with a margin. Outliers are left out; the floors keep a short history from making a
    budget too tight. Without records: the defaults, saying so."""
    if not records:
        stall_words = "stall_timeout %s (default)" % duration(default_stall)
        ready_words = "ready_timeout %s (default)" % duration(default_ready)
        source = "with no earlier start of this model on this host, the defaults"
        return Budgets(default_stall, default_ready, "%s: %s, %s" % (source, stall_words, ready_words),
                       stall_words, ready_words, source)
    silences = [max(values) for values in _silences_per_record(records) if values]
    totals = [sum(e.get("duration") or 0.0 for e in r.get("phases", []) if e.get("phase") in TIMED_PHASES)
              for r in records]
    if silences:
        longest_silence = max(_without_outliers(silences))
        stall = max(STALL_FLOOR, longest_silence * STALL_MARGIN + STALL_SLACK)
        stall_words = ("stall_timeout %s (longest silence %s x%g + %ds)"
                       % (duration(stall), duration(longest_silence), STALL_MARGIN, STALL_SLACK))
    else:
        stall = default_stall
        stall_words = "stall_timeout %s (default: no silence recorded)" % duration(stall)
    longest_start = max(_without_outliers(totals))
    ready = max(READY_FLOOR, longest_start * READY_MARGIN)
    ready_words = "ready_timeout %s (longest start %s x%g)" % (duration(ready), duration(longest_start), READY_MARGIN)
    dropped = max(len(silences) - len(_without_outliers(silences)), len(totals) - len(_without_outliers(totals)))
    note = ", %d outlier(s) left out" % dropped if dropped else ""
    source = "from %d earlier start(s)%s" % (len(records), note)
    return Budgets(stall, ready, "%s: %s; %s" % (source, stall_words, ready_words), stall_words, ready_words, source)


def _silences_per_record(records):
    return [[float(e["longest_silence"]) for e in r.get("phases", [])
             if e.get("phase") in TIMED_PHASES and e.get("longest_silence") is not None] for r in records]


class StartObserver(object):
    """Sums up one start from the verdicts of its looks: each phase's duration and its longest
    silence (the longest time between two signs of progress inside it), the bytes read and the
    load rate. Fed every verdict; record() gives the record once the start has ended."""

    def __init__(self):
        self.longest_silence = {}
        self.last = None

    def observe(self, t, verdict):
        self.last = verdict
        last_progress = verdict.last_progress["t"] if verdict.last_progress else 0.0
        silence = max(0.0, t - max(last_progress, verdict.since))
        if verdict.phase in TIMED_PHASES:
            self.longest_silence[verdict.phase] = max(self.longest_silence.get(verdict.phase, 0.0), silence)

    def record(self, unit, engine, engine_version, model, model_bytes, started_at, host, invocation=None):
        verdict = self.last
        durations = {}
        for entry in (verdict.phases if verdict else []):
            if entry["phase"] in TIMED_PHASES:  # a phase seen twice (loading again) counts once, in full
                durations[entry["phase"]] = durations.get(entry["phase"], 0.0) + entry["duration"]
        phases = [{"phase": phase, "duration": round(durations[phase], 1),
                   "longest_silence": round(self.longest_silence.get(phase, 0.0), 1)}
                  for phase in TIMED_PHASES if phase in durations]
        loading = [entry["duration"] for entry in phases if entry["phase"] == LOADING]
        bytes_read = verdict.bytes_read if verdict else None
        rate = bytes_read / loading[0] if bytes_read and loading and loading[0] > 0 else None
        return {"v": RECORD_VERSION, "unit": unit, "engine": engine, "engine_version": engine_version,
                "model": model, "model_bytes": model_bytes, "started_at": started_at, "phases": phases,
                "bytes_read": bytes_read, "load_rate": rate, "verdict": verdict.phase if verdict else None,
                "verdict_after": round(sum(entry["duration"] for entry in phases), 1), "host": host,
                "invocation": invocation}


def with_totals(record, previous):
    """`record` with its "totals": the newest earlier record's (of any version) plus this start's
    phases. Cumulative, so the Prometheus summary built from them never drops (forget() resets it,
    which Prometheus reads as a counter reset)."""
    totals = dict((phase, dict(value)) for phase, value in ((previous or {}).get("totals") or {}).items())
    for entry in record.get("phases", []):
        total = totals.setdefault(entry["phase"], {"sum": 0.0, "count": 0})
        total["sum"] = round(total["sum"] + entry["duration"], 1)
        total["count"] += 1
    return dict(record, totals=totals)


def summary(record):
    """A record in a few words for a result (`last_start`): when, the verdict, after how long,
    each phase's duration, the engine version."""
    if not record:
        return None
    return {"started_at": record.get("started_at"), "verdict": record.get("verdict"),
            "verdict_after": record.get("verdict_after"), "engine_version": record.get("engine_version"),
            "phases": dict((e["phase"], e["duration"]) for e in record.get("phases", [])),
            "page_cache": (record.get("host") or {}).get("page_cache")}
