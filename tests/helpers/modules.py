"""Running a module's main() in-process, as community.general's tests/unit/plugins/modules/utils.py
does: AnsibleModule's exit_json and fail_json raise instead of printing and exiting, so a test
reads the result as a dict.

    def test_x(monkeypatch):
        patch_exits(monkeypatch)
        result = call_main(module.main, {"url": ...}, AnsibleFailJson)
"""
import pytest
from ansible.module_utils import basic
from ansible.module_utils.testing import patch_module_args


class AnsibleExitJson(Exception):
    """exit_json() was called; args[0] is the result."""


class AnsibleFailJson(Exception):
    """fail_json() was called; args[0] is the result, with msg and failed=True."""


def exit_json(self, **kwargs):
    kwargs.setdefault("changed", False)
    raise AnsibleExitJson(kwargs)


def fail_json(self, msg, **kwargs):
    raise AnsibleFailJson(dict(kwargs, msg=msg, failed=True))


def patch_exits(monkeypatch):
    monkeypatch.setattr(basic.AnsibleModule, "exit_json", exit_json)
    monkeypatch.setattr(basic.AnsibleModule, "fail_json", fail_json)


def call_main(main, args, expect=(AnsibleExitJson, AnsibleFailJson)):
    """main() with args as the module's arguments (exits patched): the result it ended with."""
    with patch_module_args(args):
        with pytest.raises(expect) as info:
            main()
    return info.value.args[0]
