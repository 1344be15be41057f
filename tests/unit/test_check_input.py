"""modelwake.serving.check_input run by Ansible itself on this machine (connection local, one play): every
failing check is reported with its message, a check whose `when` does not hold is neither evaluated nor
templated, a conditional that breaks on a value of the wrong type still names its field, and a run where
all hold counts the checks it evaluated."""
import json
import os
import subprocess
import sys

from tests.helpers import ANSIBLE_PLAYBOOK, ROOT

PLAY = """
- name: The checks
  hosts: localhost
  connection: local
  gather_facts: false
  vars:
    port: 0
    tp: 3
    env: "not a mapping"
  tasks:
    - name: Some checks fail
      modelwake.serving.check_input:
        checks:
          - that: port | int >= 1
            msg: port must be 1-65535 (is {{ port }}).
          - that: [tp | int >= 1, tp | int % 2 == 0]
            msg: tp must be even (is {{ tp }}).
          - when: port | int > 0
            that: not_defined_anywhere
            msg: "{{ also_not_defined }}"
          - that: env.keys() | list | length == 0
            msg: env must be a mapping of names to values.
      register: failing
      ignore_errors: true

    - name: All checks hold
      modelwake.serving.check_input:
        checks:
          - that: tp | int == 3
            msg: unused
          - when: false
            that: never_evaluated
            msg: unused
      register: passing

    - name: Keep both for the test
      ansible.builtin.copy:
        content: "{{ {'failing': failing, 'passing': passing} | to_json }}"
        dest: "{{ results_file }}"
        mode: "0644"
"""


def test_every_failing_check_is_reported_and_the_others_are_left_alone(tmp_path):
    (tmp_path / "play.yml").write_text(PLAY)
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_PYTHON_INTERPRETER=sys.executable)
    results_file = tmp_path / "results.json"
    proc = subprocess.run([ANSIBLE_PLAYBOOK, "-i", "localhost,", str(tmp_path / "play.yml"),
                           "-e", json.dumps({"results_file": str(results_file)})], cwd=ROOT, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True, timeout=120)
    assert proc.returncode == 0, proc.stdout
    results = json.loads(results_file.read_text())

    failing = results["failing"]
    assert failing["failed"] and failing["checked"] == 3, failing
    messages = [failure["msg"] for failure in failing["failures"]]
    assert messages[0] == "port must be 1-65535 (is 0)."
    assert messages[1] == "tp must be even (is 3)." and failing["failures"][1]["assertion"] == "tp | int % 2 == 0"
    assert messages[2].startswith("env must be a mapping of names to values. ("), messages[2]
    assert len(messages) == 3 and failing["msg"] == "\n".join(messages)

    passing = results["passing"]
    assert not passing.get("failed") and not passing["changed"], passing
    assert passing["checked"] == 1 and passing["msg"] == "1 checks passed", passing
