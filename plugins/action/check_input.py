# Copyright: (c) modelwake contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action plugin for check_input: a role's input checks in one task, each failing one named.

Ansible forks a worker for every task, also for an `assert` that never leaves the controller: a
role that checked each group of fields in its own `assert` paid about 40 ms per check on every run,
more than a second of a re-run that changes nothing. Here the checks of one role are one task.

Each check is what an `assert` was: `that` (conditionals, all must hold), `msg` (what is wrong and how
to fix it, naming the field) and an optional `when`. All checks are evaluated, so a person who got
several fields wrong reads every message at once. A check's `msg` is templated only when the check
fails, and its `that` only when its `when` holds, as with a skipped `assert`: a message may read
facts that exist only where its check applies.
"""
from __future__ import annotations

import typing as t

from ansible.errors import AnsibleError
from ansible.module_utils.common.text.converters import to_text
from ansible.plugins.action import ActionBase

CHECK_KEYS = frozenset(("that", "msg", "when"))


def _conditionals(value):
    return value if isinstance(value, list) else [value]


class ActionModule(ActionBase):
    """Evaluate every check; fail with the message of each that does not hold."""

    _requires_connection = False
    _VALID_ARGS = frozenset(("checks",))

    @classmethod
    def finalize_task_arg(cls, name: str, value: t.Any, templar: t.Any, context: t.Any) -> t.Any:
        # The checks stay as written: their conditionals and messages are evaluated one by one in
        # run(), each only when it applies (the base would template every message up front).
        if name == "checks":
            return value
        return super().finalize_task_arg(name, value, templar, context)

    def _evaluate(self, conditionals):
        """The first conditional that does not hold, or None."""
        for conditional in _conditionals(conditionals):
            if not self._templar.evaluate_conditional(conditional=conditional):
                return conditional
        return None

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        del tmp  # tmp no longer has any effect

        checks = self._task.args.get("checks")
        if not isinstance(checks, list) or not checks:
            raise AnsibleError("check_input: checks must be a non-empty list of {that, msg[, when]}")
        failures = []
        evaluated = 0
        for index, check in enumerate(checks):
            if not isinstance(check, dict) or "that" not in check or "msg" not in check or set(check) - CHECK_KEYS:
                raise AnsibleError("check_input: checks[%d] must have that and msg, and may have when (has %s)"
                                   % (index, ", ".join(sorted(map(str, check))) if isinstance(check, dict) else check))
            if "when" in check and self._evaluate(check["when"]) is not None:
                continue
            evaluated += 1
            try:
                failed = self._evaluate(check["that"])
            except AnsibleError as error:
                # A value of the wrong type can break a conditional (a string where a list was meant):
                # the check's own message still names the field, the error says what broke.
                failed, why = True, " (%s)" % to_text(error.message).strip()
            else:
                why = ""
            if failed is not None:
                failures.append({"assertion": failed if isinstance(failed, str) else None,
                                 "msg": " ".join(to_text(self._templar.template(check["msg"])).split()) + why})

        result["changed"] = False
        result["checked"] = evaluated
        if failures:
            result["failed"] = True
            result["failures"] = failures
            result["msg"] = "\n".join(failure["msg"] for failure in failures)
        else:
            result["msg"] = "%d checks passed" % evaluated
        return result
