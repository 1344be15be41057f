"""The polling core: snapshots until ready, a terminal verdict, or the deadline.

Clock and sleep are injected (time.monotonic / time.sleep by default), so tests replay a
20-minute start in milliseconds. The loop runs to a deadline, never counts attempts.
"""
import json
import time

from .classifier import READY, Classifier


def wait_for_ready(config, probe, clock=time.monotonic, sleep=time.sleep, on_snapshot=None):
    """Poll `probe.snapshot(t, remaining)` every poll_interval seconds; return the result dict.

    timeout 0 means: look once and report the current phase; that never counts as a failure.
    The result holds the last verdict's fields plus `elapsed` (whole seconds) and `failed`.
    """
    start = clock()
    look_once = not config.timeout
    classifier = Classifier(config)
    progress_error = None
    warnings = []
    while True:
        t = clock() - start
        remaining = None if look_once else max(0.0, config.timeout - t)
        snap = probe.snapshot(t, remaining)
        verdict = classifier.observe(snap)
        # Signals that could not be read (journal access, systemctl, a GPU driver): said once.
        warnings.extend(e for e in snap.errors if e not in warnings)
        if config.progress_path and progress_error is None:
            progress_error = _append_progress(config.progress_path, snap, verdict)
        if on_snapshot is not None:
            on_snapshot(snap, verdict)
        if look_once or verdict.terminal or verdict.phase == READY:
            break
        sleep(max(0.0, min(config.poll_interval, start + config.timeout - clock())))
    result = verdict.to_dict()
    del result["terminal"]
    result["elapsed"] = int(round(clock() - start))
    result["failed"] = not look_once and verdict.phase != READY
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
