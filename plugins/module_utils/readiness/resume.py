"""A wait in slices: each call of the module observes for a slice and leaves the wait's state
on the host for the next call, so the action plugin can print progress between calls.

The state file (0600, under /run/modelwake for root, else the temporary directory) holds what a
continuous wait keeps in memory: the classifier's state, the process tree's per-process counters,
where each log source stopped (file offset and inode, journald cursor), the start of the wait on
the monotonic clock, and the boot id that makes that clock meaningful. It never holds the API key
(the parameters come with every call). The last slice removes it.
"""
import json
import os
import re
import tempfile
import time

from .config import build_config
from ..common.errors import ModelWakeError
from .probe import HostProbe
from .waiter import new_wait_state, wait_for_ready

STATE_VERSION = 1
ROOT_STATE_DIR = "/run/modelwake"
STATE_PREFIX = "modelwake-wait-"
STATE_NAME = re.compile(r"^%s[A-Za-z0-9_]+\.json$" % STATE_PREFIX)
BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"
LOG_LINE_CHARS = 160


class ResumeError(ModelWakeError):
    """The saved state cannot continue this wait; `elapsed` is how long it had run, if known."""

    def __init__(self, message, elapsed=0):
        self.elapsed = elapsed
        super().__init__(message)


def boot_id(path=BOOT_ID_PATH):
    try:
        with open(path) as handle:
            return handle.read().strip()
    except OSError:
        return None


def _identity(params):
    """What makes two calls the same wait: the server watched, where."""
    return {"url": params.get("url"), "unit": params.get("unit"), "pid": params.get("pid")}


def state_dir():
    if os.geteuid() == 0:
        try:
            os.makedirs(ROOT_STATE_DIR, mode=0o755, exist_ok=True)
            return ROOT_STATE_DIR
        except OSError:
            pass
    return tempfile.gettempdir()


def save(path, data):
    """Write atomically (a reader never sees half a file), mode 0600; return the path."""
    directory = os.path.dirname(path) if path else state_dir()
    fd, tmp = tempfile.mkstemp(prefix=STATE_PREFIX, suffix=".json", dir=directory)
    try:
        with os.fdopen(fd, "w") as handle:
            json.dump(data, handle, sort_keys=True)
        os.replace(tmp, path or tmp)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path or tmp


def _check_path(path):
    """Only a state file this module made: the name it gives, owned by this user."""
    if not STATE_NAME.match(os.path.basename(path)):
        raise ResumeError("_resume: %s is not a wait state file (%s*.json)" % (path, STATE_PREFIX))
    try:
        owner = os.stat(path).st_uid
    except OSError:
        raise ResumeError("the saved state of this wait (%s) is gone: the host rebooted or its "
                          "temporary files were cleaned during the wait" % path)
    if owner != os.geteuid():
        raise ResumeError("_resume: %s belongs to uid %d, not to this user" % (path, owner))


def load(path, params, boot=None):
    _check_path(path)
    try:
        with open(path) as handle:
            data = json.load(handle)
    except (OSError, ValueError) as exc:
        raise ResumeError("the saved state of this wait (%s) cannot be read: %s" % (path, exc))
    if data.get("version") != STATE_VERSION or data.get("identity") != _identity(params):
        raise ResumeError("%s holds the state of another wait (or another modelwake version)" % path)
    current = boot if boot is not None else boot_id()
    if data["boot_id"] != current:
        # The monotonic clock starts again at a boot, and the server watched is gone with it.
        remove(path)
        raise ResumeError("failed: the host rebooted during the wait (boot id %s -> %s): the server "
                          "start it watched is gone" % (data["boot_id"], current), elapsed=data["elapsed"])
    return data


def remove(path):
    try:
        os.unlink(path)
    except OSError:
        pass


def wait_slice(params, options, clock=time.monotonic, sleep=time.sleep, proc_root="/proc",
               probe_factory=HostProbe, boot=None):
    """One slice of a wait; `options` is the module's `_resume`: {"slice": s, "state_path": p}.

    Returns wait_for_ready()'s result plus "_slice": {"done", "state_path", "log_line",
    "expected_bytes", "gpu_total_mib"}, the last three for the progress line. Raises
    ModelWakeError (InputError on the first slice); the wait's own state file is removed then.
    """
    path = options.get("state_path")
    saved = load(path, params, boot) if path else None
    try:
        config = build_config(params, proc_root, resuming=saved is not None)
        probe = probe_factory(config, proc_root=proc_root, state=saved and saved["probe"])
    except ModelWakeError:
        if path:
            remove(path)
        raise
    state = saved["wait"] if saved else new_wait_state(clock())
    last = {}
    result = wait_for_ready(config, probe, clock=clock, sleep=sleep,
                            on_snapshot=lambda snap, verdict: last.update(snap=snap),
                            state=state, slice_seconds=float(options.get("slice") or 0))
    if state["done"]:
        if path:
            remove(path)
        path = None
    else:
        path = save(path, {"version": STATE_VERSION, "identity": _identity(params),
                           "boot_id": boot if boot is not None else boot_id(),
                           "elapsed": result["elapsed"], "wait": state, "probe": probe.state_dict()})
    tail = state["classifier"]["tail"]
    totals = [g.get("memory_total_mib") for g in last["snap"].gpus]
    result["_slice"] = {
        "done": state["done"],
        "state_path": path,
        "log_line": tail[-1].strip()[:LOG_LINE_CHARS] if tail else None,
        "expected_bytes": config.expected_bytes,
        "gpu_total_mib": sum(totals) if totals and None not in totals else None,
    }
    return result
