"""The polling core: snapshots until ready, a terminal verdict, or the deadline.

Clock and sleep are injected (time.monotonic / time.sleep by default), so tests replay a
20-minute start in milliseconds. The loop runs to a deadline, never counts attempts.
"""
import json
import time

from .classifier import Classifier
from .phases import READY


def new_wait_state(start):
    """The state of a wait that begins at `start` (a clock() reading), for wait_for_ready(state=...)."""
    return {"start": start, "next_look": None, "classifier": None, "warnings": [],
            "progress_error": None, "done": False}


def wait_for_ready(config, probe, clock=time.monotonic, sleep=time.sleep, on_snapshot=None,
                   state=None, slice_seconds=None):
    """Poll `probe.snapshot(t, remaining)` every poll_interval seconds; return the result dict.

    `remaining` is the most seconds the look's HTTP probes may take: the time left before the
    deadline, and at most poll_interval after a completion timed out while nothing else moved.

    Looks start every poll_interval, start to start: a look that takes time (HTTP probes, a
    hung completion) does not push the next one later; one that ran past the next due time is
    followed at once. So a change is seen at most one poll_interval after it happened, unless a
    look itself overran.

    timeout 0 means: look once and report the current phase; that never counts as a failure.
    The result holds the last verdict's fields plus `elapsed` (whole seconds) and `failed`.

    In slices (an action plugin shows progress between calls): `state` (new_wait_state(), then
    whatever the previous slice left in it; JSON-able, updated in place) and `slice_seconds`:
    the call returns after the last look before the next one would fall past that many seconds,
    with state["done"] False while the wait goes on. The looks, verdicts and `elapsed` are those
    of one continuous wait: times count from state["start"], and a slice first sleeps until the
    look the previous slice did not take was due.
    """
    if state is None:
        state = new_wait_state(clock())
    start = state["start"]
    slice_end = None if slice_seconds is None else clock() + slice_seconds
    look_once = not config.timeout
    if state["classifier"] is None:
        classifier = Classifier(config)
    else:
        classifier = Classifier.from_state(config, state["classifier"])
    warnings = state["warnings"]
    if state["next_look"] is not None:
        sleep(max(0.0, state["next_look"] - clock()))
    while True:
        look_start = clock()
        t = look_start - start
        remaining = None if look_once else max(0.0, config.timeout - t)
        if classifier.completion_hung:
            # The completion timed out and nothing moved since: ask again, but wait no longer
            # than a poll for it, so a hung engine is declared stalled on time (docs/readiness.md: bounds).
            short = min(config.completion_timeout, config.poll_interval)
            remaining = short if remaining is None else min(remaining, short)
        snap = probe.snapshot(t, remaining, stacks=classifier.stacks_due(t))
        verdict = classifier.observe(snap)
        # Signals that could not be read (journal access, systemctl, a GPU driver): said once.
        warnings.extend(e for e in snap.errors if e not in warnings)
        if config.progress_path and state["progress_error"] is None:
            state["progress_error"] = _append_progress(config.progress_path, snap, verdict)
        if on_snapshot is not None:
            on_snapshot(snap, verdict)
        state["done"] = bool(look_once or verdict.terminal or verdict.phase == READY)
        if state["done"]:
            break
        next_look = min(look_start + config.poll_interval, start + config.timeout)
        pause = max(0.0, next_look - clock())
        if slice_end is not None and clock() + pause > slice_end:
            state["next_look"] = clock() + pause
            break
        sleep(pause)
    state["classifier"] = classifier.state_dict()
    result = verdict.to_dict()
    del result["terminal"]
    result["elapsed"] = int(round(clock() - start))
    result["failed"] = state["done"] and not look_once and verdict.phase != READY
    warnings = list(warnings)
    if state["progress_error"]:
        warnings.append(state["progress_error"])
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
