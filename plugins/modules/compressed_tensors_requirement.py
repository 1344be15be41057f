#!/usr/bin/python
# Copyright: (c) modelwake contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Derive the compressed-tensors release a model needs from its config.json."""
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: compressed_tensors_requirement
short_description: Derive the compressed-tensors version a model needs from its config.json
description:
  - Reads C(config.json) of a model (C(quantization_config) with C(quant_method) C(compressed-tensors),
    also under C(text_config) for multimodal models), collects the top-level C(format), every
    C(config_groups.<group>.format) and C(sparsity_config.format), and returns the lowest
    compressed-tensors release whose C(CompressionFormat) enum has all of them.
  - An explicit I(version) wins but is checked against those formats; a pin too old for the
    model fails here, before the role changes anything.
  - Never writes the model's files.
options:
  model_path:
    description: Directory of the model on the host. Empty means no model to read.
    type: path
    default: ""
  version:
    description: Explicit compressed-tensors version to install (the role's C(inference_env_compressed_tensors_version)).
    type: str
    default: ""
author: modelwake contributors (@modelwake)
notes:
  - Supports check mode; it never changes anything.
"""

EXAMPLES = r"""
- name: Derive the compressed-tensors requirement of K2.6
  modelwake.serving.compressed_tensors_requirement:
    model_path: /root/models/Kimi-K2.6
  register: ct_requirement
"""

RETURN = r"""
op:
  description: C(==) for a pin, C(>=) for a derived minimum, null when nothing is required.
  returned: always
  type: str
version:
  description: The version that goes with I(op).
  returned: always
  type: str
  sample: 0.10.0
minimum:
  description: The lowest release that supports every format the model uses.
  returned: always
  type: str
required_by:
  description: The format that sets the minimum (or the pin variable's name for a pin on a model without formats).
  returned: always
  type: str
  sample: nvfp4-pack-quantized
formats:
  description: Distinct compressed-tensors formats found in config.json.
  returned: always
  type: list
  elements: str
members:
  description: C(CompressionFormat) member names the installed release must have.
  returned: always
  type: list
  elements: str
sources:
  description: Where each format was found, as [{format, source}].
  returned: always
  type: list
  elements: dict
"""

import os

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.modelwake.serving.plugins.module_utils.python_env.pyenv import PyEnvError, plan_compressed_tensors, read_model_formats


ARGUMENT_SPEC = {
    "model_path": {"type": "path", "default": ""},
    "version": {"type": "str", "default": ""},
}


def main():
    module = AnsibleModule(
        argument_spec=ARGUMENT_SPEC,
        supports_check_mode=True,
    )
    model_path, pin = module.params["model_path"], module.params["version"].strip()
    sources = []
    try:
        if model_path:
            config = os.path.join(model_path, "config.json")
            if not os.path.isfile(config):
                raise PyEnvError(
                    "inference_env_model_path: %s has no config.json; point it at the model directory "
                    "or leave it empty" % model_path
                )
            sources = read_model_formats(config)
        plan = plan_compressed_tensors(sources, pin or None)
    except PyEnvError as exc:
        module.fail_json(msg=str(exc))
    module.exit_json(changed=False, sources=sources, **plan)


if __name__ == "__main__":
    main()
