"""Many hosts' waits in one line: how many hosts are in each phase, and which ended badly and why.

    12 loading, 40 initializing, 11 ready, 1 failed: gpu-17 (torch.OutOfMemoryError: CUDA out of memory ...)

The deploy's live output uses it once a play waits on more hosts than a screen shows line by line
(plugins/action/wait_for_model_ready.py); the status playbook ends with it (the fleet_summary lookup).
"""
from .phases import FAILED, PHASES, READY, STALLED, TERMINAL, TIMEOUT

# Hosts up to this many get a progress line each per interval; more get the summary line instead.
LINES_PER_HOST_UP_TO = 4
# Not a phase: a host whose wait the controller cannot read for now (plugins/action/wait_for_model_ready.py's Gap).
UNREACHABLE = "unreachable"
# The phases in the order the line names them: the start's course, the hosts not answering, then the verdicts
# that end it badly.
ORDER = PHASES + (UNREACHABLE, STALLED, TIMEOUT, FAILED)
ENDED = (READY,) + TERMINAL  # a wait with one of these has its verdict
# Hosts named with their cause, per bad verdict; the rest are counted ("and 3 more").
NAMED = 3
CAUSE_CHARS = 80


def cause(msg):
    """A failed or stalled look's message, short: what comes after its verdict word, cut to CAUSE_CHARS."""
    text = (msg or "").strip()
    for verdict in TERMINAL:
        if text.startswith(verdict + ":"):
            text = text[len(verdict) + 1:].strip()
            break
    return text if len(text) <= CAUSE_CHARS else text[:CAUSE_CHARS - 4].rstrip() + " ..."


def summary_line(looks, not_looked=0):
    """The line for {host: {"phase": ..., "msg": ...}} (each host's latest look or result); `not_looked`
    hosts of the play have no look yet (their wait has not begun)."""
    counts = {}
    bad = {}
    for host in sorted(looks):
        phase = looks[host].get("phase") or "unknown"
        counts[phase] = counts.get(phase, 0) + 1
        if phase in TERMINAL:
            bad.setdefault(phase, []).append("%s (%s)" % (host, cause(looks[host].get("msg"))))
    parts = ["%d not looked at yet" % not_looked] if not_looked else []
    for phase in ORDER + tuple(sorted(set(counts) - set(ORDER))):
        if phase not in counts:
            continue
        part = "%d %s" % (counts[phase], phase.replace("_", " "))
        if phase in bad:
            named = bad[phase][:NAMED]
            more = len(bad[phase]) - len(named)
            part += ": " + ", ".join(named) + (" and %d more" % more if more else "")
        parts.append(part)
    return ", ".join(parts) if parts else "no hosts"
