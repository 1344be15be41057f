"""Each thing the roles and playbooks do is written once: the readiness wait, the reset of a failed
unit, the restart-pending check, the GPU read; and tools/yaml_repeats.py finds no block written twice
(and does find one in a small fixture)."""
import glob
import os
import subprocess
import sys
import textwrap

import yaml

from tests.helpers import ROOT
from tools import yaml_repeats

THE_WAIT = "roles/model_service/tasks/wait.yml"


def project_yaml_files():
    """Every YAML file of the roles, the playbooks, the deploy playbook and the molecule scenarios."""
    found = [os.path.join(ROOT, "deploy-k26.yml")]
    for top in ("roles", "playbooks", "molecule"):
        found += glob.glob(os.path.join(ROOT, top, "**", "*.yml"), recursive=True)
        found += glob.glob(os.path.join(ROOT, top, "**", "*.yaml"), recursive=True)
    return sorted(found)


def module_calls(node, module):
    """How many tasks in a parsed YAML tree call `module` (by its short name or any FQCN), as a task
    key or through action/local_action (module_defaults declare arguments, they call nothing)."""
    count = 0
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "module_defaults":
                continue
            if str(key).split(".")[-1] == module:
                count += 1
            elif key in ("action", "local_action") and str(value).split()[0].split(".")[-1] == module:
                count += 1
            count += module_calls(value, module)
    elif isinstance(node, list):
        count += sum(module_calls(item, module) for item in node)
    return count


def callers(module):
    """{path relative to ROOT: number of calls} of a module across the project's YAML."""
    found = {}
    for path in project_yaml_files():
        with open(path) as handle:
            calls = sum(module_calls(document, module) for document in yaml.safe_load_all(handle))
        if calls:
            found[os.path.relpath(path, ROOT)] = calls
    return found


def load(relative):
    with open(os.path.join(ROOT, relative)) as handle:
        return yaml.safe_load(handle)


def test_the_readiness_wait_is_called_in_one_place_only():
    assert callers("wait_for_model_ready") == {THE_WAIT: 1}


def test_the_module_call_finder_sees_every_way_of_calling_a_module():
    tree = yaml.safe_load(textwrap.dedent("""
        - name: a
          modelwake.serving.wait_for_model_ready: {url: x}
        - name: b
          block:
            - name: c
              wait_for_model_ready: {url: x}
        - name: d
          local_action: wait_for_model_ready url=x
    """))
    assert module_calls(tree, "wait_for_model_ready") == 3


def test_start_handler_rollback_and_status_use_the_one_wait():
    start = load("roles/model_service/tasks/start.yml")
    assert [t["ansible.builtin.import_tasks"] for t in start if "ansible.builtin.import_tasks" in t].count("wait.yml") == 1
    handlers = load("roles/model_service/handlers/main.yml")
    assert [t.get("ansible.builtin.include_tasks") for t in handlers].count("wait.yml") == 1
    rollback = load("roles/model_service/tasks/rollback.yml")
    assert [t.get("ansible.builtin.include_tasks") for t in rollback].count("wait.yml") == 1
    look = load("playbooks/tasks/look-model.yml")
    roles = [t["ansible.builtin.include_role"] for t in look if "ansible.builtin.include_role" in t]
    assert [(role["name"], role["tasks_from"]) for role in roles] == [("model_service", "wait.yml")]
    status = load("playbooks/status.yml")
    assert [t.get("ansible.builtin.include_tasks") for t in status[0]["tasks"]].count("tasks/look-model.yml") == 1


def test_the_wait_url_and_peers_are_derived_once_in_the_roles_vars():
    internals = load("roles/model_service/vars/main.yml")
    for name in ("_model_service_url_host", "_model_service_url", "_model_service_wait_url", "_model_service_peers"):
        assert name in internals
    # Nothing else computes a URL's host from a bind address: that is _model_service_url_host's job.
    for path in project_yaml_files():
        with open(path) as handle:
            text = handle.read()
        if os.path.relpath(path, ROOT) != "roles/model_service/vars/main.yml":
            assert "[::1]" not in text, path


def test_a_failed_unit_is_reset_in_one_place_with_one_policy():
    found = {}
    for path in project_yaml_files():
        with open(path) as handle:
            if "systemctl reset-failed" in handle.read():
                found[os.path.relpath(path, ROOT)] = True
    assert list(found) == ["roles/model_service/tasks/reset_failed.yml"]


def test_the_restart_pending_check_and_the_gpu_read_are_written_once():
    assert callers("model_service_restart_pending") == {"roles/model_service/tasks/restart_pending.yml": 1}
    assert callers("gpu_holders") == {"roles/gpu_preflight/tasks/gpus.yml": 2, "playbooks/stop.yml": 1}
    gpus = load("roles/gpu_preflight/tasks/gpus.yml")
    # Both of the role's reads take every argument from the block's module_defaults.
    defaults = gpus[0]["module_defaults"]["modelwake.serving.gpu_holders"]
    assert {"gpus", "service_unit", "stop_units", "model_bytes"} <= set(defaults)
    reads = [t for t in gpus[0]["block"] if "modelwake.serving.gpu_holders" in t]
    reads += [t for block in gpus[0]["block"] if "block" in block for t in block["block"]
              if "modelwake.serving.gpu_holders" in t]
    assert [t["modelwake.serving.gpu_holders"] for t in reads] == [{}, {}]


def test_the_pip_dry_runs_are_one_loop_over_the_packages_the_installs_describe():
    assert callers("pip_transaction") == {
        "roles/inference_env/tasks/stage.yml": 1,
        "roles/inference_env/tasks/engine.yml": 2,
        "roles/inference_env/tasks/compressed_tensors.yml": 1,
    }
    dry_run = [t for t in load("roles/inference_env/tasks/stage.yml") if "modelwake.serving.pip_transaction" in t][0]
    assert dry_run["check_mode"] is True and dry_run["loop"] == "{{ _inference_env_specs }}"


def test_the_project_has_no_block_written_twice():
    problems = yaml_repeats.findings(yaml_repeats.read_task_lists(ROOT))
    assert problems == []


FIXTURE_PLAYBOOK = """
- name: A play
  hosts: all
  tasks:
    - name: Write the file
      ansible.builtin.copy:
        content: hello
        dest: /tmp/x
        owner: root
        mode: "0644"
    - name: Write the same file again
      ansible.builtin.copy:
        content: hello
        dest: /tmp/x
        owner: root
        mode: "0644"
"""
FIXTURE_NEAR_COPY = """
- name: Wait one way
  modelwake.serving.wait_for_model_ready:
    url: http://a
    engine: sglang
    unit: u.service
    model: m
    model_path: /m
    timeout: 10
- name: Wait almost the same way
  block:
    - name: Inner wait
      modelwake.serving.wait_for_model_ready:
        url: http://a
        engine: sglang
        unit: u.service
        model: m
        model_path: /m
        timeout: 0
"""
FIXTURE_RUN = """
- name: First
  ansible.builtin.command: "true"
- name: Second
  ansible.builtin.command: "false"
- name: Third
  ansible.builtin.command: "uptime"
- name: Between
  ansible.builtin.debug: {msg: x}
- name: First again
  ansible.builtin.command: "true"
- name: Second again
  ansible.builtin.command: "false"
- name: Third again
  ansible.builtin.command: "uptime"
"""


def write_fixture(tmp_path, files):
    for relative, text in files.items():
        path = tmp_path / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return str(tmp_path)


def test_the_checker_finds_a_task_written_twice_in_a_playbook(tmp_path):
    root = write_fixture(tmp_path, {"playbooks/site.yml": FIXTURE_PLAYBOOK})
    problems = yaml_repeats.findings(yaml_repeats.read_task_lists(root))
    assert problems == ["task written twice: playbooks/site.yml (Write the file) and "
                        "playbooks/site.yml (Write the same file again)"]


def test_the_checker_finds_a_near_copy_of_a_module_call_inside_a_block(tmp_path):
    root = write_fixture(tmp_path, {"roles/r/tasks/main.yml": FIXTURE_NEAR_COPY})
    problems = yaml_repeats.findings(yaml_repeats.read_task_lists(root))
    assert problems == ["modelwake.serving.wait_for_model_ready called twice with the same engine, model, "
                        "model_path, unit, url: roles/r/tasks/main.yml (Wait one way) and "
                        "roles/r/tasks/main.yml (Inner wait)"]


def test_the_checker_finds_a_run_of_small_tasks_written_twice_across_files(tmp_path):
    half = FIXTURE_RUN.split("- name: Between")[0]
    root = write_fixture(tmp_path, {"roles/r/tasks/main.yml": FIXTURE_RUN, "roles/r/handlers/main.yml": half})
    problems = yaml_repeats.findings(yaml_repeats.read_task_lists(root))
    # Task files are read before handlers: the first place named is the tasks file's first run.
    assert sorted(problems) == [
        "3 tasks in a row written twice: roles/r/tasks/main.yml (First) and roles/r/handlers/main.yml (First)",
        "3 tasks in a row written twice: roles/r/tasks/main.yml (First) and roles/r/tasks/main.yml (First again)",
    ]


def test_the_checker_leaves_an_include_used_twice_alone(tmp_path):
    twice = """
    - name: Use the wait
      ansible.builtin.include_role:
        name: model_service
        tasks_from: wait.yml
      tags: [always]
    - name: Use the wait again
      ansible.builtin.include_role:
        name: model_service
        tasks_from: wait.yml
      tags: [always]
    """
    root = write_fixture(tmp_path, {"playbooks/tasks/a.yml": twice})
    assert yaml_repeats.findings(yaml_repeats.read_task_lists(root)) == []


def test_the_checker_exits_non_zero_and_prints_each_finding(tmp_path):
    root = write_fixture(tmp_path, {"playbooks/site.yml": FIXTURE_PLAYBOOK})
    run = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "yaml_repeats.py"), root],
                         capture_output=True, text=True)
    assert run.returncode == 1 and run.stdout.startswith("task written twice: playbooks/site.yml"), run
    clean = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "yaml_repeats.py"), ROOT],
                           capture_output=True, text=True)
    assert clean.returncode == 0 and clean.stdout == "", clean
