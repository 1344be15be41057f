"""The ranks' stacks in words: `TP0-6 in all_reduce (parallel.py:211) for 600 s; TP7 state T
(stopped) in load_weights (loader.py:449) for 600 s - the odd one out`.

Processes in the same innermost function (of the same file) and state are one group: in a hung
collective the ranks that wait look alike, and the rank that is elsewhere is the likely cause, so
it is named. A group shows its members' most common line, and how long they have been in that
function (`since`: a loop's lines change, its function does not). The ranks come first; the API
process, the engine core and the like after them (left out of the short form when ranks are known).
"""
from ..common.formatting import duration

STATE_WORDS = {"T": "stopped", "t": "stopped by a tracer", "D": "in uninterruptible disk sleep"}
MAX_GROUPS = 4


def _ranges(numbers):
    """[0, 1, 2, 5, 7, 8] -> '0-2,5,7-8'."""
    numbers = sorted(set(numbers))
    parts = []
    start = prev = numbers[0]
    for number in numbers[1:] + [None]:
        if number is not None and number == prev + 1:
            prev = number
            continue
        parts.append("%d" % start if start == prev else "%d-%d" % (start, prev))
        if number is not None:
            start = prev = number
    return ",".join(parts)


def _function(entry):
    frames = entry.get("frames") or []
    return (frames[0][0], frames[0][1]) if frames else None


def _where(members):
    function = _function(members[0])
    if function is None:
        return "in no Python frame"
    lines = [m["frames"][0][2] for m in members]
    line = max(sorted(set(lines)), key=lines.count)
    return "in %s (%s:%d)" % (function[0], function[1], line)


def _label(members):
    ranked = [m["rank"] for m in members if m.get("rank") is not None]
    names = ["%s (pid %d)" % (m.get("name") or "?", m["pid"]) for m in members if m.get("rank") is None]
    parts = (["TP%s" % _ranges(ranked)] if ranked else []) + names[:2]
    if len(names) > 2:
        parts.append("%d more" % (len(names) - 2))
    return ", ".join(parts)


def summarize(entries, now, seconds=True, short=False):
    """One line about where each group of processes is and for how long (`now` - when it entered
    that function). seconds=False writes `40s`/`6m12s`; short: the ranks alone, when there are any
    (status and progress lines)."""
    if short and any(e.get("rank") is not None for e in entries):
        entries = [e for e in entries if e.get("rank") is not None]
    if not entries:
        return ""
    groups = {}
    for entry in entries:
        state = entry.get("state") if entry.get("state") in STATE_WORDS else ""
        groups.setdefault((_function(entry), state), []).append(entry)

    def order(item):
        # The ranks first (they are what a hang is about), the bigger group first, then by rank.
        ranked = [m["rank"] for m in item[1] if m.get("rank") is not None]
        return (not ranked, -len(item[1]), min(ranked) if ranked else 0)

    ordered = sorted(groups.items(), key=order)
    ranks_total = sum(1 for e in entries if e.get("rank") is not None)
    ranked_groups = [members for _key, members in ordered if any(m.get("rank") is not None for m in members)]
    texts = []
    for (_function_key, state), members in ordered[:MAX_GROUPS]:
        same_for = max(0.0, now - max(m.get("in_since", m["since"]) for m in members))
        text = _label(members)
        if state:
            text += " state %s (%s)" % (state, STATE_WORDS[state])
        text += " " + _where(members)
        if same_for >= 1:  # a group first seen at this read: how long it has been there is not known
            text += " for %s" % ("%d s" % round(same_for) if seconds else duration(same_for))
        if (ranks_total >= 3 and len(ranked_groups) == 2 and len(members) == 1 and members[0].get("rank") is not None):
            text += " - the odd one out"
        texts.append(text)
    if len(ordered) > MAX_GROUPS:
        texts.append("%d more groups" % (len(ordered) - MAX_GROUPS))
    return "; ".join(texts)
