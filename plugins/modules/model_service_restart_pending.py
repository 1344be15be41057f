#!/usr/bin/python
# Copyright: (c) modelwake contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Say whether a running model service is older than the files it runs from (a restart still pending)."""
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: model_service_restart_pending
short_description: Tell whether a running model service still waits for the restart of an interrupted run
description:
  - A run that changes the unit, its environment, the venv or the model notifies the restart
    handler. When the controller dies before the handlers run (Ctrl-C, a lost SSH connection),
    Ansible forgets that notification, and the next run finds nothing to change. This module
    answers from the host alone, with no state of its own, whether that restart is still owed.
  - The restart is pending when the unit's processes are up (C(active), C(activating),
    C(reloading)) and either systemd reports C(NeedDaemonReload=yes) (its unit file changed on
    disk since it was loaded), or any of I(paths) was modified after the running main process
    started (C(ExecMainStartTimestampMonotonic)).
  - The start time is read on systemd's monotonic clock and placed on today's wall clock, so a
    clock stepped after the start (NTP at boot) does not move it. A path modified in the future
    (a clock stepped back since it was written) is ignored and reported, never a reason for a
    restart, which it would otherwise ask for on every run.
  - "A unit that is down or not installed is never pending: a start reads the current files anyway."
  - Never changes anything.
options:
  unit:
    description: The unit, with its suffix, e.g. C(sglang-k26.service).
    type: str
    required: true
  paths:
    description:
      - Files and directories the service runs from. Shell patterns are expanded; paths that do
        not exist are skipped (an optional file, a venv not created yet).
    type: list
    elements: str
    required: true
author: modelwake contributors (@modelwake)
notes:
  - Supports check mode; it never changes anything.
"""

EXAMPLES = r"""
- name: Check whether sglang-k26 runs from older files than those on disk
  modelwake.serving.model_service_restart_pending:
    unit: sglang-k26.service
    paths:
      - /etc/systemd/system/sglang-k26.service
      - /etc/modelwake/sglang-k26.env
      - /opt/modelwake/venv/lib/python*/site-packages
  register: pending
"""

RETURN = r"""
pending:
  description: The running service is older than its unit or one of I(paths).
  returned: always
  type: bool
reason:
  description: Why it is pending or not, in words.
  returned: always
  type: str
  sample: sglang-k26.service started at 1717400000.0, before /etc/systemd/system/sglang-k26.service changed (1717400090.5)
started:
  description: Wall-clock time (seconds since the epoch) the running main process started; null when none runs.
  returned: always
  type: float
newer:
  description: The paths modified after the start, as C({path, mtime}), newest first.
  returned: always
  type: list
  elements: dict
future:
  description: The paths whose modification time lies in the future (ignored), as C({path, mtime}).
  returned: always
  type: list
  elements: dict
invocation_id:
  description: systemd's InvocationID of the running service (empty when it is down).
  returned: always
  type: str
"""

import glob
import os
import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.modelwake.serving.plugins.module_utils.host.systemd import is_running, parse_show

PROPERTIES = ("LoadState", "ActiveState", "SubState", "MainPID", "NeedDaemonReload", "InvocationID",
              "ExecMainStartTimestampMonotonic")

ARGUMENT_SPEC = {
    "unit": {"type": "str", "required": True},
    "paths": {"type": "list", "elements": "str", "required": True},
}


def restart_pending(unit, props, mtimes, now_realtime, now_monotonic):
    """Decide whether the running unit is older than what it runs from.

    props: `systemctl show` parsed by parse_show; mtimes: [(path, mtime)] of the paths that exist;
    now_realtime / now_monotonic: the host's two clocks read together (seconds). Returns a dict
    with pending, reason, started, newer, future (the module's return values).
    """
    result = {"pending": False, "started": None, "newer": [], "future": []}
    if props.get("LoadState") != "loaded" or not is_running(props):
        result["reason"] = "%s is %s (LoadState %s): a start, not a restart, brings it up" % (
            unit, props.get("ActiveState") or "unknown", props.get("LoadState") or "unknown")
        return result
    if props.get("NeedDaemonReload") == "yes":
        result["pending"] = True
        result["reason"] = "%s: its unit file changed on disk since systemd loaded it (NeedDaemonReload=yes)" % unit
        return result
    try:
        start_monotonic = int(props.get("ExecMainStartTimestampMonotonic") or 0) / 1e6
    except ValueError:
        start_monotonic = 0
    if not props.get("MainPID") or start_monotonic <= 0:
        # Between two automatic restarts (SubState auto-restart): the next start reads the current files.
        result["reason"] = "%s has no main process now (%s): its next start reads the current files" % (
            unit, props.get("SubState") or "unknown")
        return result
    started = now_realtime - (now_monotonic - start_monotonic)
    result["started"] = round(started, 6)
    for path, mtime in mtimes:
        entry = {"path": path, "mtime": mtime}
        if mtime > now_realtime:
            result["future"].append(entry)
        elif mtime > started:
            result["newer"].append(entry)
    result["newer"].sort(key=lambda entry: entry["mtime"], reverse=True)
    if result["newer"]:
        newest = result["newer"][0]
        result["pending"] = True
        result["reason"] = "%s started at %.1f, before %s changed (%.1f)" % (unit, started, newest["path"], newest["mtime"])
    else:
        result["reason"] = "%s started at %.1f, after every file it runs from changed" % (unit, started)
    return result


def path_mtimes(patterns):
    """[(path, mtime)] of every existing path the patterns name, each path once."""
    found = {}
    for pattern in patterns:
        for path in sorted(glob.glob(pattern)):
            try:
                found[path] = os.stat(path).st_mtime
            except OSError:
                continue  # removed between glob and stat: nothing runs from it any more
    return sorted(found.items())


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    unit = module.params["unit"]
    rc, out, err = module.run_command(["systemctl", "show", unit, "-p", ",".join(PROPERTIES)])
    if rc != 0:
        module.fail_json(msg="systemctl show %s failed (rc %d): %s" % (unit, rc, err.strip()[:300]))
    props = parse_show(out)
    mtimes = path_mtimes(module.params["paths"])
    # Both clocks read together: their difference places the monotonic start on the wall clock.
    now_realtime, now_monotonic = time.time(), time.monotonic()
    result = restart_pending(unit, props, mtimes, now_realtime, now_monotonic)
    for entry in result["future"]:
        module.warn("%s was modified in the future (%.1f, now %.1f): the clock was stepped back; it is not "
                    "taken as a reason to restart %s" % (entry["path"], entry["mtime"], now_realtime, unit))
    module.exit_json(changed=False, invocation_id=props.get("InvocationID") or "", **result)


if __name__ == "__main__":
    main()
