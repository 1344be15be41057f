# Copyright: (c) modelwake contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A unit's last failed start, from the launcher's record, as the deploy quotes it."""
from __future__ import annotations

DOCUMENTATION = r"""
name: failed_start
author: modelwake contributors (@modelwake)
version_added: "1.1.0"
short_description: The failed start a down launcher unit last ended with, read from its record
description:
  - Reads the launcher's record of failed starts (C(/var/lib/modelwake/<unit>/failed-starts.json), written by
    C(plugins/module_utils/launcher/crash_loop.py)), given as its text, with the one reader of that record
    (C(last_failure) in C(plugins/module_utils/host/failed_starts.py)).
  - The model_service role refuses to start again, with nothing changed, a unit whose last start failed, and quotes this.
  - Reads nothing but its arguments.
options:
  record:
    description: The record's JSON text, as slurped from the host; empty when there is none.
    type: str
    required: true
"""

EXAMPLES = r"""
- name: The unit's last failed start
  ansible.builtin.debug:
    msg: "{{ lookup('modelwake.serving.failed_start', record=slurped.content | b64decode) }}"
"""

RETURN = r"""
_raw:
  description:
    - One element, C({consecutive, cause}) (the failed starts in a row, and the stopped crash loop's message or
      C(Its last start failed) with the cause), or null when the last start did not fail, there is no record,
      or the text is not one.
  type: list
  elements: dict
"""

from ansible.plugins.lookup import LookupBase
from ansible_collections.modelwake.serving.plugins.module_utils.host.failed_starts import last_failure


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        self.set_options(var_options=variables, direct=kwargs)
        return [last_failure(self.get_option("record") or "")]
