#!/usr/bin/python
# Copyright: (c) modelwake contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Install one requirement into a venv, verify it, and roll back exactly on failure."""
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: pip_transaction
short_description: Install a pinned package into a venv with verification and exact rollback
description:
  - Does nothing when the installed version already satisfies I(version) and the verification
    import succeeds (idempotent; check mode reports what would change).
  - Otherwise records every installed distribution, runs C(pip install) with the I(protect)ed
    packages pinned to their installed versions through a constraints file (so pip cannot replace
    torch, and still installs the requirement's other dependencies, unlike C(--no-deps)), then
    imports I(verify_module) and checks the enum members.
  - On failure of the install or the verification, removes what the attempt added, reinstalls what
    it replaced at the recorded versions, proves the venv matches the record and fails.
  - After a successful install, runs C(pip check) and returns its lines as warnings (never fatal, as
    an exact pin of the upgraded package by the engine is expected to conflict).
requirements:
  - pip in the virtual environment I(venv) (C(python_env_facts) says whether it has it).
extends_documentation_fragment:
  - modelwake.serving.venv
  - modelwake.serving.pip_source
  - modelwake.serving.pinned_package
options:
  requirements:
    description:
      - Requirements file on the host installed in the same C(pip install) as the requirement, e.g. the
        C(requirements.lock) of a wheelhouse that lists an exact, complete package set.
      - Empty installs the requirement alone.
    type: path
    default: ""
  no_deps:
    description:
      - Pass C(--no-deps) to install exactly what is named (the requirement and I(requirements)), resolving nothing.
      - For a complete lock whose packages declare dependencies deliberately left out (vLLM's CPU build
        declares torchvision, which breaks transformers against CPU torch).
    type: bool
    default: false
  pip_check:
    description: Run C(pip check) after a successful install and report its lines as warnings.
    type: bool
    default: true
author: modelwake contributors (@modelwake)
notes:
  - Supports check mode.
"""

EXAMPLES = r"""
- name: Upgrade compressed-tensors without letting pip replace torch
  modelwake.serving.pip_transaction:
    venv: /opt/modelwake/venv
    name: compressed-tensors
    version: 0.10.0
    match: minimum
    protect: [torch]
    verify_module: compressed_tensors.config
    verify_attribute: CompressionFormat
    verify_values: [nvfp4-pack-quantized]
"""

RETURN = r"""
before:
  description: Installed version before the task, null when absent.
  returned: always
  type: str
after:
  description: Installed version after the task.
  returned: success
  type: str
diff:
  description: Distributions added, removed and changed by the install, as {added, removed, changed}.
  returned: success
  type: dict
conflicts:
  description: Lines of C(pip check) after an install (also emitted as warnings).
  returned: success
  type: list
  elements: str
rolled_back:
  description: On failure, true when the venv was restored to exactly its previous packages.
  returned: failure
  type: bool
remaining_diff:
  description: On failure, what still differs from before the attempt (empty after a complete rollback).
  returned: failure
  type: dict
"""

import os

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.modelwake.serving.plugins.module_utils.python_env.pyenv import (
    InstallFailed,
    PyEnvError,
    install_transaction,
    pip_check_conflicts,
    PIP_ENVIRONMENT,
    pip_source_args,
    pip_source_options,
    protect_constraints,
    snapshot,
    venv_python,
)


ARGUMENT_SPEC = dict(pip_source_options(), **{
    "venv": {"type": "path", "required": True},
    "name": {"type": "str", "required": True},
    "version": {"type": "str", "required": True},
    "match": {"type": "str", "choices": ["exact", "minimum"], "default": "exact"},
    "protect": {"type": "list", "elements": "str", "default": []},
    "verify_module": {"type": "str", "default": ""},
    "verify_attribute": {"type": "str", "default": ""},
    "verify_values": {"type": "list", "elements": "str", "default": []},
    "requirements": {"type": "path", "default": ""},
    "no_deps": {"type": "bool", "default": False},
    "pip_check": {"type": "bool", "default": True},
})


def main():
    module = AnsibleModule(
        argument_spec=ARGUMENT_SPEC,
        required_if=[("no_index", True, ("find_links",))],
        supports_check_mode=True,
    )
    p = module.params

    def sources_ready():
        # Checked only when pip is about to run: the role stages wheels only when an install is due.
        for path in p["find_links"]:
            if not os.path.isdir(path):
                raise PyEnvError("find_links: %s is not a directory on the host" % path)
        if p["requirements"] and not os.path.isfile(p["requirements"]):
            raise PyEnvError("requirements: %s is not a file on the host" % p["requirements"])

    def run(argv):
        return module.run_command(argv, environ_update=PIP_ENVIRONMENT)

    op = "==" if p["match"] == "exact" else ">="
    source = pip_source_args(p["find_links"], p["no_index"], p["index_url"])
    install_args = (["--no-deps"] if p["no_deps"] else []) + (["--requirement", p["requirements"]] if p["requirements"] else [])
    constraints = None
    try:
        if p["protect"] and os.path.lexists(venv_python(p["venv"])) and not module.check_mode:
            lines = protect_constraints(snapshot(run, p["venv"]), p["protect"], p["name"])
            if lines:
                # A private temp file (removed with the module's tmpdir): constraints pin the
                # protected packages without asking pip to install them.
                constraints = os.path.join(module.tmpdir, "protect-constraints.txt")
                with open(constraints, "w") as handle:
                    handle.write("\n".join(lines) + "\n")
        result = install_transaction(
            run, p["venv"], p["name"], op, p["version"], source, constraints,
            p["verify_module"], p["verify_attribute"], p["verify_values"], module.check_mode, sources_ready,
            install_args,
        )
    except InstallFailed as exc:
        module.fail_json(msg=str(exc), **exc.result)
    except PyEnvError as exc:
        module.fail_json(msg=str(exc))
    result["conflicts"] = []
    if result["changed"] and not module.check_mode and p["pip_check"]:
        result["conflicts"] = pip_check_conflicts(run, p["venv"])
        for line in result["conflicts"]:
            module.warn("pip check after installing %s: %s" % (p["name"], line))
    module.exit_json(**result)


if __name__ == "__main__":
    main()
