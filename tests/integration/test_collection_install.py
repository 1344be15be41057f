"""The collection as another team gets it: built, installed into a project of its own, used by FQCN.

`ansible-galaxy collection build` packs this checkout, `ansible-galaxy collection install` puts the
tarball into a fresh project's collections path, and a playbook there, whose ansible.cfg knows
nothing of this repository (no library, module_utils, action or roles path), runs every module of
the collection by its FQCN against localhost: wait_for_model_ready (through its action plugin,
which prints live progress) on the real simulated engine as a plain process, then model_smoke,
completion_load, model_dir_facts, gpu_holders (scripted nvidia-smi), python_env_facts,
compressed_tensors_requirement, pip_transaction (check mode) and model_service_restart_pending.
Each run is a real AnsiballZ payload built from the installed copy, so a module_utils file the
module finder misses fails here; the launcher_sources lookup answers from the installed copy too.
Then the roles: a playbook of that project deploys the simulated engine onto a systemd test host
with modelwake.serving.gpu_preflight, .inference_env and .model_service by FQCN (the unit, the
launcher, the wait, the smoke completion). (That a second run changes nothing is the reboot tests'
re-runs, test_deploy_lifecycle.py and test_vllm_deploy.py: the same roles.)
"""
import glob
import json
import os
import re
import subprocess
import textwrap
import threading

import pytest

from tests.helpers import FAKES, ROOT, SIM_WHEELS, VENV_BIN as BIN
from tests.helpers.guesthost import GuestHost
from tests.helpers.simharness import SimRunner, make_model

FAST = ["--start-seconds", "1", "--load-rate-mib", "16", "--init-seconds", "1", "--warmup-seconds", "0.5",
        "--token-seconds", "0.01", "--served-model-name", "k26-sim"]

pytestmark = pytest.mark.slow

# The model the deploy serves is made on the guest by the repository's demo-model.yml (test set-up,
# as the demo does), through the vllm-cpu inventory's sim-sglang catalog entry.
VM = GuestHost("mwc", os.path.join(ROOT, "inventories", "vllm-cpu"), "vllm-cpu")
SIM_ENTRY = {"modelwake_deploy_model": "sim-sglang", "modelwake_demo_model_size_mib": 32,
             "modelwake_demo_model_shards": 4}
GUEST_MODEL = "/srv/models/sim-sglang"
GUEST_UNIT = "sglang-fqcn"

PLAYBOOK = """
- name: Use modelwake.serving by FQCN alone
  hosts: localhost
  gather_facts: false
  vars:
    modelwake_progress_interval: 2
  tasks:
    - name: Wait until the simulated engine answers a completion
      modelwake.serving.wait_for_model_ready:
        url: "{{ sim_url }}"
        pid: "{{ sim_pid | int }}"
        engine: sglang
        model_path: "{{ model_path }}"
        log_path: "{{ log_path }}"
        poll_interval: 0.5
        timeout: 120
        stall_timeout: 60
      register: ready

    - name: Send one completion
      modelwake.serving.model_smoke:
        url: "{{ sim_url }}"
        model: k26-sim
      register: smoke

    - name: Measure throughput at two levels
      modelwake.serving.completion_load:
        url: "{{ sim_url }}"
        model: k26-sim
        levels: [1, 2]
        requests_per_level: 4
        max_tokens: 4
      register: load

    - name: Inspect the model directory
      modelwake.serving.model_dir_facts:
        path: "{{ model_path }}"
        read_sample_mib: 1
      register: model_dir

    - name: Survey the (scripted) GPUs
      modelwake.serving.gpu_holders:
        gpus: [0, 1]
      environment:
        PATH: "{{ fakes }}:{{ ansible_env_path }}"
        MODELWAKE_FAKE_GPU_DIR: "{{ gpu_dir }}"
      register: gpus

    - name: Read the toolchain's venv
      modelwake.serving.python_env_facts:
        venv: "{{ venv }}"
      register: pyenv

    - name: Derive the compressed-tensors release the model needs
      modelwake.serving.compressed_tensors_requirement:
        model_path: "{{ model_path }}"
      register: ct

    - name: Plan an install that is already satisfied
      modelwake.serving.pip_transaction:
        venv: "{{ venv }}"
        name: pip
        version: "1.0"
        match: minimum
      check_mode: true
      register: pip

    - name: Ask systemd about a unit that does not exist
      modelwake.serving.model_service_restart_pending:
        unit: modelwake-collection-test-none.service
        paths: []
      register: pending
      # This machine may run no systemd at all: then the module's own message says so.
      failed_when: pending.failed and not (pending.msg is search('systemctl show'))

    - name: List what the launcher would install
      ansible.builtin.set_fact:
        launcher_files: "{{ lookup('modelwake.serving.launcher_sources', wantlist=True) | map(attribute='path') | list }}"

    - name: Keep the results for the test
      ansible.builtin.copy:
        content: "{{ {'ready': ready, 'smoke': smoke, 'load': load, 'model_dir': model_dir, 'gpus': gpus,
                      'pyenv': pyenv, 'ct': ct, 'pip': pip, 'pending': pending,
                      'launcher_files': launcher_files} | to_json }}"
        dest: "{{ results }}"
        mode: "0600"
"""


DEPLOY = """
- name: Deploy the simulated engine with the collection's roles by FQCN alone
  hosts: model_hosts
  gather_facts: false
  vars:
    model: %(model)s
  roles:
    - role: modelwake.serving.gpu_preflight
      vars:
        gpu_preflight_required: false
        gpu_preflight_service_unit: %(unit)s
        gpu_preflight_model_path: "{{ model }}"
    - role: modelwake.serving.inference_env
      vars:
        # The simulator, a stand-in for a real engine: the roles' generic options run it.
        inference_env_engine: sglang
        inference_env_engine_package: modelwake-sim
        inference_env_engine_module: modelwake_sim
        inference_env_engine_version: "0.1.0"
        inference_env_venv: /opt/fqcn/venv
        inference_env_model_path: "{{ model }}"
    - role: modelwake.serving.model_service
      vars:
        model_service_engine: sglang
        model_service_engine_command: [/opt/fqcn/venv/bin/python, -m, modelwake_sim, serve, --engine, sglang]
        model_service_venv: /opt/fqcn/venv
        model_service_unit: %(unit)s
        model_service_model_path: "{{ model }}"
        model_service_port: 30002
        model_service_tp: 2
        model_service_extra_args: [--load-rate-mib, "32", --start-seconds, "1", --init-seconds, "1",
                                   --warmup-seconds, "0.5"]
        model_service_poll_interval: 1
        model_service_ready_timeout: 300
        model_service_stall_timeout: 60
""" % {"model": GUEST_MODEL, "unit": GUEST_UNIT}


def outside_env(**extra):
    """The environment of another team's shell: none of this checkout's Ansible settings (under
    `make`, ANSIBLE_CONFIG names ours, whose collections_path already holds modelwake.serving, and
    ansible-galaxy would then find nothing to install)."""
    env = dict((k, v) for k, v in os.environ.items() if not k.startswith("ANSIBLE_"))
    env.update(extra)
    return env


def run(argv, **kwargs):
    kwargs.setdefault("env", outside_env())
    proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True, **kwargs)
    assert proc.returncode == 0, "%s failed (rc %d):\n%s" % (" ".join(argv), proc.returncode, proc.stdout)
    return proc.stdout


def run_releasing(argv, marker, hold, timeout=600, **kwargs):
    """Run a command that must succeed; remove `hold` once a line of its output contains `marker`."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True,
                            **kwargs)
    watchdog = threading.Timer(timeout, proc.kill)
    watchdog.start()
    lines = []
    try:
        for line in iter(proc.stdout.readline, ""):
            lines.append(line)
            if marker in line and hold.exists():
                hold.unlink()
        rc = proc.wait()
    finally:
        watchdog.cancel()
        proc.stdout.close()
    out = "".join(lines)
    assert rc == 0, "%s failed (rc %d):\n%s" % (" ".join(argv), rc, out)
    return out


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """A project of another team: the installed collection and an ansible.cfg of its own."""
    build = tmp_path_factory.mktemp("build")
    # Built from the committed tree's files as a clean clone has them: nothing generated in it.
    run([os.path.join(BIN, "ansible-galaxy"), "collection", "build", "--output-path", str(build), ROOT])
    tarballs = glob.glob(str(build / "modelwake-serving-*.tar.gz"))
    assert len(tarballs) == 1
    project = tmp_path_factory.mktemp("project")
    run([os.path.join(BIN, "ansible-galaxy"), "collection", "install", "--force", "--collections-path",
         str(project / "collections"), tarballs[0]], cwd=str(project))
    (project / "ansible.cfg").write_text(textwrap.dedent("""\
        [defaults]
        collections_path = ./collections
        inventory = ./hosts.yml
        stdout_callback = default
        """))
    (project / "hosts.yml").write_text(textwrap.dedent("""\
        all:
          hosts:
            localhost:
              ansible_connection: local
              ansible_python_interpreter: /usr/bin/python3
        """))
    (project / "site.yml").write_text(PLAYBOOK)
    return project


def test_the_tarball_holds_the_collection_and_not_the_project(project):
    installed = project / "collections" / "ansible_collections" / "modelwake" / "serving"
    manifest = json.loads((installed / "MANIFEST.json").read_text())
    assert manifest["collection_info"]["version"] == "1.0.0"
    assert manifest["collection_info"]["license"] == ["GPL-3.0-or-later"]
    names = set(os.listdir(str(installed)))
    assert {"plugins", "roles", "meta", "LICENSE", "README.md"} <= names
    # The project half stays home: inventories, tests, the simulator, the self-link.
    assert not names & {"inventories", "tests", "engines", "molecule", "library", "ansible_collections", ".venv",
                        "bench"}
    assert sorted(os.listdir(str(installed / "roles"))) == ["gpu_preflight", "inference_env", "model_service"]
    # What ships is user documentation: docs/ and the roles' READMEs. What docs/ links to is in the tarball
    # too, but for the project's measured figures (bench/REPORT.md), which stay home with the bench.
    assert glob.glob(str(installed / "docs" / "*.md"))
    for page in glob.glob(str(installed / "docs" / "*.md")):
        with open(page) as handle:
            for target in re.findall(r"\]\((\.\./[^)#]+)", handle.read()):
                if target != "../bench/REPORT.md":
                    assert os.path.exists(os.path.join(os.path.dirname(page), target)), (page, target)


def test_a_playbook_elsewhere_runs_every_module_by_fqcn(project, tmp_path):
    sims = SimRunner(tmp_path, FAST)
    model = make_model(tmp_path / "model", size_mib=8, shards=2)
    gpu_dir = tmp_path / "gpus"
    gpu_dir.mkdir()
    (gpu_dir / "gpus.json").write_text(json.dumps({"gpus": [
        {"index": i, "name": "NVIDIA H200", "uuid": "GPU-%d" % i, "memory_total_mib": 143771,
         "memory_used_mib": 0, "utilization_gpu": 0} for i in range(2)]}))
    results = tmp_path / "results.json"
    # The load pauses until the first progress line is out: the wait lasts past the first read
    # however fast this machine starts the engine.
    hold = tmp_path / "hold-load"
    hold.write_text("")
    sim = sims.start("sglang", model, "--hold-load", str(hold))
    try:
        extra = {"sim_url": sim.url, "sim_pid": sim.pid, "model_path": model, "log_path": sim.log_path,
                 "fakes": FAKES, "gpu_dir": str(gpu_dir), "venv": os.path.join(ROOT, ".venv"),
                 "ansible_env_path": os.environ.get("PATH", ""), "results": str(results)}
        # Nothing from this checkout: its ansible.cfg and plugin paths are out of reach.
        env = outside_env(ANSIBLE_CONFIG=str(project / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
        out = run_releasing([os.path.join(BIN, "ansible-playbook"), "site.yml", "-e", json.dumps(extra)],
                            "wait_for_model_ready [localhost]: ", hold, cwd=str(project), env=env)
    finally:
        sims.stop_all()
    found = json.loads(results.read_text())
    assert found["ready"]["phase"] == "ready" and found["ready"]["bytes_read"] > 0
    # The action plugin ran (from the installed collection) and printed the followed wait's progress.
    assert "wait_for_model_ready [localhost]: " in out
    assert found["smoke"]["status"] == 200 and found["smoke"]["text"] and found["smoke"]["latency_ms"] > 0
    assert [level["concurrency"] for level in found["load"]["levels"]] == [1, 2]
    assert all(level["errors"] == 0 for level in found["load"]["levels"])
    assert found["model_dir"]["shard_count"] == 2 and found["model_dir"]["problems"] == []
    assert [gpu["index"] for gpu in found["gpus"]["gpus"]] == [0, 1]
    assert found["pyenv"]["exists"] is True and found["pyenv"]["pip_version"]
    assert found["ct"]["formats"]
    assert found["pip"]["changed"] is False and "already satisfies" in found["pip"]["msg"]
    assert found["pending"].get("pending") is False or "systemctl show" in found["pending"]["msg"]
    assert "readiness/classifier.py" in found["launcher_files"]
    assert not [path for path in found["launcher_files"] if path.startswith(("preflight/", "python_env/"))]


needs_guests = pytest.mark.skipif(os.geteuid() != 0 or not os.path.exists("/usr/bin/systemd-nspawn"),
                                  reason="test hosts need root and systemd-nspawn (make system-deps)")


@needs_guests
def test_a_playbook_elsewhere_deploys_onto_a_test_host_with_the_roles_by_fqcn(project, tmp_path):
    try:
        VM.up(str(tmp_path))
        rc, out = VM.play("playbooks/demo-model.yml", SIM_ENTRY)
        assert rc == 0, out[-4000:]
        with open(VM.override) as handle:
            guest = json.load(handle)["all"]["children"]["model_hosts"]["hosts"]["vllm-cpu"]
        # The other project's inventory: the guest, and the simulator's wheels (the stand-in for a real
        # engine, so they come from this checkout: demo-model.yml above built them).
        (project / "guest.yml").write_text(json.dumps({"all": {"children": {"model_hosts": {
            "hosts": {"fqcn-host": guest},
            "vars": {"ansible_user": "root", "ansible_python_interpreter": "/usr/bin/python3",
                     "ansible_ssh_common_args": "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null "
                                                "-o LogLevel=ERROR",
                     "inference_env_extra_wheel_dirs": [SIM_WHEELS]}}}}}))
        (project / "deploy.yml").write_text(DEPLOY)
        env = outside_env(ANSIBLE_CONFIG=str(project / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
        argv = [os.path.join(BIN, "ansible-playbook"), "-i", "guest.yml", "deploy.yml"]
        first = run(argv, cwd=str(project), env=env)
        # The roles ran from the installed copy, the launcher started the unit and the wait saw it ready.
        assert "%s: ready after" % GUEST_UNIT in " ".join(first.split()), first[-4000:]
        assert VM.unit_state(GUEST_UNIT)["ActiveState"] == "active"
        # The launcher the role installed said ready to systemd; the unit runs the venv the play named.
        assert VM.sh("systemctl show %s -p StatusText" % GUEST_UNIT).startswith("StatusText=ready in ")
        assert "/opt/fqcn/venv/bin/python" in VM.sh("systemctl cat %s" % GUEST_UNIT)
        # inference_env put py-spy beside the engine's interpreter (offline: staged from the controller).
        assert VM.sh("/opt/fqcn/venv/bin/py-spy --version") == "py-spy 0.4.1"
        # (That a re-run changes nothing is the reboot tests' re-runs: the same roles.)
    finally:
        VM.down()
