# Copyright: (c) modelwake contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The options naming the model server a module sends requests to, and its API key."""
from __future__ import annotations


class ModuleDocFragment(object):

    # wait_for_model_ready, model_smoke, completion_load (which narrows url to loopback in its own docs).
    DOCUMENTATION = r"""
options:
  url:
    description:
      - Base URL of the server, such as C(http://127.0.0.1:30001).
    type: str
    required: true
  api_key:
    description:
      - "API key of a server started with one, sent as C(Authorization: Bearer <key>). Never logged."
    type: str
"""
