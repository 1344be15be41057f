"""The record of a unit's failed starts: one contract, written by the launcher (launcher/crash_loop.py)
and read by the wait and the status look (readiness/probe.py).

It lives in the unit's StateDirectory= (/var/lib/modelwake/<unit>/failed-starts.json, owned by the
service user, kept across reboots). A failed start is a start the launcher gave up on (failed,
stalled, timeout) or whose engine exited before it was ready; its signature is its root cause's first
error line with the numbers masked, so that two out-of-memory errors of 2.31 GiB and 1.50 GiB are one
cause. The record keeps the current run of failed starts with one signature (`consecutive`, since
`since`), the last MAX_ENTRIES failed starts, the latest one's evidence, the count of every failed start
ever (`failed_starts_total`, for the textfile's counter: it never drops), and `stopped` once the
launcher ended the loop with EXIT_CRASH_LOOP.
"""
import json
import os
import re

from ..common.atomic import replace_file
from ..common.formatting import duration

FILE_NAME = "failed-starts.json"
# The launcher's exit status when it stops a crash loop; the unit lists it in RestartPreventExitStatus=.
# Here, not in launcher/exit_codes.py alone, because the wait (which may not import the launcher)
# recognises a stopped loop by it.
EXIT_CRASH_LOOP = 7
MAX_ENTRIES = 20
MAX_EVIDENCE = 40
MAX_CAUSE = 300
VERSION = 1

# What varies between two failures of one cause: addresses and hex, numbers (sizes, pids, ranks,
# line numbers, the digits in paths and times). Hex first, so that 0x7f3a... is one mask, not several.
_HEX = re.compile(r"\b0x[0-9a-fA-F]+\b|\b[0-9a-fA-F]{8,}\b")
_NUMBER = re.compile(r"\d+(?:\.\d+)?")
_SPACES = re.compile(r"\s+")


def record_path(directory):
    return os.path.join(directory, FILE_NAME)


def signature(cause):
    """The root cause with what differs between two failures of one cause masked."""
    text = _HEX.sub("#", cause.strip())
    text = _NUMBER.sub("#", text)
    return _SPACES.sub(" ", text)


def empty_record():
    return {"version": VERSION, "failed_starts_total": 0, "consecutive": 0, "since": None,
            "signature": None, "starts": [], "evidence": [], "stopped": None}


def add_failure(record, cause, evidence, started, ended, status):
    """The record after one more failed start (a new dict): `cause` its root-cause line, `started` and
    `ended` wall-clock seconds, `status` the launcher's exit status for it. The same signature as the
    run so far continues it; another begins a new run of one."""
    record = dict(record)
    sig = signature(cause)
    if record.get("signature") == sig and record.get("consecutive"):
        record["consecutive"] += 1
    else:
        record["consecutive"] = 1
        record["since"] = started
        record["signature"] = sig
    record["failed_starts_total"] = int(record.get("failed_starts_total") or 0) + 1
    entry = {"started": started, "ended": ended, "cause": cause.strip()[:MAX_CAUSE], "status": status}
    record["starts"] = (list(record.get("starts") or []) + [entry])[-MAX_ENTRIES:]
    record["evidence"] = [line[:MAX_CAUSE] for line in evidence[:MAX_EVIDENCE]]
    record["stopped"] = None
    return record


def clear_run(record):
    """The record after a start that reached ready, or a new start after a stopped loop: no run of
    failures any more; the history and the total stay."""
    record = dict(record)
    record.update(consecutive=0, since=None, signature=None, stopped=None)
    return record


def loop_message(record):
    """`crash loop: 3 failed starts in 41m02s, each torch.OutOfMemoryError: ..., stopped`: the span from
    the first start of the run to the end of the last."""
    starts = record.get("starts") or []
    last = starts[-1] if starts else {}
    span = (last.get("ended") or 0) - (record.get("since") or last.get("started") or 0)
    return "crash loop: %d failed starts in %s, each %s, stopped" % (
        record.get("consecutive") or 0, duration(max(0.0, span)), last.get("cause") or "?")


def mark_stopped(record, when):
    record = dict(record)
    record["stopped"] = {"t": when, "message": loop_message(record)}
    return record


def read_record(directory):
    """The record in directory; an empty one when there is none yet. Raises OSError or ValueError
    when it cannot be read or is not a record."""
    try:
        with open(record_path(directory)) as handle:
            data = json.load(handle)
    except FileNotFoundError:
        return empty_record()
    if not isinstance(data, dict) or data.get("version") != VERSION:
        raise ValueError("%s is not a failed-starts record of version %d" % (record_path(directory), VERSION))
    return dict(empty_record(), **data)


def write_record(directory, record):
    """Atomically (a reader never sees half a file); raises OSError."""
    replace_file(record_path(directory), json.dumps(record, indent=1, sort_keys=True) + "\n")


def last_failure(text):
    """What a deploy quotes of a unit that is down after a failed start, from the record's JSON text
    (read from the host): {"consecutive": n, "cause": words}, or None when its last start did not fail,
    there is no record, or it is not one (a deploy is never refused on a record it cannot read: the
    launcher starts a new one)."""
    try:
        record = json.loads(text) if text.strip() else {}
    except ValueError:
        return None
    if not isinstance(record, dict) or record.get("version") != VERSION:
        return None
    consecutive = record.get("consecutive")
    if not isinstance(consecutive, int) or consecutive <= 0:
        return None
    stopped = record.get("stopped") or {}
    starts = record.get("starts") or [{}]
    cause = stopped.get("message") or "Its last start failed: %s" % (starts[-1].get("cause") or "see its journal")
    return {"consecutive": consecutive, "cause": cause}
