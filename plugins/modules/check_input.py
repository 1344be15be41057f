#!/usr/bin/python
# Copyright: (c) modelwake contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Documentation of the check_input action (plugins/action/check_input.py), which runs on the controller."""
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: check_input
short_description: Check a role's input in one task, naming every field that is wrong
description:
  - Evaluates a list of checks, each what an C(ansible.builtin.assert) would be - conditionals that must
    all hold and a message naming the field and how to fix it - and fails with the message of every
    check that does not hold, one per line.
  - All checks of a role are one task, so a run that changes nothing pays for one task instead of one
    per check (Ansible forks a worker for every task, also one that stays on the controller).
  - A check's O(checks[].msg) is templated only when the check fails, and its O(checks[].that) only when
    its O(checks[].when) holds, as for a skipped C(assert) - a message may read what exists only where
    its check applies.
  - Runs on the controller only; nothing is sent to the host.
options:
  checks:
    description: The checks, evaluated in order; every one is evaluated, also after a failing one.
    type: list
    elements: dict
    required: true
    suboptions:
      that:
        description: Conditionals of the form C(when) takes (no C({{ }})); all must hold.
        type: list
        elements: str
        required: true
      msg:
        description: What is wrong and how to fix it, naming the variable. Templated when the check fails.
        type: str
        required: true
      when:
        description: Conditionals that must all hold for the check to apply; a check that does not apply passes.
        type: list
        elements: str
attributes:
  action:
    support: full
    description: Runs as an action plugin on the controller.
  check_mode:
    support: full
    description: Changes nothing in any mode.
  diff_mode:
    support: none
    description: Changes nothing.
author: modelwake contributors (@modelwake)
"""

EXAMPLES = r"""
- name: Check the input
  modelwake.serving.check_input:
    checks:
      - that:
          - model_service_port | int >= 1
          - model_service_port | int <= 65535
        msg: model_service_port must be 1-65535 (is {{ model_service_port }}).
      - when: model_service_nodes_group | length > 0
        that: model_service_nodes_group in groups
        msg: model_service_nodes_group '{{ model_service_nodes_group }}' must be an inventory group.
"""

RETURN = r"""
msg:
  description: How many checks passed, or the message of each failing check, one per line.
  returned: always
  type: str
  sample: "17 checks passed"
checked:
  description: How many checks applied (their O(checks[].when) held) and were evaluated.
  returned: always
  type: int
  sample: 17
failures:
  description: Each failing check, in order - its message and the first of its conditionals that did not hold.
  returned: failed
  type: list
  elements: dict
  contains:
    msg:
      description: The check's message, templated.
      type: str
    assertion:
      description: The conditional that did not hold (none when evaluating it raised an error, named in I(msg)).
      type: str
"""
