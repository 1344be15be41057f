#!/usr/bin/python
# Copyright: (c) modelwake contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Send one completion to a ready model server and report its answer and latency."""
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: model_smoke
short_description: Send one completion to an OpenAI-compatible model server; report answer and latency
description:
  - POSTs C(/v1/completions) with I(prompt), I(max_tokens) and temperature 0 and fails unless
    the server answers 200 with C(choices). The latency is measured in milliseconds around the
    request alone (ansible.builtin.uri only reports whole seconds).
  - Uses the readiness module's HTTP code (C(plugins/module_utils/host/http_probe.py)); the API key
    goes in C(Authorization) and never into the result.
extends_documentation_fragment:
  - modelwake.serving.server
options:
  model:
    description: Model name to send (the served model name, or the model path).
    type: str
    required: true
  prompt:
    description: The prompt.
    type: str
    default: "2+2="
  max_tokens:
    description: Tokens to generate.
    type: int
    default: 4
  timeout:
    description: Seconds the completion may take.
    type: int
    default: 120
author: modelwake contributors (@modelwake)
notes:
  - Supports check mode (a completion changes nothing); it always reports C(changed=false).
"""

EXAMPLES = r"""
- name: Send the smoke completion
  modelwake.serving.model_smoke:
    url: http://127.0.0.1:30001
    model: /root/models/Kimi-K2.6
  register: model_service_smoke
"""

RETURN = r"""
text:
  description: The first choice's text.
  returned: success
  type: str
  sample: " 4"
latency_ms:
  description: Milliseconds from sending the request to the complete answer.
  returned: always
  type: int
  sample: 212
status:
  description: HTTP status, or null when no HTTP answer came.
  returned: always
  type: int
usage:
  description: The answer's token usage, when the server reports it.
  returned: success
  type: dict
"""

import json
import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.modelwake.serving.plugins.module_utils.common.formatting import http_result
from ansible_collections.modelwake.serving.plugins.module_utils.host.http_probe import request


ARGUMENT_SPEC = {
    "url": {"type": "str", "required": True},
    "model": {"type": "str", "required": True},
    "prompt": {"type": "str", "default": "2+2="},
    "max_tokens": {"type": "int", "default": 4, "no_log": False},
    "api_key": {"type": "str", "no_log": True},
    "timeout": {"type": "int", "default": 120},
}


def main():
    module = AnsibleModule(
        argument_spec=ARGUMENT_SPEC,
        supports_check_mode=True,
    )
    params = module.params
    if params["max_tokens"] < 1 or params["timeout"] < 1:
        module.fail_json(msg="max_tokens and timeout must be 1 or more", latency_ms=0, status=None)
    body = {"model": params["model"], "prompt": params["prompt"], "max_tokens": params["max_tokens"],
            "temperature": 0}
    start = time.monotonic()
    answer = request(params["url"].rstrip("/") + "/v1/completions", method="POST", body=body,
                     api_key=params["api_key"], timeout=params["timeout"])
    latency_ms = int(round((time.monotonic() - start) * 1000))
    try:
        data = json.loads(answer["body"] or "") if answer["kind"] == "status" else None
    except ValueError:
        data = None
    if answer["kind"] != "status" or answer["code"] != 200 or not isinstance(data, dict) or not data.get("choices"):
        module.fail_json(msg="smoke completion to %s failed: %s %s" % (
            params["url"], http_result(answer), (answer["body"] or "")[:300]),
            latency_ms=latency_ms, status=answer["code"])
    choice = data["choices"][0]
    module.exit_json(changed=False, text=choice.get("text", ""), latency_ms=latency_ms, status=answer["code"],
                     usage=data.get("usage") or {})


if __name__ == "__main__":
    main()
