"""The state of a systemd unit, from `systemctl show`; the names the role gives a unit's files."""
import os
import re

from ..common.command import run_command
from ..common.errors import ModelWakeError

PROPERTIES = ("ActiveState", "SubState", "MainPID", "NRestarts", "ExecMainStatus", "ExecMainCode",
              "Result", "StatusText", "Type", "LoadState", "InvocationID", "ControlGroup",
              "CPUUsageNSec", "IOReadBytes", "InactiveExitTimestampMonotonic")
INT_PROPERTIES = ("MainPID", "NRestarts", "ExecMainStatus", "ExecMainCode")
CLD_EXITED = 1  # ExecMainCode of a main process that exited (ExecMainStatus is then its exit status, not a signal)


# modelwake's Type=notify launcher as its command line shows it: the role's entry point, or
# `python -m modelwake launch`. As a unit's main process it is not the server (see probe.py).
LAUNCHER = re.compile(r"(?:^|[\s/])modelwake-launch(?:\s|$)|\s-m modelwake launch(?:\s|$)")


def is_launcher(cmdline):
    return bool(LAUNCHER.search(cmdline or ""))


# Where the role's units keep their state (StateDirectory=modelwake/<unit>, under /var/lib): the
# launcher's records of failed starts and of every start; it survives reboots.
STATE_ROOT = "/var/lib/modelwake"
SERVICE_SUFFIX = ".service"


def unit_name(unit):
    """`sglang-k26` for `sglang-k26.service` or `sglang-k26`: how the role names the unit's directories
    and files (its state directory, its hold flag, its records)."""
    return unit[:-len(SERVICE_SUFFIX)] if unit and unit.endswith(SERVICE_SUFFIX) else unit


def state_dir(unit, root=None):
    """The unit's state directory (StateDirectory=modelwake/<unit>), under `root` (default STATE_ROOT)."""
    return os.path.join(root or STATE_ROOT, unit_name(unit))


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


# What systemctl shows for a counter the unit does not account ("[not set]", or UINT64_MAX).
UNSET_COUNTER = 2 ** 64 - 1


def accounted(props, name):
    """A cgroup counter of the unit (CPUUsageNSec, IOReadBytes) as an int, None where systemd does
    not account it (CPUAccounting=/IOAccounting= off, or no such controller)."""
    try:
        value = int((props or {}).get(name))
    except (TypeError, ValueError):
        return None
    return None if value >= UNSET_COUNTER or value < 0 else value


class UnitAccounting(object):
    """systemd's accounting of the unit's cgroup as a second view of the process tree's counters.

    The tree misses work by processes that left it (reparented to init, double-forked) while they
    ran; the cgroup holds them all. The growth shown is the larger of the two views' since the
    first look: nothing counts twice, and a restart (the unit's counters begin again) falls back to
    the tree.

    The cgroup also holds modelwake's launcher when it is the unit's main process: its own looks,
    and the py-spy and nvidia-smi runs it reaps, are not the server's work (a launcher reading its
    engine's stacks every few seconds would look like a server at work to this wait, and hide a
    hang). `launcher` is the CPU seconds and read bytes of the launcher and the tools it runs,
    reaped children's included, taken out."""

    def __init__(self):
        self.first = None  # (tree CPU s, tree bytes, unit CPU s, unit bytes) at the first look

    def combine(self, tree_cpu, tree_read, unit, launcher=(0.0, 0)):
        unit_ns, unit_read = accounted(unit, "CPUUsageNSec"), accounted(unit, "IOReadBytes")
        unit_cpu = None if unit_ns is None else unit_ns / 1e9 - launcher[0]
        if unit_read is not None:
            unit_read -= launcher[1]
        if self.first is None:
            self.first = (tree_cpu, tree_read, unit_cpu, unit_read)
        return (_larger_growth(tree_cpu, self.first[0], unit_cpu, self.first[2]),
                _larger_growth(tree_read, self.first[1], unit_read, self.first[3]))


def _larger_growth(tree, tree0, unit, unit0):
    if tree is None or tree0 is None or unit is None or unit0 is None:
        return tree
    return tree0 + max(tree - tree0, unit - unit0)


def unit_properties(unit, runner=run_command):
    """The PROPERTIES of unit; raises SystemdError when systemctl cannot be asked."""
    rc, out, err = runner(["systemctl", "show", unit, "-p", ",".join(PROPERTIES)], 30)
    if rc != 0:
        raise SystemdError("systemctl show %s failed (rc %d): %s" % (unit, rc, err.strip()[:300]))
    return parse_show(out)


def is_running(props):
    """The unit's processes are up (its start may still be in progress)."""
    return props.get("ActiveState") in ("active", "activating", "reloading")
