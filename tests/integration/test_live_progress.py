"""Live progress under real ansible-playbook: the action plugin starts the module once, follows the
wait it leaves on the host, prints a line per host every interval without -v, and ends with the
result one long module call gives. The GPUs are read through NVML (ctypes) from a fake
libnvidia-ml.so.1 on LD_LIBRARY_PATH, as the driver's library is found on a GPU host.

Every simulated engine runs in its own process group on a free loopback port with a 64 MiB model
and a start of about 16 s (8 s of reading) (SimRunner kills each group afterwards, whatever the outcome); the
"hosts" are inventory aliases of localhost with ansible_connection=local, each waiting on its own
engine, so two hosts wait at once in two forked workers.
"""
import json
import os
import re
import subprocess
import sys

import pytest

from tests.fakes import fake_nvml
from tests.helpers import ANSIBLE_PLAYBOOK as PLAYBOOK_BIN, ROOT
from tests.helpers.simharness import SimRunner, make_model
SECRET = "sk-live-progress-secret-5c2e"
START = ["--start-seconds", "1", "--load-rate-mib", "8", "--init-seconds", "6", "--warmup-seconds", "1",
         "--fake-gpus", "--fake-gpu-count", "2", "--tp", "2"]
LINE = re.compile(r"^wait_for_model_ready \[(?P<host>[\w-]+)\]: (?P<phase>[a-z_]+) (?P<elapsed>\w+)(?P<rest>.*)$",
                  re.MULTILINE)

WAIT_TASK = """
    - name: Wait until the simulated engine answers
      modelwake.serving.wait_for_model_ready:
        url: "{{ sim_url }}"
        engine: sglang
        pid: "{{ sim_pid }}"
        log_path: "{{ sim_log }}"
        model_path: "{{ sim_model }}"
        api_key: "{{ sim_api_key }}"
        timeout: 120
        stall_timeout: 60
        poll_interval: 1
        progress_path: "{{ sim_progress }}"
      register: wait_result
      ignore_errors: true

    - name: Keep the result for the test
      ansible.builtin.copy:
        content: "{{ wait_result | to_nice_json }}"
        dest: "{{ sim_result }}"
        mode: "0600"
"""


@pytest.fixture(scope="module")
def nvml_dir(tmp_path_factory):
    return os.path.dirname(fake_nvml.build(str(tmp_path_factory.mktemp("fake-nvml"))))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_model(tmp_path_factory.mktemp("model"), size_mib=64, shards=8)


@pytest.fixture
def gpu_dir(tmp_path):
    directory = tmp_path / "gpus"
    directory.mkdir()
    return str(directory)


@pytest.fixture
def start_sim(tmp_path, gpu_dir, model_dir):
    runner = SimRunner(tmp_path, START)

    def start(*extra):
        return runner.start("sglang", model_dir, *extra, env={"MODELWAKE_API_KEY": SECRET,
                                                             "MODELWAKE_FAKE_GPU_DIR": gpu_dir})
    yield start
    runner.stop_all()


@pytest.fixture
def playbook(tmp_path, gpu_dir, model_dir, nvml_dir):
    def run(sims, tasks, *args, **env):
        return run_playbook(tmp_path, gpu_dir, model_dir, nvml_dir, sims, tasks, *args, **env)
    return run


def run_playbook(tmp_path, gpu_dir, model_dir, nvml_dir, sims, tasks, *args, **env_overrides):
    """ansible-playbook on one localhost alias per sim; returns (rc, stdout, {host: result}), with
    stderr in stdout unless env_overrides ask for another stdout callback (then stdout, stderr)."""
    inventory = tmp_path / "inventory.ini"
    lines = ["[sims]"]
    for host, sim in sims.items():
        lines.append("%s ansible_connection=local ansible_python_interpreter=%s sim_url=%s sim_pid=%d sim_log=%s "
                     "sim_model=%s sim_progress=%s sim_result=%s"
                     % (host, sys.executable, sim.url, sim.pid, sim.log_path, model_dir,
                        tmp_path / ("%s.progress.jsonl" % host), tmp_path / ("%s.result.json" % host)))
    inventory.write_text("\n".join(lines) + "\n")
    playbook = tmp_path / "wait.yml"
    playbook.write_text("- name: Wait for the simulated engines\n  hosts: sims\n  gather_facts: false\n"
                        "  tasks:\n" + tasks)
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_STDOUT_CALLBACK="default",
               ANSIBLE_NOCOLOR="1", MODELWAKE_FAKE_GPU_DIR=gpu_dir, LD_LIBRARY_PATH=nvml_dir)
    env.update(env_overrides)
    separate = "ANSIBLE_STDOUT_CALLBACK" in env_overrides
    # The key goes in as an extra var, as a vault variable would: never on the command line's output.
    extra = tmp_path / "secret.json"
    extra.write_text(json.dumps({"sim_api_key": SECRET}))
    proc = subprocess.run([PLAYBOOK_BIN, "-i", str(inventory), "-e", "@%s" % extra, str(playbook)] + list(args),
                          cwd=ROOT, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE if separate else subprocess.STDOUT,
                          universal_newlines=True, timeout=300)
    results = {}
    for host in sims:
        path = tmp_path / ("%s.result.json" % host)
        if path.exists():
            results[host] = json.loads(path.read_text())
    if separate:
        return proc.returncode, (proc.stdout, proc.stderr), results
    return proc.returncode, proc.stdout, results


def progress_lines(stdout, host):
    return [m for m in LINE.finditer(stdout) if m.group("host") == host]


def test_two_hosts_each_print_progress_and_end_with_the_result_of_one_long_call(tmp_path, playbook, start_sim):
    sims = {"sim-a": start_sim(), "sim-b": start_sim()}
    rc, stdout, results = playbook(sims, WAIT_TASK, "-e", "modelwake_progress_interval=2")
    assert rc == 0, stdout
    assert SECRET not in stdout
    for host in sims:
        lines = progress_lines(stdout, host)
        assert len(lines) >= 2, stdout
        # A line every interval (2 s here) plus a read's round trip, not at the end only.
        elapsed = [int(m.group("elapsed").rstrip("s")) for m in lines]
        # (Bounds sized for a 2-core CI box that runs other tests' engines at the same time.)
        assert elapsed == sorted(elapsed) and max(b - a for a, b in zip(elapsed, elapsed[1:])) <= 10, stdout
        phases = [m.group("phase") for m in lines]
        assert set(phases) <= {"starting", "loading", "initializing"}, phases
        assert "loading" in phases or "initializing" in phases
        assert any("read " in m.group("rest") and "/ 64.0 MiB (" in m.group("rest") for m in lines), stdout
        assert any("GPU x2 " in m.group("rest") for m in lines), stdout
        assert any("| log: " in m.group("rest") for m in lines), stdout
        result = results[host]
        assert result["phase"] == "ready" and result["failed"] is False
        assert [p["phase"] for p in result["phases"]][-3:] == ["loading", "initializing", "ready"], result
        assert result["pid"] == sims[host].pid
        # One long wait's timeline: elapsed from the true start, more than any one interval.
        assert result["elapsed"] >= 6 and result["phases"][-1]["start"] >= 6
        assert "_follow" not in json.dumps(result)
        # The last line is in the result too, for callbacks that print only results.
        assert result["progress"].startswith("ready ") and "GPU x2 " in result["progress"]
        looks = [json.loads(line) for line in (tmp_path / ("%s.progress.jsonl" % host)).read_text().splitlines()]
        times = [look["snapshot"]["t"] for look in looks]
        # progress_path: one line per look, none repeated, and no gap longer than a poll (1 s) plus
        # a look on a busy 2-core machine.
        assert times == sorted(set(times)) and times[0] < 1
        # The same clock as the result's, whose zero is the first look: its phases start at t - t[0].
        assert round(times[-1] - times[0], 1) == result["phases"][-1]["start"]
        assert max(b - a for a, b in zip(times, times[1:])) < 8
        assert looks[-1]["verdict"]["phase"] == "ready"

    # The same wait in one call (no progress lines): the same keys, of the same types.
    single = {"sim-c": start_sim()}
    rc, stdout, plain = playbook(single, WAIT_TASK, "-e", "modelwake_progress_interval=0")
    assert rc == 0, stdout
    assert progress_lines(stdout, "sim-c") == []
    followed, plain_result = dict(results["sim-a"]), plain["sim-c"]
    assert "progress" not in plain_result and followed.pop("progress")
    # What the wait cost the host, in the followed wait's result only.
    cost = followed.pop("cost")
    assert cost["looks"] == len((tmp_path / "sim-a.progress.jsonl").read_text().splitlines())
    assert 0 < cost["startup_cpu_s"] < 5 and 0 < cost["looks_cpu_s"] < 30 and cost["gpu_read_cpu_s"] <= cost["looks_cpu_s"]
    assert sorted(followed) == sorted(plain_result)
    assert dict((k, type(v)) for k, v in followed.items()) == dict((k, type(v)) for k, v in plain_result.items())
    # The same phases, but for a leading "starting": whether the first look came before the engine
    # began to load depends on how fast ansible-playbook started on the machine, not on the wait.
    def phases_from_loading(result):
        phases = [p["phase"] for p in result["phases"]]
        return phases[1:] if phases[:1] == ["starting"] else phases
    assert phases_from_loading(followed) == phases_from_loading(plain_result) == ["loading", "initializing", "ready"]


FLEET_LINE = re.compile(r"^wait_for_model_ready: (.*)$", re.MULTILINE)
OOM_LOG = ("[2026-05-25 19:06:14 TP0] Load weight begin. avail mem=85 GB\nTraceback (most recent call last):\n"
           '  File "/opt/sglang/model_runner.py", line 412, in load_model\n'
           "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n")


def test_a_fleet_gets_one_summary_line_per_interval_and_a_line_per_host_verdict(tmp_path, playbook, start_sim):
    """Five hosts (more than fleet.LINES_PER_HOST_UP_TO): no host's progress line, the fleet's line instead
    (written by whichever worker finds it due), and each host's line once, at its verdict. Three hosts'
    servers died before the play (a pid gone, a traceback in its log): hosts that cost this machine nothing."""
    # Loads of 16 s: still loading when the play's first looks come, even on a loaded machine.
    sims = dict(("sim-%d" % i, start_sim("--load-rate-mib", "4", "--init-seconds", "3")) for i in range(2))
    dead_pids = {}
    for i in range(3):
        log = tmp_path / ("dead-%d.log" % i)
        dead = subprocess.Popen([sys.executable, "-c", "import sys; open(sys.argv[1], 'a').write(sys.argv[2])",
                                 str(log), OOM_LOG])
        dead.wait()
        dead_pids["dead-%d" % i] = dead.pid
        sims["dead-%d" % i] = type("Gone", (), {"url": "http://127.0.0.1:9", "pid": dead.pid, "log_path": str(log)})
    rc, stdout, results = playbook(sims, WAIT_TASK, "-e", "modelwake_progress_interval=2")
    assert rc == 0, stdout
    for host in ("sim-0", "sim-1"):
        assert [m.group("phase") for m in progress_lines(stdout, host)] == ["ready"], stdout  # its verdict only
        assert results[host]["phase"] == "ready"
    for host, pid in dead_pids.items():
        said = ("wait_for_model_ready [%s]: failed: process %d had exited before the wait began: "
                "torch.OutOfMemoryError" % (host, pid))
        assert stdout.count(said) == 1 and results[host]["phase"] == "failed", stdout
    fleet_lines = FLEET_LINE.findall(stdout)
    assert len(fleet_lines) >= 2, stdout
    assert any(re.search(r"\d (loading|initializing)", line) for line in fleet_lines[:-1]), fleet_lines
    assert fleet_lines[-1].startswith("2 ready, 3 failed: dead-0 (process %d had exited before the wait began: "
                                      "torch.OutOfMemoryError" % dead_pids["dead-0"]), fleet_lines
    assert SECRET not in stdout


# The same wait as one run_once task that follows every host's (fleet_hosts); each host keeps its own result.
FLEET_TASK = WAIT_TASK.replace("""      register: wait_result
      ignore_errors: true
""", """        fleet_hosts: "{{ ansible_play_batch }}"
      run_once: true
      register: waits
""").replace("wait_result | to_nice_json", "waits.hosts[inventory_hostname] | to_nice_json")


def test_one_task_follows_every_hosts_wait_so_the_last_host_is_not_queued_behind_forks(tmp_path, playbook, start_sim):
    """forks 1 and three hosts, the last one's engine crashing 3 s into its load: a wait per host would look at
    it only once the two before it were ready (a worker each, one at a time). One run_once task with
    fleet_hosts follows the three at once, each with its own arguments, so the crash is said first."""
    # Loads of 32 s: still loading when the crash is seen, however long a loaded machine takes to start the play.
    sims = dict(("sim-%d" % i, start_sim("--load-rate-mib", "2")) for i in range(2))
    sims["sim-crash"] = start_sim("--fault", "crash1:loading", "--fault-after", "3")
    rc, stdout, results = playbook(sims, FLEET_TASK, "-e", "modelwake_progress_interval=2", ANSIBLE_FORKS="1")
    assert rc == 0, stdout  # the task itself never fails: each host's verdict is in its result
    for host in ("sim-0", "sim-1"):
        assert results[host]["phase"] == "ready" and results[host]["progress"].startswith("ready "), results[host]
    assert results["sim-crash"]["phase"] == "failed" and results["sim-crash"]["failed"] is True
    assert "CUDA error" in results["sim-crash"]["msg"] or "OutOfMemoryError" in results["sim-crash"]["msg"], results
    verdicts = re.findall(r"^wait_for_model_ready \[([\w-]+)\]: (ready|failed)\b", stdout, re.MULTILINE)
    assert verdicts[0] == ("sim-crash", "failed") and sorted(verdicts[1:]) == [("sim-0", "ready"), ("sim-1", "ready")], \
        stdout
    # Each host's wait had its own arguments: its own engine's pid.
    assert dict((h, r.get("pid")) for h, r in results.items()) == dict((h, sim.pid) for h, sim in sims.items()), results
    assert SECRET not in stdout


def test_fleet_hosts_without_run_once_is_refused_before_any_wait(tmp_path, playbook, start_sim):
    sims = {"sim-alone": start_sim()}
    rc, stdout, _results = playbook(sims, FLEET_TASK.replace("      run_once: true\n", ""))
    assert rc != 0 and "fleet_hosts needs run_once: true" in stdout, stdout
    assert not LINE.search(stdout), stdout


def test_with_the_json_callback_stdout_parses_and_the_lines_go_to_stderr(tmp_path, playbook, start_sim):
    sims = {"sim-json": start_sim()}
    rc, (stdout, stderr), results = playbook(sims, WAIT_TASK, "-e", "modelwake_progress_interval=2",
                                             ANSIBLE_STDOUT_CALLBACK="results_json",
                                             ANSIBLE_CALLBACK_PLUGINS=os.path.join(ROOT, "tests", "plugins", "callback"))
    assert rc == 0, stderr
    document = json.loads(stdout)  # the whole of stdout: not one progress line in it
    wait = document["plays"][0]["tasks"][0]["hosts"]["sim-json"]
    assert wait["phase"] == "ready" and wait["progress"].startswith("ready ")
    assert len(progress_lines(stderr, "sim-json")) >= 2, stderr
    assert SECRET not in stdout and SECRET not in stderr


def test_a_crash_keeps_its_message_and_evidence_after_progress_lines(tmp_path, playbook, start_sim):
    sims = {"sim-crash": start_sim("--fault", "crash1:initializing", "--fault-after", "3")}
    rc, stdout, results = playbook(sims, WAIT_TASK, "-e", "modelwake_progress_interval=2")
    assert len(progress_lines(stdout, "sim-crash")) >= 2, stdout
    result = results["sim-crash"]
    assert result["failed"] is True and result["phase"] == "failed"
    assert result["msg"].startswith("failed: the server logged a fatal error: ")
    assert any("RuntimeError: CUDA error: an illegal memory access was encountered" in line
               for line in result["evidence"])
    assert "fatal: [sim-crash]: FAILED!" in stdout and SECRET not in stdout


ONE_LOOK_TASKS = """
    - name: Wait in the background
      modelwake.serving.wait_for_model_ready:
        url: "{{ sim_url }}"
        pid: "{{ sim_pid }}"
        api_key: "{{ sim_api_key }}"
        timeout: 120
        poll_interval: 1
      async: 120
      poll: 1
      register: background

    - name: Look once
      modelwake.serving.wait_for_model_ready:
        url: "{{ sim_url }}"
        pid: "{{ sim_pid }}"
        api_key: "{{ sim_api_key }}"
        timeout: 0
      register: once

    - name: Look in check mode
      modelwake.serving.wait_for_model_ready:
        url: "{{ sim_url }}"
        pid: "{{ sim_pid }}"
        api_key: "{{ sim_api_key }}"
        timeout: 30
      check_mode: true
      register: checked

    - name: Keep the results for the test
      ansible.builtin.copy:
        content: "{{ {'background': background, 'once': once, 'checked': checked} | to_nice_json }}"
        dest: "{{ sim_result }}"
        mode: "0600"
"""


def test_async_timeout_zero_and_check_mode_work_as_before_without_lines(tmp_path, playbook, start_sim):
    # A load of 32 s: the background wait still waits through some of it, however long a loaded machine takes
    # to start the play (its elapsed is counted from the wait's own start).
    sims = {"sim-async": start_sim("--load-rate-mib", "2")}
    rc, stdout, results = playbook(sims, ONE_LOOK_TASKS, "-e", "modelwake_progress_interval=2")
    assert rc == 0, stdout
    assert progress_lines(stdout, "sim-async") == []  # async: one background call; timeout 0: one look
    result = results["sim-async"]
    assert result["background"]["phase"] == "ready" and result["background"]["elapsed"] >= 6
    assert result["once"]["phase"] == "ready" and result["once"]["elapsed"] <= 2  # one look: a completion
    assert result["checked"]["phase"] == "ready"
    assert SECRET not in stdout


def test_the_short_name_from_the_checkout_behaves_as_the_fqcn(tmp_path, playbook, start_sim):
    """`wait_for_model_ready:` (the design card's name, found in library/) runs the same action plugin:
    progress lines while it waits, the same result, and the same refusal of bad input."""
    short_task = WAIT_TASK.replace("modelwake.serving.wait_for_model_ready:", "wait_for_model_ready:")
    assert short_task != WAIT_TASK
    sims = {"sim-short": start_sim()}
    rc, stdout, results = playbook(sims, short_task, "-e", "modelwake_progress_interval=2")
    assert rc == 0, stdout
    assert len(progress_lines(stdout, "sim-short")) >= 2, stdout
    result = results["sim-short"]
    assert result["phase"] == "ready" and result["progress"].startswith("ready ")
    assert SECRET not in stdout

    refusals = {}
    for name in ("wait_for_model_ready", "modelwake.serving.wait_for_model_ready"):
        bad = short_task.replace("wait_for_model_ready:", name + ":", 1).replace("poll_interval: 1", "poll_interval: -1")
        rc, stdout, results = playbook({"sim-bad": sims["sim-short"]}, bad)
        refusal = results["sim-bad"]
        assert refusal["failed"] is True and "poll_interval" in refusal["msg"], stdout
        refusals[name] = refusal
    short, fqcn = refusals.values()
    assert sorted(short) == sorted(fqcn) and short["msg"] == fqcn["msg"] and short["elapsed"] == fqcn["elapsed"] == 0
