"""The state of a systemd unit, from `systemctl show`."""
import re

from ..common.command import run_command
from ..common.errors import ModelWakeError

PROPERTIES = ("ActiveState", "SubState", "MainPID", "NRestarts", "ExecMainStatus", "ExecMainCode",
              "Result", "StatusText", "Type", "LoadState", "InvocationID", "ControlGroup")
INT_PROPERTIES = ("MainPID", "NRestarts", "ExecMainStatus", "ExecMainCode")


# modelwake's Type=notify launcher as its command line shows it: the role's entry point, or
# `python -m modelwake launch`. As a unit's main process it is not the server (see probe.py).
LAUNCHER = re.compile(r"(?:^|[\s/])modelwake-launch(?:\s|$)|\s-m modelwake launch(?:\s|$)")


def is_launcher(cmdline):
    return bool(LAUNCHER.search(cmdline or ""))


class SystemdError(ModelWakeError):
    """systemctl is missing or did not answer."""


def parse_show(text):
    """`Key=Value` lines into a dict; integer properties as int (None when empty or absent)."""
    props = {}
    for line in text.splitlines():
        if "=" in line:
            key, value = line.split("=", 1)
            props[key] = value
    for key in INT_PROPERTIES:
        try:
            props[key] = int(props[key])
        except (KeyError, ValueError):
            props[key] = None
    return props


def unit_properties(unit, runner=run_command):
    """The PROPERTIES of unit; raises SystemdError when systemctl cannot be asked."""
    rc, out, err = runner(["systemctl", "show", unit, "-p", ",".join(PROPERTIES)], 30)
    if rc != 0:
        raise SystemdError("systemctl show %s failed (rc %d): %s" % (unit, rc, err.strip()[:300]))
    return parse_show(out)


def is_running(props):
    """The unit's processes are up (its start may still be in progress)."""
    return props.get("ActiveState") in ("active", "activating", "reloading")
