"""The one way a file on the host is replaced (common/atomic.py), and that no other code renames files
into place on its own."""
import os
import re

import pytest

from ansible_collections.modelwake.serving.plugins.module_utils.common.atomic import replace_file

from tests.helpers import ROOT


def test_a_replaced_file_is_whole_with_its_mode_and_no_temporary_file_is_left(tmp_path):
    target = tmp_path / "record.json"
    target.write_text("old")
    replace_file(str(target), "new ✓")
    assert target.read_text(encoding="utf-8") == "new ✓"
    assert oct(os.stat(str(target)).st_mode & 0o777) == "0o644"
    replace_file(str(target), b"\x00bytes", mode=None)  # mkstemp's 0600
    assert target.read_bytes() == b"\x00bytes" and oct(os.stat(str(target)).st_mode & 0o777) == "0o600"
    assert sorted(os.listdir(str(tmp_path))) == ["record.json"]


def test_a_failed_write_leaves_the_file_as_it_was_and_no_temporary_file(tmp_path):
    target = tmp_path / "record.json"
    target.write_text("old")

    def refuse(_temporary):
        raise OSError(1, "Operation not permitted")
    with pytest.raises(OSError):
        replace_file(str(target), "new", prepare=refuse)
    assert target.read_text() == "old" and sorted(os.listdir(str(tmp_path))) == ["record.json"]
    with pytest.raises(OSError):
        replace_file(str(tmp_path / "missing-dir" / "x"), "new")


def test_no_other_code_on_the_hosts_renames_a_file_into_place():
    renames = re.compile(r"\bos\.(rename|replace)\(")
    found = []
    for directory, _dirs, files in os.walk(os.path.join(ROOT, "plugins")):
        for name in files:
            path = os.path.join(directory, name)
            if name.endswith(".py") and not path.endswith(os.path.join("common", "atomic.py")):
                with open(path) as handle:
                    found += ["%s:%d" % (os.path.relpath(path, ROOT), number)
                              for number, line in enumerate(handle, 1) if renames.search(line)]
    assert not found, "replace files with common/atomic.py's replace_file: %s" % found
