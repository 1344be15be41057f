"""python -m modelwake_runner runs the Ansible beside its own interpreter whatever PATH holds, and says
why when a playbook cannot start at all. Each case runs the real ansible-runner and ansible-playbook
with a PATH that lacks the toolchain's venv, as a new shell has it."""
import json
import os
import re
import sys

import pytest

from modelwake_runner import cli

# A new shell's PATH: the system's directories, not the venv's.
BARE_PATH = "/usr/local/bin:/usr/bin:/bin"
TOOLCHAIN_BIN = os.path.dirname(sys.executable)


@pytest.fixture
def bare_path(monkeypatch):
    assert not os.path.exists("/usr/bin/ansible-playbook") or os.path.realpath("/usr/bin/ansible-playbook") != \
        os.path.realpath(os.path.join(TOOLCHAIN_BIN, "ansible-playbook")), "the system's ansible-playbook is the venv's"
    monkeypatch.setenv("PATH", BARE_PATH)


def write_playbook(tmp_path, text):
    path = tmp_path / "site.yml"
    path.write_text(text)
    return str(path)


def test_the_path_puts_the_interpreters_directory_first_once():
    path = cli.path_with_interpreter_dir(os.pathsep.join(["/usr/bin", TOOLCHAIN_BIN, "/bin"]))
    assert path.split(os.pathsep) == [TOOLCHAIN_BIN, "/usr/bin", "/bin"]


def test_a_playbook_runs_with_the_ansible_beside_the_interpreter_when_path_lacks_it(tmp_path, bare_path):
    playbook = write_playbook(tmp_path, (
        "- hosts: localhost\n  gather_facts: false\n  tasks:\n"
        "    - name: Say which ansible-playbook runs this\n"
        "      ansible.builtin.debug:\n        msg: \"{{ ansible_playbook_python }}\"\n"))
    seen = []
    runner, events = cli.run_playbook(playbook, str(tmp_path / "private"), on_object=seen.append)
    assert runner.rc == 0 and events.started
    assert events.why_not_started(runner.rc) is None
    assert [obj["status"] for obj in seen if obj["event"] == "task_end"] == ["ok"]
    # The play's interpreter is the one the ansible-playbook beside this Python names: that one ran.
    with open(os.path.join(TOOLCHAIN_BIN, "ansible-playbook")) as handle:
        shebang = handle.readline()[2:].strip()
    with open(os.path.join(runner.config.artifact_dir, "stdout")) as handle:
        said = re.search(r"msg: (\S+)", handle.read()).group(1)
    assert said == shebang


def test_no_ansible_playbook_anywhere_is_said_in_the_end_object_and_on_stderr(tmp_path, bare_path, monkeypatch,
                                                                               capsys):
    # An interpreter whose directory holds no Ansible, and a PATH without one either.
    lonely_bin = tmp_path / "bin"
    lonely_bin.mkdir()
    monkeypatch.setattr(sys, "executable", str(lonely_bin / "python3"))
    status = cli.run("status", inventories=[str(tmp_path / "hosts.yml")], out=sys.stdout)
    captured = capsys.readouterr()
    end = [json.loads(line) for line in captured.out.splitlines()][-1]
    assert status == 1
    assert end["event"] == "end" and end["ok"] is False and end["rc"] == 127 and end["verdicts"] == []
    assert end["error"].startswith("ansible-playbook did not start (The command was not found or was not executable")
    assert str(lonely_bin) in end["error"] and ".venv/bin/python -m modelwake_runner" in end["error"]
    assert captured.err.strip() == "python -m modelwake_runner status: " + end["error"]


def test_a_playbook_ansible_refuses_says_ansibles_own_words(tmp_path, bare_path):
    playbook = write_playbook(tmp_path, "- hosts: localhost\n  tasks:\n    - name: x\n      ansible.builtin.debug: {msg: hi\n")
    runner, events = cli.run_playbook(playbook, str(tmp_path / "private"))
    assert runner.rc not in (0, 127) and not events.started
    why = events.why_not_started(runner.rc)
    assert why.startswith("the playbook did not start (exit status %d): " % runner.rc)
    assert "YAML" in why and "site.yml" in why
