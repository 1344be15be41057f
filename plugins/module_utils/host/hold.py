"""A unit's maintenance hold: the flag an operator sets (playbooks/hold.yml) so that automation
leaves the unit alone while a person works on it.

The flag is one root-owned file per unit, /etc/modelwake/hold/<unit>.json, written by the playbook and
read by the launcher (which runs as the service user and cannot remove it) and by the readiness
module's looks. Its content is one JSON object:

    {"unit": "sglang-k26.service", "by": "alice", "since": "2026-12-04T23:30:00Z", "reason": "NVLink reseat"}

The file's presence is the hold: a file that cannot be read or parsed still holds the unit (automation
must rather leave a box alone than restart it under a person's hands), with the error as its reason.
"""
import errno
import json
import os

from . import systemd

# Where the role and the playbook keep the flags (model_service_hold_dir's default).
HOLD_DIR = "/etc/modelwake/hold"
HOLD_KEYS = ("by", "since", "reason")


class Hold(object):
    """Who holds a unit, since when (UTC, ISO 8601 as written) and why."""

    def __init__(self, by, since, reason):
        self.by = by
        self.since = since
        self.reason = reason

    def describe(self):
        return "held by %s since %s: %s" % (self.by, self.since, self.reason)

    def as_dict(self):
        return {"by": self.by, "since": self.since, "reason": self.reason}


def hold_path(hold_dir, unit):
    """The flag file of `unit` (with or without .service) in `hold_dir`; None when holds are off (no dir)."""
    if not hold_dir:
        return None
    return os.path.join(hold_dir, systemd.unit_name(unit) + ".json")


def parse_hold(text):
    """The Hold a flag file's text says; unknown values for a malformed file (still a hold)."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        return Hold("unknown", "unknown", "the hold file is not JSON (%s)" % exc)
    if not isinstance(data, dict):
        return Hold("unknown", "unknown", "the hold file holds no JSON object")
    values = [str(data.get(key) or "unknown") for key in HOLD_KEYS]
    return Hold(*values)


def read_hold(path):
    """The hold at `path`, or None when the unit is not held (no path given, no file)."""
    if not path:
        return None
    try:
        with open(path) as handle:
            return parse_hold(handle.read())
    except (IOError, OSError) as exc:
        if exc.errno == errno.ENOENT:
            return None
        return Hold("unknown", "unknown", "the hold file %s cannot be read (%s)" % (path, exc.strerror))
