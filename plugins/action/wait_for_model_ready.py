# Copyright: (c) modelwake contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action plugin for wait_for_model_ready: live progress on the controller while it waits.

A module cannot print while it runs: Ansible shows its result when it ends, so a 20-minute start
would be 20 minutes of silence. This plugin, which Ansible picks for every task that uses the
module (same name), calls the module in slices of `modelwake_progress_interval` seconds (default
25): each call observes for one slice and keeps the wait's state in a 0600 file on the host
(plugins/module_utils/readiness/resume.py), and between calls one line per host is printed, without -v:

    wait_for_model_ready [k26-1]: loading 1m40s | read 1.2 GiB / 2.0 GiB (61 %) at 50.0 MiB/s |
    shards 39/64 | ETA 16s | GPU x8 240.0 GiB / 764.7 GiB | log: Loading safetensors checkpoint ...

The final result is the one a single long call returns (same keys, `elapsed` from the true start,
all phases). No slicing with task-level `async` (the module then runs in the background as
before) or with `modelwake_progress_interval: 0`; `timeout: 0` looks once and prints nothing.
"""
from __future__ import annotations

from ansible.errors import AnsibleError
from ansible.plugins.action import ActionBase
from ansible.utils.display import Display
from ansible.utils.vars import merge_hash
from ansible_collections.modelwake.serving.plugins.module_utils.common.formatting import MIB, duration, size

display = Display()

# Seconds each call observes. Below 30, so that with the call's own overhead (a look, starting
# the module again: about 1 s locally) a line comes at least every 30 s; as long as that allows,
# because each start of the module costs the host about 0.2 s of CPU (measured: 0.8 % of a core
# at 25 s, on top of the looks).
DEFAULT_PROGRESS_INTERVAL = 25
INTERVAL_VAR = "modelwake_progress_interval"


def progress_line(host, result, info):
    """One line about one host's wait, from a slice's result and its `_slice` info."""
    parts = ["%s %s" % (result.get("phase"), duration(result.get("elapsed") or 0))]
    read, expected = result.get("bytes_read"), info.get("expected_bytes")
    if read is not None:
        text = "read %s" % size(read)
        if expected:
            # Of the weights: readahead and imports can read more than the model; that is 100 %.
            text += " / %s (%d %%)" % (size(expected), min(100, int(100.0 * read / expected)))
        if result.get("read_rate") is not None:
            text += " at %s/s" % size(result["read_rate"])
        parts.append(text)
    if result.get("shards"):
        parts.append("shards %d/%d" % tuple(result["shards"]))
    if result.get("eta") is not None:
        parts.append("ETA %s" % duration(result["eta"]))
    gpus = result.get("gpu") or []
    used = [g.get("memory_used_mib") for g in gpus if g.get("memory_used_mib") is not None]
    if used:
        text = "GPU x%d %s" % (len(gpus), size(sum(used) * MIB))
        if info.get("gpu_total_mib"):
            text += " / %s" % size(info["gpu_total_mib"] * MIB)
        parts.append(text)
    if result.get("where"):
        parts.append(result["where"])  # the ranks' stacks, read during a silent phase
    if info.get("log_line"):
        parts.append("log: %s" % info["log_line"])
    return "wait_for_model_ready [%s]: %s" % (host, " | ".join(parts))


def progress_interval(value):
    """The slice length from the variable's value: a number of seconds, 0 for no progress lines."""
    if value is None:
        return DEFAULT_PROGRESS_INTERVAL
    try:
        interval = float(value)
    except (TypeError, ValueError):
        interval = -1
    if interval < 0:
        raise AnsibleError("%s must be a number of seconds (0 turns live progress off), got %r"
                           % (INTERVAL_VAR, value))
    return interval


def with_phase(reply):
    """The module's reply, with the phase and elapsed its RETURN docs promise on every failure.

    The module sets them itself; a failure before its code runs (AnsibleModule refusing an option's
    type, no Python on the host) has neither: it failed at once.
    """
    if reply.get("failed") and "phase" not in reply:
        reply = dict(reply, phase="failed", elapsed=0)
    return reply


class ActionModule(ActionBase):

    _supports_check_mode = True  # the module only observes: check mode runs it as usual
    _supports_async = True

    def run(self, tmp=None, task_vars=None):
        result = super(ActionModule, self).run(tmp, task_vars)
        del tmp  # no longer has any effect
        task_vars = task_vars or {}
        interval = progress_interval(self._templar.template(task_vars.get(INTERVAL_VAR)))
        wrap_async = self._task.async_val and not self._connection.has_native_async
        if self._task.async_val or not interval:
            # One call, as without this plugin: async_status polls a background wait.
            result = merge_hash(result, with_phase(self._execute_module(task_vars=task_vars, wrap_async=wrap_async)))
            if not wrap_async:
                self._remove_tmp_path(self._connection._shell.tmpdir)
            return result
        host = task_vars.get("inventory_hostname", "?")
        resume = {"slice": interval, "state_path": None}
        try:
            while True:
                reply = self._execute_module(module_args=dict(self._task.args, _resume=resume),
                                             task_vars=task_vars)
                # A result without it comes from a failure before or outside the wait (bad
                # input, a crash of the module): final as it is.
                info = reply.pop("_slice", None)
                if not info or info["done"]:
                    break
                resume = dict(resume, state_path=info["state_path"])
                if self._task.no_log:
                    # The log line and the numbers are part of the result no_log hides.
                    display.display("wait_for_model_ready [%s]: waiting, %s (details hidden: no_log)"
                                    % (host, duration(reply.get("elapsed") or 0)))
                else:
                    display.display(progress_line(host, reply, info))
        finally:
            self._remove_tmp_path(self._connection._shell.tmpdir)
        return merge_hash(result, with_phase(reply))
