"""A small JSON object kept on the host between runs (what a check found, so a later run need not
repeat it): read as {} when it is missing or unreadable, which only costs the check again, and
replaced whole, so a reader never sees half of it."""
import json
import os

from .atomic import replace_file


def read_record(path):
    """The JSON object in `path`, or {} when there is none, it cannot be read or it is not an object."""
    try:
        with open(path) as handle:
            record = json.load(handle)
        return record if isinstance(record, dict) else {}
    except (OSError, ValueError):
        return {}


def replace_record(path, record):
    """Write `record` to `path` atomically, making its directory first."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    replace_file(path, json.dumps(record, sort_keys=True))
