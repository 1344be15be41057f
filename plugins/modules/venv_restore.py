#!/usr/bin/python
# Copyright: (c) modelwake contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Put a venv back to a recorded package set: the undo of an upgrade that did not come up."""
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: venv_restore
short_description: Restore a venv to an exact recorded package set
description:
  - Compares the venv's installed distributions (read from their metadata, as C(python_env_facts)
    does) with I(packages), uninstalls what I(packages) lacks and reinstalls, with C(--no-deps), every
    distribution whose version differs or that is missing, then reads the venv again and fails unless
    it matches I(packages) exactly.
  - The undo of an upgrade that installed cleanly but whose service then did not start - the
    C(model_service) role's rollback, with the set C(inference_env) recorded before it changed the venv.
  - Packages come from the same places the upgrade used (I(find_links), I(index_url)).
requirements:
  - pip in the virtual environment I(venv) (C(python_env_facts) says whether it has it).
extends_documentation_fragment:
  - modelwake.serving.venv
  - modelwake.serving.pip_source
options:
  packages:
    description: The package set to restore, as {distribution name - version}.
    type: dict
    required: true
  keep:
    description:
      - Distributions left as they are, whatever I(packages) says (pip, which a venv without it was
        given during the same run).
    type: list
    elements: str
    default: [pip]
author: modelwake contributors (@modelwake)
notes:
  - Supports check mode (reports what it would change).
"""

EXAMPLES = r"""
- name: Put the engine's venv back to what it was before this run
  modelwake.serving.venv_restore:
    venv: /opt/modelwake/venv
    packages: "{{ inference_env_rollback.packages }}"
    find_links: "{{ inference_env_rollback.find_links }}"
    no_index: "{{ inference_env_rollback.no_index }}"
"""

RETURN = r"""
restored:
  description: The changes the restore made, for people (e.g. C(modelwake-sim 0.1.1 -> 0.1.0)); C(no change) when none.
  returned: always
  type: str
undone:
  description: What differed from I(packages) before the restore, as {added, removed, changed}.
  returned: always
  type: dict
remaining_diff:
  description: What still differs after the restore (empty when it is exact).
  returned: always
  type: dict
steps:
  description: The pip commands run, each with its rc and the end of its output.
  returned: always
  type: list
  elements: dict
"""

import os

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.modelwake.serving.plugins.module_utils.python_env.pyenv import (
    PyEnvError,
    describe_diff,
    PIP_ENVIRONMENT,
    pip_source_args,
    pip_source_options,
    restore_snapshot,
    snapshot_diff,
    venv_python,
)


ARGUMENT_SPEC = dict(pip_source_options(), **{
    "venv": {"type": "path", "required": True},
    "packages": {"type": "dict", "required": True},
    "keep": {"type": "list", "elements": "str", "default": ["pip"]},
})


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, required_if=[("no_index", True, ("find_links",))],
                           supports_check_mode=True)
    p = module.params

    def run(argv):
        return module.run_command(argv, environ_update=PIP_ENVIRONMENT)

    if not os.path.lexists(venv_python(p["venv"])):
        module.fail_json(msg="venv: %s has no bin/python: there is nothing to restore" % p["venv"])
    try:
        result = restore_snapshot(run, p["venv"], p["packages"], pip_source_args(p["find_links"], p["no_index"], p["index_url"]),
                                  keep=p["keep"], check_mode=module.check_mode)
    except PyEnvError as exc:
        module.fail_json(msg=str(exc))
    undone = result["undone"]
    out = dict(changed=any(undone.values()), undone=undone, remaining_diff=result["remaining_diff"],
               steps=result["steps"], restored=describe_diff(snapshot_diff(result["before"], result["wanted"])))
    if module.check_mode:
        module.exit_json(**out)
    if not result["identical"]:
        module.fail_json(msg="the venv %s could not be restored exactly; still different: %s (%s)" % (
            p["venv"], describe_diff(result["remaining_diff"]), "; ".join(
                "%s: rc %d %s" % (step["cmd"], step["rc"], step["output"][-300:]) for step in result["steps"]
                if step["rc"] != 0) or "pip reported no error"), **out)
    module.exit_json(**out)


if __name__ == "__main__":
    main()
