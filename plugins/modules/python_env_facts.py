#!/usr/bin/python
# Copyright: (c) modelwake contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Report the state of a Python virtual environment: present, pip, ensurepip, installed packages."""
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: python_env_facts
short_description: Report what a Python virtual environment holds, without changing it
description:
  - Says whether the virtual environment exists, which Python it runs, whether pip is present
    (venvs made with C(--without-pip) or by uv have none), whether C(ensurepip) can bootstrap
    it (Debian without C(python3-venv) has no ensurepip) and the version of every installed
    distribution, read from package metadata so it also works without pip.
  - Runs the venv's interpreter with C(-I -B), so it writes nothing (no bytecode) into the venv.
extends_documentation_fragment:
  - modelwake.serving.venv
author: modelwake contributors (@modelwake)
notes:
  - Supports check mode; it never changes anything.
"""

EXAMPLES = r"""
- name: Inspect the inference venv
  modelwake.serving.python_env_facts:
    venv: /opt/modelwake/venv
  register: inference_env_facts
"""

RETURN = r"""
exists:
  description: The venv has an interpreter at C(bin/python).
  returned: always
  type: bool
python_version:
  description: Version of the venv's interpreter.
  returned: when exists
  type: str
  sample: 3.11.2
pip_version:
  description: Version of pip in the venv, or null when the venv has no working pip.
  returned: always
  type: str
ensurepip:
  description: The venv's interpreter has a usable C(ensurepip) module.
  returned: always
  type: bool
installed:
  description: Every installed distribution, canonical name to version.
  returned: always
  type: dict
  sample: {"compressed-tensors": "0.8.1", "torch": "2.13.0+cpu"}
"""

import os

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.modelwake.serving.plugins.module_utils.python_env.pyenv import PyEnvError, snapshot, venv_python


def inspect(run, venv):
    """Facts about `venv`; raises PyEnvError when the path is something other than a venv."""
    python = venv_python(venv)
    facts = {"exists": False, "python_version": None, "pip_version": None, "ensurepip": False, "installed": {}}
    if not os.path.lexists(python):
        if os.path.exists(venv) and (not os.path.isdir(venv) or os.listdir(venv)):
            raise PyEnvError(
                "inference_env_venv: %s exists but is not a virtual environment (no bin/python); "
                "move it away or choose another path" % venv
            )
        return facts
    rc, out, err = run([python, "-I", "-B", "-c", "import platform; print(platform.python_version())"])
    if rc != 0:
        # Never recreate it behind the operator's back: a broken venv may hold hand-made fixes.
        raise PyEnvError(
            "inference_env_venv: the interpreter of %s does not run (%s); remove the venv to let the role "
            "create it again" % (venv, (err or out).strip()[-500:])
        )
    facts["exists"] = True
    facts["python_version"] = out.strip()
    rc, out, err = run([python, "-I", "-B", "-c", "import pip; print(pip.__version__)"])
    facts["pip_version"] = out.strip() if rc == 0 and out.strip() else None
    rc, out, err = run([python, "-I", "-B", "-c", "import ensurepip; print(ensurepip.version())"])
    facts["ensurepip"] = rc == 0
    facts["installed"] = snapshot(run, venv)
    return facts


ARGUMENT_SPEC = {"venv": {"type": "path", "required": True}}


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)

    def run(argv):
        return module.run_command(argv)

    try:
        facts = inspect(run, module.params["venv"])
    except PyEnvError as exc:
        module.fail_json(msg=str(exc))
    module.exit_json(changed=False, **facts)


if __name__ == "__main__":
    main()
