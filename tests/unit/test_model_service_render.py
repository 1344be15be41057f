"""The model_service role's rendering, through Ansible itself (real Jinja2, real template module).

One ansible-playbook run renders every engine variant: each inventory host is one variant
(connection local), and the role's output paths are redirected into a temporary directory with
extra vars (they outrank the role's vars/). The play ends before handlers, so nothing restarts.
Asserts exact ExecStart lines, the hardening, and that API keys appear in no unit, no command line
and no playbook output. Bad input must fail with a message naming the variable and write nothing.
"""
import json
import os
import re
import stat
import subprocess
import sys

import pytest

from ansible_collections.modelwake.serving.plugins.module_utils.launcher.textfile import prometheus_text
from ansible_collections.modelwake.serving.plugins.module_utils.readiness.verdict import Verdict

from tests.helpers import ANSIBLE_PLAYBOOK as PLAYBOOK, FAKES, FIXTURES, ROOT
VENV = "/opt/modelwake/venv"
SECRET = "sk-modelwake-test-7f3a9c"

PLAY = """
- name: Render the model_service files
  hosts: all
  connection: local
  gather_facts: false
  tasks:
    - name: Validate and size the start timeout
      ansible.builtin.include_role:
        name: model_service
        tasks_from: preflight.yml
    - name: Render the unit and its files
      ansible.builtin.include_role:
        name: model_service
        tasks_from: unit.yml
    - name: Stop before the handlers (no systemd here)
      ansible.builtin.meta: end_play
"""

# What the restart handler and the start of a unit that is down write before the unit starts.
START_PLAY = """
- name: Write what a start reads
  hosts: all
  connection: local
  gather_facts: false
  tasks:
    - name: Validate and size the start timeout
      ansible.builtin.include_role:
        name: model_service
        tasks_from: preflight.yml
    - name: Write the measured load figures for the start
      ansible.builtin.include_role:
        name: model_service
        tasks_from: refresh_measures.yml
"""

EXTRA_VARS = {
    "_model_service_conf_dir": "{{ render_root }}/{{ inventory_hostname }}/etc",
    "_model_service_unit_file": "{{ render_root }}/{{ inventory_hostname }}/unit.service",
    "_model_service_expected_load_file": "{{ render_root }}/{{ inventory_hostname }}/expected-load.prom",
    "model_service_group": "root",
    "model_service_venv": VENV,
    # This machine stands for the host and has no container runtime: the preflight asks a scripted client
    # (the unit still runs /usr/bin/podman or /usr/bin/docker).
    "_model_service_container_cli": os.path.join(FAKES, "container-cli"),
    # ... and has NVIDIA's devices, the GPUs' CDI specification (Podman) and the Container Toolkit's hook (Docker).
    "_model_service_nvidia_ctl": "/dev/null",
    "_model_service_cdi_dirs": [os.path.join(FIXTURES, "cdi")],
    "_model_service_nvidia_hook": "/bin/sh",
}


def make_model(path, shards=2, shard_bytes=1024 * 1024):
    os.makedirs(path)
    with open(os.path.join(path, "config.json"), "w") as handle:
        json.dump({"architectures": ["DeepseekV3ForCausalLM"]}, handle)
    for i in range(shards):
        with open(os.path.join(path, "model-%05d-of-%05d.safetensors" % (i + 1, shards)), "wb") as handle:
            handle.write(b"\0" * shard_bytes)


def run_play(tmp_path, hosts, groups=None, extra=None, play=None, env=None):
    """Run the rendering play (or `play`) over `hosts` ({name: vars}), with `env` added to its environment (the
    scripted container client's answers); return (completed process, render root)."""
    render_root = tmp_path / "out"
    render_root.mkdir()
    inventory = {"all": {"hosts": dict((name, dict(vars_, ansible_python_interpreter=sys.executable))
                                       for name, vars_ in hosts.items()),
                         "children": groups or {}}}
    (tmp_path / "inventory.json").write_text(json.dumps(inventory))
    (tmp_path / "play.yml").write_text(play or PLAY)  # PLAY read now: a test may have patched it
    extra_vars = dict(EXTRA_VARS, render_root=str(render_root), **(extra or {}))
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_FORCE_COLOR="0", **(env or {}))
    proc = subprocess.run(
        [PLAYBOOK, "-i", str(tmp_path / "inventory.json"), str(tmp_path / "play.yml"),
         "-e", json.dumps(extra_vars), "--diff"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True,
        timeout=300)
    return proc, render_root


def exec_start(unit_text):
    lines = [line for line in unit_text.splitlines() if line.startswith("ExecStart=")]
    assert len(lines) == 1, unit_text
    return lines[0]


def directive(unit_text, name):
    return [line.split("=", 1)[1] for line in unit_text.splitlines() if line.startswith(name + "=")]


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    """Every variant rendered in one ansible-playbook run."""
    tmp_path = tmp_path_factory.mktemp("render")
    models = tmp_path / "models"
    make_model(str(models / "k26"), shards=4, shard_bytes=2 * 1024 * 1024)
    k26 = str(models / "k26")
    hosts = {
        "sglang": {"model_service_engine": "sglang", "model_service_unit": "sglang-k26",
                   "model_service_model_path": k26, "model_service_tp": 8,
                   "model_service_gpus": [0, 1, 2, 3, 4, 5, 6, 7],
                   "model_service_extra_args": ["--attention-backend", "triton", "--disable-cuda-graph",
                                                "--trust-remote-code"],
                   "model_service_conflicts": ["sglang-k26-ddtree"], "model_service_launcher": False,
                   "model_service_min_read_rate_mib": 1, "model_service_init_budget_sec": 100},
        "sglangkey": {"model_service_engine": "sglang", "model_service_unit": "sglang-pub",
                      "model_service_model_path": k26, "model_service_host": "0.0.0.0",
                      "model_service_api_key": SECRET, "model_service_launcher": False},
        "vllm": {"model_service_engine": "vllm", "model_service_unit": "vllm-k26",
                 "model_service_model_path": k26, "model_service_tp": 2,
                 "model_service_served_model_name": "kimi-k2.6", "model_service_host": "::", "model_service_launcher": False,
                 "model_service_api_key": SECRET, "model_service_env": {"NCCL_DEBUG": "INFO", "HF_HOME": "/srv/hf"}},
        # The simulator as the demo runs it: SGLang's arguments behind another entry point, and an
        # optional writable path (its fake GPUs' holder files).
        "sim": {"model_service_engine": "sglang", "model_service_unit": "sglang-k26",
                "model_service_engine_command": [VENV + "/bin/python", "-m", "modelwake_sim", "serve", "--engine", "sglang"],
                "model_service_model_path": k26, "model_service_tp": 8, "model_service_api_key": SECRET,
                "model_service_extra_args": ["--disable-cuda-graph", "--fake-gpus", "--init-seconds", "2"],
                "model_service_read_write_paths": ["-/run/modelwake-fake-gpu"], "model_service_launcher": False},
        # Node 0 listens where the other nodes reach it (their wait asks it), so with an API key.
        "node0": {"model_service_engine": "sglang", "model_service_model_path": k26, "model_service_tp": 16,
                  "model_service_nodes_group": "pair", "ansible_host": "2001:db8::10", "model_service_host": "::",
                  "model_service_api_key": SECRET},
        "node1": {"model_service_engine": "sglang", "model_service_model_path": k26, "model_service_tp": 16,
                  "model_service_nodes_group": "pair", "ansible_host": "2001:db8::11", "model_service_host": "::",
                  "model_service_api_key": SECRET},
        "liveness": {"model_service_engine": "sglang", "model_service_unit": "sglang-live", "model_service_model_path": k26,
                     "model_service_watchdog_sec": 60, "model_service_liveness": True,
                     "model_service_liveness_failures": 4, "model_service_liveness_check": "completion",
                     "model_service_crash_loop_starts": 5,
                     "model_service_failure_webhook_url": "https://hooks.example.test/" + SECRET},
        "notify": {"model_service_engine": "vllm", "model_service_unit": "vllm-notify", "model_service_model_path": k26,
                   "model_service_launcher": True,
                   "model_service_extra_args": ["--note", "50% of $HOME \"q\"", "--x", "%h"],
                   "model_service_limits": {"LimitMEMLOCK": "infinity"}},
        # Budgets from the start history, which is then turned off: auto resolves to the defaults.
        "autobudgets": {"model_service_engine": "vllm", "model_service_unit": "vllm-auto", "model_service_model_path": k26,
                        "model_service_launcher": True, "model_service_stall_timeout": "auto",
                        "model_service_ready_timeout": "auto", "model_service_start_history": False},
        # The catalog's loader options on the engine's command line, and a prefetch written as YAML's bare `on`.
        "loaders": {"model_service_engine": "vllm", "model_service_unit": "vllm-loaders", "model_service_model_path": k26,
                    "model_service_prefetch": True, "model_service_load_format": "safetensors",
                    "model_service_safetensors_load_strategy": "eager",
                    "model_service_model_loader_extra_config": {"num_threads": 8, "a": "b c"},
                    "model_service_extra_args": ["--enforce-eager"]},
        "sglangloader": {"model_service_engine": "sglang", "model_service_unit": "sglang-loader",
                         "model_service_model_path": k26, "model_service_prefetch": "off",
                         "model_service_load_format": "fastsafetensors",
                         "model_service_model_loader_extra_config": {"enable_multithread_load": True}},
        "metricsoff": {"model_service_engine": "sglang", "model_service_unit": "sglang-quiet",
                       "model_service_model_path": k26, "model_service_launcher": True,
                       "model_service_engine_metrics": False, "model_service_expected_load_seconds": 930,
                       "model_service_launcher_textfile": "/var/lib/node_exporter/textfile/sglang-quiet.prom"},
    }
    groups = {"pair": {"hosts": {"node0": {}, "node1": {}}}}
    proc, root = run_play(tmp_path, hosts, groups)
    assert proc.returncode == 0, proc.stdout
    return {"proc": proc, "root": root, "k26": k26}


def read(rendered, host, name):
    with open(os.path.join(str(rendered["root"]), host, name)) as handle:
        return handle.read()


def test_unit_starts_with_the_managed_comment_then_unit_section(rendered):
    lines = read(rendered, "sglang", "unit.service").splitlines()
    assert lines[:4] == ["#", "# Ansible managed", "#", "[Unit]"]
    env = read(rendered, "vllm", "etc/vllm-k26.env").splitlines()
    assert env[:3] == ["#", "# Ansible managed", "#"] and not env[3].startswith("#")


def test_sglang_exec_start_is_exact(rendered):
    unit = read(rendered, "sglang", "unit.service")
    assert exec_start(unit) == (
        "ExecStart=%s/bin/python -m sglang.launch_server --model-path %s --tp 8 --host 127.0.0.1 --port 30001 "
        "--enable-metrics --attention-backend triton --disable-cuda-graph --trust-remote-code" % (VENV, rendered["k26"]))
    assert directive(unit, "Conflicts") == ["sglang-k26-ddtree.service"]
    assert directive(unit, "Environment")[-2:] == ["CUDA_DEVICE_ORDER=PCI_BUS_ID", "CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7"]
    assert "nvidia-persistenced.service nvidia-fabricmanager.service" in directive(unit, "After")
    assert directive(unit, "SyslogIdentifier") == ["sglang-k26"]
    assert not [line for line in directive(unit, "Environment") if line.startswith("VLLM_")]


def test_sglang_api_key_goes_through_a_config_file(rendered):
    unit = read(rendered, "sglangkey", "unit.service")
    conf = os.path.join(str(rendered["root"]), "sglangkey", "etc", "sglang-pub.sglang.yaml")
    assert exec_start(unit).endswith("--host 0.0.0.0 --port 30001 --enable-metrics --config %s" % conf)
    with open(conf) as handle:
        assert 'api-key: "%s"' % SECRET in handle.read()
    assert stat.S_IMODE(os.stat(conf).st_mode) == 0o640


def test_vllm_exec_start_and_env_file(rendered):
    unit = read(rendered, "vllm", "unit.service")
    assert exec_start(unit) == (
        "ExecStart=%s/bin/python -m vllm.entrypoints.openai.api_server --model %s --served-model-name kimi-k2.6 "
        "--host :: --port 30001 --tensor-parallel-size 2 --shutdown-timeout 30" % (VENV, rendered["k26"]))
    env_path = os.path.join(str(rendered["root"]), "vllm", "etc", "vllm-k26.env")
    env = read(rendered, "vllm", "etc/vllm-k26.env")
    assert 'VLLM_API_KEY="%s"' % SECRET in env.splitlines()
    assert 'NCCL_DEBUG="INFO"' in env.splitlines()
    assert stat.S_IMODE(os.stat(env_path).st_mode) == 0o600
    assert directive(unit, "EnvironmentFile") == [env_path]
    # vLLM's engine-core deadline is the whole ready_timeout (the role's default, 3600 s).
    assert "VLLM_ENGINE_READY_TIMEOUT_S=3600" in directive(unit, "Environment")
    # No GPUs listed: no CUDA variables, no ordering after the driver's services.
    assert not [line for line in directive(unit, "Environment") if line.startswith("CUDA_")]
    assert directive(unit, "After") == ["network-online.target"]


def test_an_engine_command_takes_the_engines_arguments_and_key(rendered):
    unit = read(rendered, "sim", "unit.service")
    conf = os.path.join(str(rendered["root"]), "sim", "etc", "sglang-k26.sglang.yaml")
    assert exec_start(unit) == (
        "ExecStart=%s/bin/python -m modelwake_sim serve --engine sglang --model-path %s --tp 8 --host 127.0.0.1 "
        "--port 30001 --enable-metrics --config %s --disable-cuda-graph --fake-gpus --init-seconds 2"
        % (VENV, rendered["k26"], conf))
    assert 'api-key: "%s"' % SECRET in read(rendered, "sim", "etc/sglang-k26.sglang.yaml").splitlines()
    # ProtectSystem=strict: the non-root ranks may write only the optional path given (the "-" kept).
    assert directive(unit, "ReadWritePaths") == ["-/run/modelwake-fake-gpu"]
    assert directive(read(rendered, "sglang", "unit.service"), "ReadWritePaths") == []


def test_multinode_args_follow_the_group_order(rendered):
    for rank, host in enumerate(["node0", "node1"]):
        line = exec_start(read(rendered, host, "unit.service"))
        assert "--tp 16" in line
        assert "--nnodes 2 --node-rank %d --dist-init-addr [2001:db8::10]:50000 " % rank in line
        assert SECRET not in line
    # Node 0's launcher watches node 1's connections to the dist-init port; node 1 runs no launcher.
    assert " --peer-port 50000 --peer node1=2001:db8::11 -- " in exec_start(read(rendered, "node0", "unit.service"))
    assert "--peer" not in exec_start(read(rendered, "node1", "unit.service"))


def test_launcher_makes_a_notify_unit_and_words_are_quoted_for_systemd(rendered):
    unit = read(rendered, "notify", "unit.service")
    assert directive(unit, "Type") == ["notify"] and directive(unit, "NotifyAccess") == ["main"]
    # systemd would expand % specifiers and $VARS: they are doubled; words with spaces are quoted.
    assert exec_start(unit) == (
        'ExecStart={venv}/bin/python /opt/modelwake/lib/modelwake-launch --url http://127.0.0.1:30001 --engine vllm '
        '--model {k26} --model-path {k26} --prefetch auto --ready-check completion --timeout 3600 --stall-timeout 600 '
        '--poll-interval 5 --extend-timeout 640 --stop-timeout 140 '
        '--state-dir /var/lib/modelwake/vllm-notify --crash-loop-starts 3 '
        '--gpu-turns /run/modelwake/gpu-turns --gpu-release-timeout 180 --name vllm-notify.service -- '
        '{venv}/bin/python -m vllm.entrypoints.openai.api_server '
        '--model {k26} --host 127.0.0.1 --port 30001 --tensor-parallel-size 1 --shutdown-timeout 30 '
        '--note "50%% of $$HOME \\"q\\"" --x %%h'.format(venv=VENV, k26=rendered["k26"]))
    assert "LimitMEMLOCK=infinity" in unit.splitlines()
    # The start timeout is the launcher's stall budget (stall 600 s + 2 polls + 30 s), renewed on progress.
    assert directive(unit, "TimeoutStartSec") == ["640"]


def test_sglang_metrics_can_be_switched_off_and_the_textfile_gets_the_expected_load(rendered):
    line = exec_start(read(rendered, "metricsoff", "unit.service"))
    # The launcher labels the textfile with the unit's full name, as node_exporter's systemd collector does.
    assert " --name sglang-quiet.service --textfile /var/lib/node_exporter/textfile/sglang-quiet.prom -- " in line
    engine = line.split(" -- ", 1)[1]
    assert engine.startswith("%s/bin/python -m sglang.launch_server " % VENV) and "--enable-metrics" not in engine
    # The expected load time is a textfile of its own, never in the unit: a new figure restarts nothing.
    written = read(rendered, "metricsoff", "expected-load.prom")
    assert 'modelwake_load_expected_seconds{name="sglang-quiet.service"} 930\n' in written
    # The launcher writes the same family when run by hand with --expected-load-seconds: node_exporter
    # refuses one family with two HELP texts, so the role's must be the launcher's, word for word.
    launchers = prometheus_text("sglang-quiet.service", Verdict(phase="loading", msg=""), 0.0, expected_load=930)
    assert [line for line in written.splitlines() if line.startswith("#")] == \
        [line for line in launchers.splitlines() if "modelwake_load_expected_seconds" in line and line.startswith("#")]
    # Without a textfile there is nothing to write it beside.
    assert not os.path.exists(os.path.join(str(rendered["root"]), "notify", "expected-load.prom"))


def changed_count(proc):
    return int(re.search(r"changed=(\d+)", proc.stdout.rsplit("PLAY RECAP", 1)[1]).group(1))


def task_status(proc, name):
    """ok, changed or skipping: what the play said of its task `name`."""
    # With --diff a changed file's diff comes between the task's line and its status.
    found = re.search(r"TASK \[model_service : %s\] \*+\n.*?^(ok|changed|skipping): \[" % re.escape(name), proc.stdout,
                      re.S | re.M)
    assert found, proc.stdout
    return found.group(1)


def test_a_measured_expected_load_is_written_only_where_the_unit_starts(tmp_path):
    """The GPU preflight measures the disk cold every run: its figure wanders (2-3x on a virtual disk, none
    at all when the cache was warm), and a host where nothing changed must still converge with changed=0.
    So the measured figure is written only where the unit starts (the restart handler, the start of a unit
    that is down), riding on that start's change; the operator's own figure is configuration, written when
    it differs and reported as a change."""
    make_model(str(tmp_path / "model"))
    shared = str(tmp_path / "sglang-k26-expected-load.prom")
    written, said = [], []
    runs = ((1000, None, PLAY), (1000, None, START_PLAY), (400, None, PLAY), (700, None, START_PLAY), (700, 900, PLAY))
    for run, (measured, operators, play) in enumerate(runs):
        host = {"model_service_engine": "sglang", "model_service_model_path": str(tmp_path / "model"),
                "model_service_launcher_textfile": "/var/lib/node_exporter/textfile/sglang-k26.prom",
                "gpu_preflight_expected_load_seconds": measured}
        if operators:
            host["model_service_expected_load_seconds"] = operators
        (tmp_path / str(run)).mkdir()
        proc, _root = run_play(tmp_path / str(run), {"host": host}, extra={"_model_service_expected_load_file": shared},
                               play=play)
        assert proc.returncode == 0, proc.stdout
        written.append(open(shared).read().splitlines()[-1].rsplit(" ", 1)[1] if os.path.exists(shared) else None)
        said.append(task_status(proc, "Write the expected load time beside the textfile"))
    assert written == [None, "1000", "1000", "700", "900"]
    assert said == ["skipping", "ok", "skipping", "ok", "changed"]


def test_the_disk_rate_for_the_launcher_is_written_only_where_the_unit_starts(tmp_path):
    """The launcher's slow-load line reads the preflight's cold disk rate from the unit's state directory,
    never from the unit: written for a start (riding on its change: the run's changed count does not move),
    and left as it was by a preflight that could not measure the disk cold (0)."""
    make_model(str(tmp_path / "model"))
    state = tmp_path / "state"
    written = []
    for run, rate in enumerate((900000000, 0, 1800000000)):
        host = {"model_service_engine": "sglang", "model_service_model_path": str(tmp_path / "model"),
                "gpu_preflight_disk_rate": rate, "model_service_user": "root", "model_service_group": "root"}
        (tmp_path / str(run)).mkdir()
        proc, _root = run_play(tmp_path / str(run), {"host": host}, extra={"_model_service_state_dir": str(state)},
                               play=START_PLAY)
        assert proc.returncode == 0, proc.stdout
        assert changed_count(proc) == 0, proc.stdout
        written.append((state / "disk-rate").read_text().strip())
    assert written == ["900000000", "900000000", "1800000000"]


def test_a_stop_gives_the_requests_in_flight_their_drain_before_the_kill(rendered):
    """model_service_drain_seconds (30 by default) on top of the stop time: vLLM drains with
    --shutdown-timeout, SGLang has no such option; systemd and the launcher wait that much longer."""
    vllm = read(rendered, "notify", "unit.service")
    assert directive(vllm, "TimeoutStopSec") == ["150"]
    # The launcher's SIGKILL comes 10 s before systemd's, after the drain too.
    assert " --stop-timeout 140 " in exec_start(vllm)
    sglang = read(rendered, "liveness", "unit.service")
    assert directive(sglang, "TimeoutStopSec") == ["150"]
    assert "--shutdown-timeout" not in exec_start(sglang)


def test_liveness_adds_the_launcher_options_under_a_watchdog(rendered):
    unit = read(rendered, "liveness", "unit.service")
    assert directive(unit, "WatchdogSec") == ["60"]
    assert " --liveness-failures 4 --liveness-check completion -- " in exec_start(unit)
    # Without it the launcher never probes after ready.
    assert "--liveness" not in exec_start(read(rendered, "notify", "unit.service"))


def test_a_launcher_unit_records_its_failed_starts_in_its_state_directory_and_stops_a_crash_loop(rendered):
    unit = read(rendered, "liveness", "unit.service")
    # The record survives reboots (StateDirectory=, the service user's), and 7, the launcher's stopped
    # crash loop, is not restarted.
    assert directive(unit, "StateDirectory") == ["modelwake/sglang-live"]
    assert directive(unit, "RestartPreventExitStatus") == ["2 7 8"]
    assert " --state-dir /var/lib/modelwake/sglang-live --crash-loop-starts 5 " in exec_start(unit)


PTRACE_CASES = {
    "noyama": (None, "auto", False),  # no Yama: the launcher reads its own user's engine
    "scope0": ("0", "auto", False),
    "scope1": ("1", "auto", True),  # py-spy is not the engine's ancestor
    "scope2": ("2", "auto", True),  # admin-only attach
    "scope3": ("3", "auto", False),  # nobody may attach: granting would not help
    "never": ("1", "never", False),
    "always": (None, "always", True),
}


def test_ptrace_is_granted_to_the_launcher_only_where_yama_asks_for_it(tmp_path):
    model = str(tmp_path / "model")
    make_model(model)
    hosts = {}
    for name, (scope, grant, _granted) in PTRACE_CASES.items():
        scope_file = tmp_path / ("ptrace_scope-" + name)
        if scope is not None:
            scope_file.write_text(scope + "\n")
        hosts[name] = {"model_service_engine": "vllm", "model_service_unit": "vllm-notify", "model_service_model_path": model,
                       "model_service_ptrace_grant": grant, "test_scope_file": str(scope_file)}
    # Each host reads its own Yama file (an extra var templated per host).
    proc, root = run_play(tmp_path, hosts, extra={"_model_service_ptrace_scope_file": "{{ test_scope_file }}"})
    assert proc.returncode == 0, proc.stdout
    for name, (_scope, _grant, granted) in PTRACE_CASES.items():
        with open(os.path.join(str(root), name, "unit.service")) as handle:
            unit = handle.read()
        if granted:
            assert directive(unit, "AmbientCapabilities") == ["CAP_SYS_PTRACE"], name
            assert directive(unit, "CapabilityBoundingSet") == ["CAP_SYS_PTRACE"], name
            assert directive(unit, "NoNewPrivileges") == ["true"]  # an ambient grant needs no new privileges
        else:
            assert not directive(unit, "AmbientCapabilities") and not directive(unit, "CapabilityBoundingSet"), name


def test_no_secret_in_units_or_output(rendered):
    for host in ("sglangkey", "vllm", "sim", "liveness"):
        assert SECRET not in read(rendered, host, "unit.service")
    # --diff was on: the env and config files' contents must still not reach the output.
    assert SECRET not in rendered["proc"].stdout


def test_hardening_and_restart_policy(rendered):
    unit = read(rendered, "sglang", "unit.service")
    for line in ("KillMode=control-group", "Restart=always", "RestartSec=10", "RestartPreventExitStatus=2",
                 "NoNewPrivileges=true",
                 "ProtectSystem=strict", "PrivateTmp=true", "User=modelwake", "Group=root", "Type=simple",
                 "CacheDirectory=modelwake/sglang-k26", "StartLimitBurst=5"):
        assert line in unit.splitlines(), line
    # The test model is outside /root and /home: homes are hidden entirely.
    assert directive(unit, "ProtectHome") == ["true"]
    # 8 MiB of shards at 1 MiB/s, plus the 100 s init budget: the weights alone, not config.json beside them
    # (the model's size is counted the same by the GPU preflight and the readiness module).
    assert directive(unit, "TimeoutStartSec") == ["108"]


def test_model_state_lists_the_shards(rendered):
    state = read(rendered, "sglang", "etc/sglang-k26.model-state").splitlines()
    assert len(state) == 5  # config.json and 4 shards
    assert state[1].startswith(os.path.join(rendered["k26"], "model-00001-of-00004.safetensors") + " 2097152 ")


def test_the_catalogs_loader_options_reach_the_engine_and_the_prefetch_the_launcher(rendered):
    line = exec_start(read(rendered, "loaders", "unit.service"))
    # YAML's bare `on` (true) is the launcher's on; the engine's own loader flags before the extra arguments.
    assert " --model-path %s --prefetch on --ready-check " % rendered["k26"] in line, line
    assert line.endswith(' --load-format safetensors --safetensors-load-strategy eager '
                         '--model-loader-extra-config "{\\"a\\": \\"b c\\", \\"num_threads\\": 8}" --enforce-eager'), line
    line = exec_start(read(rendered, "sglangloader", "unit.service"))
    assert " --prefetch off --ready-check " in line and "--safetensors-load-strategy" not in line
    assert line.endswith(' --load-format fastsafetensors --model-loader-extra-config "{\\"enable_multithread_load\\": true}"')
    # No launcher, no prefetch: the engine is the unit's main process.
    assert "--prefetch" not in exec_start(read(rendered, "sglang", "unit.service"))


BAD_INPUTS = [
    ({"model_service_safetensors_load_strategy": "eager"},
     "is vLLM's option (--safetensors-load-strategy) only, and takes nothing but lazy with vLLM's multi-thread loader "
     "(model_service_model_loader_extra_config.enable_multithread_load): is 'eager', engine sglang"),
    ({"model_service_load_format": "Fast Safetensors"}, "model_service_load_format must be empty (the engine's default) "
     "or the engine's format name in lowercase, e.g. fastsafetensors (is 'Fast Safetensors')"),
    ({"model_service_load_format": "fastsafetensors", "model_service_extra_args": ["--load-format=safetensors"]},
     "model_service_extra_args must not set a loader flag the role's loader options set already (--load-format,"),
    ({"model_service_prefetch": "always"}, "model_service_prefetch must be auto, on or off (is always)"),
    ({"model_service_host": "0.0.0.0"}, "model_service_api_key is empty"),
    ({"model_service_extra_args": ["--api-key=abc"]}, "model_service_extra_args contains --api-key"),
    ({"model_service_env": {"BAD-NAME": "1"}}, "model_service_env keys must be environment variable names"),
    ({"model_service_unit": "sglang-k26.service"}, "must be a plain unit name"),
    ({"model_service_tp": 4, "model_service_gpus": [0, 1]}, "at least model_service_tp / nodes entries (4)"),
    ({"model_service_model_path": "/nonexistent/model"}, "has no config.json or no *.safetensors"),
    ({"model_service_engine": "tgi"}, "model_service_engine"),
    ({"model_service_expected_load_seconds": "15m"}, "model_service_expected_load_seconds (15m) whole seconds"),
    ({"model_service_liveness": True}, "model_service_liveness needs systemd's watchdog: set model_service_watchdog_sec above 0"),
    ({"model_service_liveness": True, "model_service_watchdog_sec": 60, "model_service_launcher": False},
     "with model_service_launcher true (is False)"),
    ({"model_service_failure_webhook_url": "hooks.example.test/" + SECRET},
     "model_service_failure_webhook_url must be one http:// or https:// URL"),
    ({"model_service_failure_webhook_url": "https://hooks.example.test/a\nb"},
     "model_service_failure_webhook_url must be one http:// or https:// URL"),
]


@pytest.mark.parametrize("bad,message", BAD_INPUTS, ids=[b[1][:30] for b in BAD_INPUTS])
def test_bad_input_fails_clearly_and_writes_nothing(tmp_path, bad, message):
    make_model(str(tmp_path / "model"))
    host = dict({"model_service_model_path": str(tmp_path / "model")}, **bad)
    proc, root = run_play(tmp_path, {"bad": host})
    assert proc.returncode != 0
    assert " ".join(message.split()) in " ".join(proc.stdout.split()), proc.stdout
    assert not os.path.exists(os.path.join(str(root), "bad"))
    assert SECRET not in proc.stdout  # a refused webhook URL is named, never shown


def test_every_wrong_setting_is_named_at_once(tmp_path):
    """The settings are checked in one task: a person who got three fields wrong reads all three, each
    message naming its field, and a check that applies only elsewhere (the failure webhook's) says nothing."""
    make_model(str(tmp_path / "model"))
    host = {"model_service_model_path": str(tmp_path / "model"), "model_service_port": 0,
            "model_service_prefetch": "always", "model_service_unit": "sglang-k26.service"}
    proc, root = run_play(tmp_path, {"bad": host})
    assert proc.returncode != 0
    flat = " ".join(proc.stdout.split())
    for message in ("model_service_port must be 1-65535 (is 0)", "model_service_prefetch must be auto, on or off (is always)",
                    "model_service_unit 'sglang-k26.service' must be a plain unit name"):
        assert message in flat, flat
    assert "model_service_failure_webhook_url" not in flat, flat
    assert not os.path.exists(os.path.join(str(root), "bad"))


def test_every_unit_keeps_its_start_history_in_a_state_directory(rendered):
    for host, unit_name in (("sglang", "sglang-k26"), ("notify", "vllm-notify"), ("autobudgets", "vllm-auto")):
        assert directive(read(rendered, host, "unit.service"), "StateDirectory") == ["modelwake/" + unit_name]


def test_auto_budgets_are_left_to_the_launcher(rendered):
    unit = read(rendered, "autobudgets", "unit.service")
    line = exec_start(unit)
    assert " --timeout auto --stall-timeout auto " in line
    # The launcher finds the stall budget at its start and grants it with its first EXTEND_TIMEOUT_USEC:
    # the unit starts with the default's (600 + 2 polls + 30), and no fixed --extend-timeout caps it.
    assert "--extend-timeout" not in line and directive(unit, "TimeoutStartSec") == ["640"]
    assert " --poll-interval 5 --stop-timeout " in line
    assert " --state-dir /var/lib/modelwake/vllm-auto --crash-loop-starts 3 --no-start-history " in line
    # vLLM's own deadline cannot know the auto budget: it stays out of the way.
    assert "VLLM_ENGINE_READY_TIMEOUT_S=86400" in directive(unit, "Environment")


@pytest.mark.parametrize("runtime,packages", [("docker", "docker.io tini"), ("podman", "podman catatonit")])
def test_a_container_runtime_missing_on_the_host_is_refused_before_anything_is_written(tmp_path, runtime, packages):
    # The runtime's tool where the host has none (extra vars: above the role's own path of it).
    make_model(str(tmp_path / "model"))
    host = {"model_service_model_path": str(tmp_path / "model"), "model_service_runtime": runtime,
            "model_service_container_image_id": "sha256:" + "a" * 64}
    missing = str(tmp_path / "no-such-dir" / runtime)
    proc, root = run_play(tmp_path, {"bad": host}, extra={"_model_service_container_cli": missing})
    assert proc.returncode != 0
    flat = " ".join(proc.stdout.split())
    assert ("model_service_runtime is %s but %s is missing on bad; nothing was changed." % (runtime, missing)) in flat, flat
    assert "`apt-get update && apt-get install -y %s`" % packages in flat, flat
    assert not os.path.exists(os.path.join(str(root), "bad"))


def container_host(tmp_path, runtime, **more):
    make_model(str(tmp_path / "model"))
    return dict({"model_service_model_path": str(tmp_path / "model"), "model_service_runtime": runtime,
                 "model_service_container_image_id": "sha256:" + "a" * 64}, **more)


@pytest.mark.parametrize("runtime,answer,refusal", [
    ("docker", "fail", "`%s info` did not answer on bad: Docker's daemon is not running or its socket is not reachable; "
                       "nothing was changed. Start it: `systemctl enable --now docker` (docker info said: Cannot connect "
                       "to the Docker daemon"),
    ("docker", "20.10.5 overlay2", None),
    ("docker", "19.03.15 overlay2", "docker 19.03.15 on bad is older than 20.10, the oldest whose `run` options the unit "
                                    "uses; nothing was changed."),
    ("podman", "3.0.1 overlay", None),
    ("podman", "2.1.1 overlay", "podman 2.1.1 on bad is older than 3.0, the oldest whose `run` options the unit uses; "
                                "nothing was changed."),
])
def test_a_container_runtime_that_does_not_answer_or_is_too_old_is_refused_before_anything_is_written(
        tmp_path, runtime, answer, refusal):
    proc, root = run_play(tmp_path, {"bad": container_host(tmp_path, runtime)}, env={"FAKE_RUNTIME_INFO": answer})
    flat = " ".join(proc.stdout.split())
    if refusal is None:  # the oldest releases that pass, as Debian 11 ships them
        assert proc.returncode == 0, flat
        return
    assert proc.returncode != 0, flat
    assert (refusal % os.path.join(FAKES, "container-cli") if "%s" in refusal else refusal) in flat, flat
    assert not os.path.exists(os.path.join(str(root), "bad"))


def test_a_pinned_image_the_host_cannot_get_is_refused_and_one_it_can_passes(tmp_path):
    image = "sha256:" + "a" * 64
    absent = {"FAKE_RUNTIME_ABSENT_IMAGE": image}
    archive = tmp_path / "image.tar"
    cases = [
        # Neither on the host nor to be had: refused, nothing written.
        ({}, "the catalog names neither an image_archive to load it from nor an image to pull"),
        ({"inference_env_container_image_archive": str(archive)}, "its archive %s does not exist on the controller" % archive),
        # To be had (inference_env loads or pulls it later): passes.
        ({"inference_env_container_image": "localhost/modelwake-sim:1"}, None),
        ({"inference_env_container_image_archive": str(archive)}, None),
    ]
    for number, (more, refusal) in enumerate(cases):
        if number == 3:
            archive.write_bytes(b"an archive")
        case = tmp_path / str(number)
        case.mkdir()
        proc, root = run_play(case, {"bad": container_host(case, "podman", **more)}, env=absent)
        flat = " ".join(proc.stdout.split())
        if refusal is None:
            assert proc.returncode == 0, flat
            continue
        assert proc.returncode != 0, flat
        assert ("The pinned image %s is not on bad, and %s; nothing was changed. Set the model's image_archive (a "
                "`podman save` of it on the controller) or image" % (image, refusal)) in flat, flat
        assert not os.path.exists(os.path.join(str(root), "bad"))


def test_the_vfs_storage_driver_is_said_and_not_refused(tmp_path):
    proc, _root = run_play(tmp_path, {"host": container_host(tmp_path, "podman")},
                           env={"FAKE_RUNTIME_INFO": "4.3.1 vfs"})
    flat = " ".join(proc.stdout.split())
    assert proc.returncode == 0, flat
    assert "storage driver on host is vfs: every container start copies the whole image" in flat, flat
