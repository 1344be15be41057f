# Copyright: (c) modelwake contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Many hosts' looks in one line, as the deploy's live output sums up a fleet."""
from __future__ import annotations

DOCUMENTATION = r"""
name: fleet_summary
author: modelwake contributors (@modelwake)
version_added: "1.1.0"
short_description: One line for many hosts' looks - how many are in each phase, and which failed and why
description:
  - Counts the looks by phase, in the order a start goes through them, and names up to three hosts of each bad
    verdict (failed, stalled, timeout) with the start of their message.
  - "For example C(12 loading, 40 initializing, 11 ready, 1 failed: gpu-17 (torch.OutOfMemoryError ...))."
  - The same line as the deploy's live output for a fleet (C(summary_line) in
    C(plugins/module_utils/readiness/fleet.py)); the status playbook ends its table with it.
  - Reads nothing but its arguments.
options:
  looks:
    description: The looks by host (or C(host/unit) where a host has several models), each a dict with C(phase) and C(msg).
    type: dict
    required: true
  not_looked:
    description: Hosts with no look yet, counted first.
    type: int
    default: 0
"""

EXAMPLES = r"""
- name: The fleet in one line
  ansible.builtin.debug:
    msg: "{{ lookup('modelwake.serving.fleet_summary', looks={'gpu-1': {'phase': 'ready'}, 'gpu-2': {'phase': 'loading'}}) }}"
"""

RETURN = r"""
_raw:
  description: One element, the line (C(no hosts) for no looks).
  type: list
  elements: str
"""

from ansible.plugins.lookup import LookupBase
from ansible_collections.modelwake.serving.plugins.module_utils.readiness.fleet import summary_line


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        self.set_options(var_options=variables, direct=kwargs)
        return [summary_line(self.get_option("looks") or {}, not_looked=self.get_option("not_looked"))]
