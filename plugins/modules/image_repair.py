#!/usr/bin/python
# Copyright: (c) modelwake contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Repair a package of a container image as a thin derived image (the image itself is never changed)."""
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: image_repair
short_description: Install a pinned package into a derived image of an engine's container image, verified
description:
  - Does nothing when an image derived from I(image) by this repair is on the host already (found by its
    labels), or when the image's own Python already satisfies I(version) and the verification import succeeds.
  - Otherwise starts a container of I(image) (the I(wheelhouse) mounted read-only), installs C(name) with the
    image's pip, the I(protect)ed packages held at their versions by a constraints file, imports
    I(verify_module) and checks the enum members, then commits the container as a new image labelled
    C(io.modelwake.repair.base) (the base image's ID) and C(io.modelwake.repair.spec) (the repair), keeping
    the base's C(Entrypoint) and C(Cmd).
  - A failed install or verification removes the container and any image committed, and fails with the cause.
  - The same words serve Podman and Docker (I(cli)).
  - A base image found to meet the repair is remembered in I(state_dir) by its ID, so a later run reads it
    without starting a container.
extends_documentation_fragment:
  - modelwake.serving.pinned_package
options:
  step:
    description:
      - C(derive) finds or makes the derived image. C(read) only finds it, or reads the base image (in a container
        it removes) and says whether a repair is due (I(action) C(install)), changing nothing; for the wheels'
        staging before the derive.
    type: str
    choices: [read, derive]
    default: derive
  cli:
    description: The container runtime's client, e.g. C(/usr/bin/podman) or C(/usr/bin/docker).
    type: path
    required: true
  image:
    description: The base image's ID (C(sha256:<hex>)).
    type: str
    required: true
  python:
    description: The image's Python (its engine's), a name on the image's C(PATH) or an absolute path in it.
    type: str
    default: python3
  wheelhouse:
    description: Host directory of wheels, mounted read-only; pip then installs from it alone, without network.
    type: path
    default: ""
  index_url:
    description: Index to use when there is no I(wheelhouse). Empty keeps the image's pip configuration.
    type: str
    default: ""
  run_args:
    description: Further options for the repair container's C(run) (e.g. C(--cgroups=disabled)).
    type: list
    elements: str
    default: []
  state_dir:
    description:
      - Directory of the records of what was read in base images, one file per image ID. Empty keeps no record
        (every run without a derived image reads the base image in a container).
    type: path
    default: ""
author: modelwake contributors (@modelwake)
notes:
  - Supports check mode (which starts a container of the base image to read it, and removes it; it uses a
    record of I(state_dir) but writes none).
"""

EXAMPLES = r"""
- name: Give the engine's image the compressed-tensors release the model needs
  modelwake.serving.image_repair:
    cli: /usr/bin/podman
    image: sha256:29a7c7b4edaaf8a873c4fa6376889f6a3d9e3cad6a94b893360f36ec24022565
    name: compressed-tensors
    version: 0.10.0
    match: minimum
    protect: [torch]
    wheelhouse: /var/cache/modelwake/inference_env/wheelhouse
    verify_module: compressed_tensors.config
    verify_attribute: CompressionFormat
    verify_values: [nvfp4-pack-quantized]
"""

RETURN = r"""
image:
  description: The ID the engine runs from, the derived image's, or the base's when it needs no repair (null in check mode when one would be derived).
  returned: always
  type: str
derived:
  description: Whether I(image) is a derived image.
  returned: always
  type: bool
base:
  description: The base image's ID.
  returned: always
  type: str
before:
  description: The version in the base image (absent when the derived image was found).
  returned: when read
  type: str
after:
  description: The version in the derived image.
  returned: when derived in this run
  type: str
action:
  description: C(install) when a derived image is (or would be) made, else C(none).
  returned: always
  type: str
diff:
  description: Distributions added, removed and changed by the install, as {added, removed, changed}.
  returned: always
  type: dict
"""

import subprocess

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.modelwake.serving.plugins.module_utils.python_env.image_repair import ImageRepair
from ansible_collections.modelwake.serving.plugins.module_utils.python_env.pyenv import PIP_ENVIRONMENT, PyEnvError


def main():
    module = AnsibleModule(
        argument_spec={
            "step": {"type": "str", "choices": ["read", "derive"], "default": "derive"},
            "cli": {"type": "path", "required": True},
            "image": {"type": "str", "required": True},
            "python": {"type": "str", "default": "python3"},
            "name": {"type": "str", "required": True},
            "version": {"type": "str", "required": True},
            "match": {"type": "str", "choices": ["exact", "minimum"], "default": "exact"},
            "protect": {"type": "list", "elements": "str", "default": []},
            "wheelhouse": {"type": "path", "default": ""},
            "index_url": {"type": "str", "default": ""},
            "run_args": {"type": "list", "elements": "str", "default": []},
            "verify_module": {"type": "str", "default": ""},
            "verify_attribute": {"type": "str", "default": ""},
            "verify_values": {"type": "list", "elements": "str", "default": []},
            "state_dir": {"type": "path", "default": ""},
        },
        supports_check_mode=True,
    )
    p = module.params

    def run(argv):
        # A pip that asks nothing and checks no index for its own version, inside the container too
        # (`exec` passes no environment: the options say it on pip's command line as well).
        return module.run_command(argv, environ_update=PIP_ENVIRONMENT)

    repair = ImageRepair(run, p["cli"], p["image"], p["name"], p["version"], p["match"], p["python"], p["protect"],
                         p["verify_module"], p["verify_attribute"], p["verify_values"], p["wheelhouse"],
                         p["index_url"], p["run_args"], work_dir=module.tmpdir, state_dir=p["state_dir"],
                         record_reads=not module.check_mode)
    try:
        result = repair.apply(check_mode=module.check_mode or p["step"] == "read")
    except (PyEnvError, subprocess.SubprocessError) as exc:
        module.fail_json(msg=str(exc), base=repair.base, image=None)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
