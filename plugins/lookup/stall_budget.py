# Copyright: (c) modelwake contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The start budget of a notify unit, from the one formula the launcher uses too."""
from __future__ import annotations

DOCUMENTATION = r"""
name: stall_budget
author: modelwake contributors (@modelwake)
version_added: "1.1.0"
short_description: The start budget systemd gives a launcher unit, in whole seconds
description:
  - The stall bound, two looks and a margin, as the launcher computes its own C(EXTEND_TIMEOUT_USEC) renewal
    (C(stall_budget) in C(plugins/module_utils/readiness/config.py)). The model_service role's C(TimeoutStartSec=)
    and C(--extend-timeout) come from here, so the unit and the launcher never disagree.
  - Reads nothing but its arguments.
options:
  stall_timeout:
    description: The stall bound in seconds, or C(auto) (the default bound until the host's record says more).
    type: str
    required: true
  poll_interval:
    description: Seconds between two looks.
    type: float
    required: true
"""

EXAMPLES = r"""
- name: The unit's start budget
  ansible.builtin.debug:
    msg: "{{ lookup('modelwake.serving.stall_budget', stall_timeout=120, poll_interval=5) }}"  # 160
"""

RETURN = r"""
_raw:
  description: The budget in whole seconds (rounded up), one element.
  type: list
  elements: int
"""

import math

from ansible.errors import AnsibleError
from ansible.plugins.lookup import LookupBase
from ansible_collections.modelwake.serving.plugins.module_utils.readiness.config import stall_budget


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        self.set_options(var_options=variables, direct=kwargs)
        stall_timeout = str(self.get_option("stall_timeout"))
        try:
            budget = stall_budget(stall_timeout, self.get_option("poll_interval"))
        except ValueError:
            raise AnsibleError("stall_budget: stall_timeout must be seconds or auto, got %r" % stall_timeout)
        return [int(math.ceil(budget))]
