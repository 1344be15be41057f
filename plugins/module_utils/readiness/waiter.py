"""The polling core: snapshots until ready, a terminal verdict, or the deadline.

Clock and sleep are injected (time.monotonic / time.sleep by default), so tests replay a
20-minute start in milliseconds. The loop runs to a deadline, never counts attempts.
"""
import json
import time

from .classifier import Classifier
from .phases import READY

# The look put where the stall runs out falls this much after it, so that float rounding never makes
# it a look too early to declare the stall.
STALL_LOOK_MARGIN = 0.01


def wait_for_ready(config, probe, clock=time.monotonic, sleep=time.sleep, on_snapshot=None, start=None, memory=None):
    """Poll `probe.snapshot(t, remaining)` every poll_interval seconds; return the result dict.

    `remaining` is the most seconds the look may take: the time left before the deadline, at most
    poll_interval after a completion timed out while nothing else moved or once the stall's moment
    has come, never past that moment (the first look: never past stall_timeout).

    Looks start every poll_interval, start to start: a look that takes time (HTTP probes, a
    hung completion) does not push the next one later; one that ran past the next due time is
    followed at once. So a change is seen at most one poll_interval after it happened, unless a
    look itself overran. One more look falls exactly where stall_timeout runs out since the last
    progress, so a hang is declared then, not up to a poll later (docs/readiness.md: bounds).

    timeout 0 means: look once and report the current phase; that never counts as a failure.
    The result holds the last verdict's fields plus `elapsed` (whole seconds) and `failed`.
    `start`: the clock() reading the wait began at (default: now); on_snapshot(snap, verdict) is
    called after every look. `memory` (start_memory.StartMemory): the host's earlier starts, which
    annotate each verdict (usual durations, the whole start's ETA, slower than usual); the start is
    added to them at its verdict, before that look's on_snapshot, so a textfile written there holds it.
    """
    start = clock() if start is None else start
    look_once = not config.timeout
    classifier = Classifier(config)
    warnings = []
    notes = []
    progress_error = None
    while True:
        look_start = clock()
        t = look_start - start
        remaining = None if look_once else max(0.0, config.timeout - t)
        if classifier.completion_hung:
            # The completion timed out and nothing moved since: ask again, but wait no longer
            # than a poll for it, so a hung engine is declared stalled on time (docs/readiness.md: bounds).
            short = min(config.completion_timeout, config.poll_interval)
            remaining = short if remaining is None else min(remaining, short)
        stall_due = classifier.stall_due()
        if remaining is not None:
            if stall_due is None:
                # The first look: the earliest stall is stall_timeout from it, and a hung completion must not
                # hold the look past it (docs/readiness.md: bounds).
                remaining = min(remaining, float(config.stall_timeout))
            elif stall_due > t:
                # A look waiting on a completion ends by the stall's moment, so that the look due there starts on time.
                remaining = min(remaining, stall_due - t)
            else:
                # The look that may declare the stall (nothing moved for stall_timeout): a poll at most, so a
                # server that accepts and never answers is declared within stall_timeout + 2 polls.
                remaining = min(remaining, float(config.poll_interval))
        snap = probe.snapshot(t, remaining, stacks=classifier.stacks_due(t))
        verdict = classifier.observe(snap)
        if memory is not None:
            memory.observe(t, snap, verdict)
            if not look_once and (verdict.terminal or verdict.phase == READY):
                history_error = memory.end(verdict)
                if history_error and history_error not in warnings:
                    warnings.append(history_error)
        # Signals that could not be read (journal access, systemctl, a GPU driver): said once.
        warnings.extend(e for e in snap.errors if e not in warnings)
        notes.extend(n for n in snap.notes if n not in notes)
        if config.progress_path and progress_error is None:
            progress_error = _append_progress(config.progress_path, snap, verdict)
        if on_snapshot is not None:
            on_snapshot(snap, verdict)
        if look_once or verdict.terminal or verdict.phase == READY:
            break
        next_look = min(look_start + config.poll_interval, start + config.timeout)
        stall_due = classifier.stall_due()
        if stall_due is not None and stall_due > t:
            next_look = min(next_look, start + stall_due + STALL_LOOK_MARGIN)
        sleep(max(0.0, next_look - clock()))
    result = verdict.to_dict()
    del result["terminal"]
    result["elapsed"] = int(round(clock() - start))
    result["failed"] = not look_once and verdict.phase != READY
    result["evidence"] = result["evidence"] + [note for note in notes if note not in result["evidence"]]
    if memory is not None:
        result.update(memory.result_fields())
    if progress_error:
        warnings.append(progress_error)
    if warnings:
        result["warnings"] = warnings
    return result


def _append_progress(path, snap, verdict):
    """One JSON line per poll; returns an error text instead of ending the wait."""
    try:
        with open(path, "a") as handle:
            handle.write(json.dumps({"snapshot": snap.to_dict(), "verdict": verdict.to_dict()},
                                    sort_keys=True, default=str) + "\n")
    except OSError as exc:
        return "progress_path %s could not be written: %s" % (path, exc)
    return None
