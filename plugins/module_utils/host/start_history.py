"""The record of a unit's starts on its host: one JSON object a line, the newest last, at most
MAX_RECORDS (the oldest dropped), under /var/lib/modelwake/<unit>/ (never in the model directory).

Rewritten whole on every append, through a temporary file and a rename: a reader never sees half a
line, and a crash mid-write leaves the previous record. A line that is not a record (a hand edit,
a disk error) is skipped, never fatal: the record only ever improves estimates.
"""
import json
import os

from ..common.atomic import replace_file

MAX_RECORDS = 100
FILE_NAME = "starts.jsonl"


def history_path(state_dir):
    return os.path.join(state_dir, FILE_NAME)


def read_records(path):
    """The records in the file, oldest first; [] when there is none."""
    try:
        with open(path) as handle:
            lines = handle.read().splitlines()
    except FileNotFoundError:
        return []
    records = []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            records.append(record)
    return records


def append_record(path, record, limit=MAX_RECORDS):
    """Add one record, keeping the newest `limit`. Returns an error text, or None."""
    records = (read_records(path) + [record])[-limit:]
    try:
        replace_file(path, "".join(json.dumps(entry, sort_keys=True) + "\n" for entry in records))
    except OSError as exc:
        return "start history %s could not be written: %s" % (path, exc)
    return None


def forget(path):
    """Remove the unit's history (after a hardware change): True when there was one."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    return True
