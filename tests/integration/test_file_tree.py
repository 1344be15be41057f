"""file_tree run by real Ansible (`ansible localhost -m ...`) on a real directory: the one call that installs
the launcher's package. Only what changed is written, stale files matching prune go, bad input
changes nothing."""
import base64
import grp
import json
import os
import pwd
import stat
import subprocess

from tests.helpers import ANSIBLE, ROOT
from tests.integration.test_module_ansible import ENV, ansible

OWNER = pwd.getpwuid(os.getuid()).pw_name
GROUP = grp.getgrgid(os.getgid()).gr_name


def tree(root, files, **options):
    args = dict({"path": root, "files": dict((path, base64.b64encode(content).decode()) for path, content in files.items()),
                 "owner": OWNER, "group": GROUP, "prune": ["pkg/*.py"]}, **options)
    return json.dumps(args)


def listing(root):
    """{relative path: (bytes, mode, mtime_ns)} of every file under root."""
    found = {}
    for directory, _dirs, names in os.walk(root):
        for name in names:
            path = os.path.join(directory, name)
            info = os.stat(path)
            with open(path, "rb") as handle:
                found[os.path.relpath(path, root)] = (handle.read(), stat.S_IMODE(info.st_mode), info.st_mtime_ns)
    return found


FILES = {"pkg/__init__.py": b"", "pkg/sub/deep.py": b"VALUE = '{{ not templated }}'\n", "entry": b"#!x\n"}


def test_installs_in_one_call_then_changes_nothing_and_check_mode_only_reports(tmp_path):
    root = str(tmp_path / "lib")
    rc, result = ansible(tree(root, FILES), module="file_tree", check=True)
    assert rc == 0 and result["changed"] and result["written"] == sorted(FILES), result
    assert not os.path.exists(root)

    rc, result = ansible(tree(root, FILES), module="file_tree")
    assert rc == 0 and result["changed"] and result["written"] == sorted(FILES), result
    installed = listing(root)
    assert dict((path, entry[0]) for path, entry in installed.items()) == FILES
    assert set(entry[1] for entry in installed.values()) == {0o644}
    assert stat.S_IMODE(os.stat(os.path.join(root, "pkg", "sub")).st_mode) == 0o755

    rc, result = ansible(tree(root, FILES), module="file_tree")
    assert rc == 0 and not result["changed"] and result["written"] == [] and result["removed"] == [], result
    assert listing(root) == installed  # not rewritten: the modification times a restart decision reads stay


def test_writes_only_what_changed_corrects_modes_and_prunes_only_matching_files(tmp_path):
    root = str(tmp_path / "lib")
    assert ansible(tree(root, FILES), module="file_tree")[0] == 0
    before = listing(root)
    os.chmod(os.path.join(root, "entry"), 0o755)
    for stale in ("pkg/old_flat.py", "pkg/sub/gone.py", "pkg/notes.txt"):
        with open(os.path.join(root, stale), "w") as handle:
            handle.write("stale\n")
    changed = dict(FILES, **{"pkg/sub/deep.py": b"VALUE = 2\n"})

    rc, result = ansible(tree(root, changed), module="file_tree", check=True)
    assert rc == 0 and result["written"] == ["pkg/sub/deep.py"] and result["fixed"] == ["entry"], result
    assert result["removed"] == ["pkg/old_flat.py", "pkg/sub/gone.py"]
    assert os.path.exists(os.path.join(root, "pkg", "old_flat.py"))

    rc, result = ansible(tree(root, changed), module="file_tree")
    assert rc == 0 and result["changed"], result
    assert (result["written"], result["fixed"], result["removed"]) == (
        ["pkg/sub/deep.py"], ["entry"], ["pkg/old_flat.py", "pkg/sub/gone.py"])
    after = listing(root)
    assert sorted(after) == sorted(list(FILES) + ["pkg/notes.txt"])  # prune matches pkg/*.py only
    assert after["pkg/sub/deep.py"][0] == b"VALUE = 2\n" and after["entry"][1] == 0o644
    assert after["pkg/__init__.py"] == before["pkg/__init__.py"]  # same content: untouched


def test_bad_input_names_the_field_and_changes_nothing(tmp_path):
    root = str(tmp_path / "lib")
    assert ansible(tree(root, FILES), module="file_tree")[0] == 0
    before = listing(root)
    rc, result = ansible(tree(root, dict(FILES, **{"../escape.py": b"x"})), module="file_tree")
    assert rc != 0 and "files: '../escape.py' is not a plain relative path" in result["msg"], result
    args = json.loads(tree(root, FILES))
    args["files"]["entry"] = "not base64!"
    rc, result = ansible(json.dumps(args), module="file_tree")
    assert rc != 0 and result["msg"] == "files: the content of entry is not base64: encode it with | b64encode", result
    rc, result = ansible(tree(root, FILES, mode="rw-r--r--"), module="file_tree")
    assert rc != 0 and "mode: 'rw-r--r--' is not an octal mode" in result["msg"], result
    assert listing(root) == before and not os.path.exists(os.path.join(str(tmp_path), "escape.py"))


def test_a_file_may_have_its_own_mode_and_group_and_the_root_gets_its_mode_back(tmp_path):
    """An environment file holding a secret (0600) beside files anyone may read, in the same call; the
    root directory's own mode, changed by hand, is put back (the configuration directory's task did)."""
    root = str(tmp_path / "etc")
    files = {"unit.env": {"content": base64.b64encode(b"KEY=1\n").decode(), "mode": "0600", "group": GROUP},
             "unit.model-state": base64.b64encode(b"a 1 2\n").decode()}
    args = json.dumps({"path": root, "files": files, "owner": OWNER, "group": GROUP})
    rc, result = ansible(args, module="file_tree")
    assert rc == 0 and result["written"] == ["unit.env", "unit.model-state"], result
    modes = dict((path, entry[1]) for path, entry in listing(root).items())
    assert modes == {"unit.env": 0o600, "unit.model-state": 0o644}

    os.chmod(root, 0o700)
    os.chmod(os.path.join(root, "unit.env"), 0o644)
    rc, result = ansible(args, module="file_tree")
    assert rc == 0 and result["changed"] and result["written"] == [] and result["fixed"] == ["unit.env"], result
    assert stat.S_IMODE(os.stat(root).st_mode) == 0o755 and listing(root)["unit.env"][1] == 0o600

    rc, result = ansible(args, module="file_tree")
    assert rc == 0 and not result["changed"], result
    bad = dict(files, **{"unit.env": {"content": files["unit.env"]["content"], "mode": 384}})
    rc, result = ansible(json.dumps({"path": root, "files": bad}), module="file_tree")
    assert rc != 0 and "files: the mode of unit.env: 384 must be an octal mode written as a string" in result["msg"], result
    rc, result = ansible(json.dumps({"path": root, "files": {"unit.env": {"mode": "0600"}}}), module="file_tree")
    assert rc != 0 and "files: unit.env takes content (base64)" in result["msg"], result


def test_diff_mode_shows_each_text_file_written_or_removed(tmp_path):
    """--diff shows what a template or copy would: the old and new text of each file written, the text
    of each file pruned; a file whose content stays is not shown."""
    root = str(tmp_path / "units")
    first = {"a.service": b"[Service]\nExecStart=/bin/old\n", "b.py": b"KEEP = 1\n"}
    assert ansible(tree(root, first), module="file_tree")[0] == 0
    second = {"a.service": b"[Service]\nExecStart=/bin/new\n", "b.py": b"KEEP = 1\n"}
    proc = subprocess.run([ANSIBLE, "localhost", "-c", "local", "-m", "file_tree", "--diff", "-a",
                           tree(root, second, prune=["*.service", "*.py", "*.txt"])], cwd=ROOT, env=ENV,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True, timeout=120)
    assert proc.returncode == 0, proc.stdout
    assert "-ExecStart=/bin/old" in proc.stdout and "+ExecStart=/bin/new" in proc.stdout, proc.stdout
    assert "KEEP = 1" not in proc.stdout, proc.stdout
    with open(os.path.join(root, "gone.txt"), "w") as handle:
        handle.write("stale line\n")
    proc = subprocess.run([ANSIBLE, "localhost", "-c", "local", "-m", "file_tree", "--diff", "-a",
                           tree(root, second, prune=["*.txt"])], cwd=ROOT, env=ENV,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True, timeout=120)
    assert proc.returncode == 0 and "-stale line" in proc.stdout, proc.stdout
    assert not os.path.exists(os.path.join(root, "gone.txt"))
