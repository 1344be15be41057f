# Copyright: (c) modelwake contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The batches of a rollout over a group of hosts: a canary first, then waves, as a play's `serial` list."""
from __future__ import annotations

DOCUMENTATION = r"""
name: rollout_serial
author: modelwake contributors (@modelwake)
version_added: "1.1.0"
short_description: A play's serial list for a canary first, then waves of at most max_unavailable hosts
description:
  - The canary's hosts restart alone first; then the rest go in waves of at most O(max_unavailable) hosts, each
    wave only after the one before answered a completion (the play's C(any_errors_fatal) and
    C(max_fail_percentage) stop the rollout at the first failure, before another host restarts).
  - Ansible repeats a serial list's last element for the rest of the hosts, and reads a percentage of the
    play's hosts (at least one host).
  - Reads nothing but its arguments; a bad value is an error naming the variable and what it takes.
options:
  canary:
    description: Hosts restarted alone before any wave; 0 for none.
    type: raw
    required: true
  max_unavailable:
    description: The most hosts restarting at once after the canary, as a count (C(2)) or a share of the play's hosts (C(25%)).
    type: raw
    required: true
"""

EXAMPLES = r"""
- name: Restart the fleet, one host first, then a quarter at a time
  hosts: model_hosts
  serial: "{{ lookup('modelwake.serving.rollout_serial', canary=1, max_unavailable='25%') }}"  # [1, '25%']
  tasks: []
"""

RETURN = r"""
_raw:
  description: The serial list, C([canary, max_unavailable]), or C([max_unavailable]) without a canary.
  type: list
  elements: raw
"""

import re

from ansible.errors import AnsibleError
from ansible.plugins.lookup import LookupBase

PERCENT = re.compile(r"^\s*(\d+)\s*%\s*$")


def whole(value):
    """The value as a whole number, or None ("2" and 2 are, "2.5", True and "two" are not)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    text = str(value).strip()
    return int(text) if text.isdigit() else None


def rollout_serial(canary, max_unavailable):
    """[canary, wave] for a play's serial (wave: a count or "N%"); raises ValueError naming the variable."""
    hosts = whole(canary)
    if hosts is None or hosts < 0:
        raise ValueError("modelwake_canary must be a whole number of hosts, 0 or more (0: no canary), got %r" % (canary,))
    percent = PERCENT.match(str(max_unavailable))
    if percent:
        if not 1 <= int(percent.group(1)) <= 100:
            raise ValueError("modelwake_max_unavailable must be a percentage from 1%% to 100%%, got %r" % (max_unavailable,))
        wave = "%d%%" % int(percent.group(1))
    else:
        wave = whole(max_unavailable)
        if wave is None or wave < 1:
            raise ValueError("modelwake_max_unavailable must be a number of hosts, 1 or more, or a share of them "
                             "such as 25%%, got %r" % (max_unavailable,))
    return [hosts, wave] if hosts > 0 else [wave]


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        self.set_options(var_options=variables, direct=kwargs)
        try:
            # The list is the lookup's one result: wantlist would be needed otherwise.
            return [rollout_serial(self.get_option("canary"), self.get_option("max_unavailable"))]
        except ValueError as exc:
            raise AnsibleError("%s: nothing was restarted" % exc)
