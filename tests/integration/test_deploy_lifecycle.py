"""deploy-k26.yml and the operator playbooks through a model's life, on a real systemd guest.

One systemd-nspawn guest (tools/testhosts) with scripted GPUs runs the simulated K2.6 as
sglang-k26.service. The tests run the real playbooks through ansible-runner (modelwake_runner's
run_playbook) and check what the guest's systemd and the play's events say (recap, live-progress looks,
verdicts); a play killed like a dying controller is ansible-playbook itself, in its own process group,
followed by its text. The GPU preflight stops a listed unit that holds the GPUs and refuses (naming
the PID) a process of no such unit; status, stop, start again. Interrupted plays: a reboot in the
middle of the first deploy's held load (the unit, enabled before its restart, comes back by itself and
loads at boot; the re-run lets the load go when a look shows it loading, and only waits, through the
phases, without a restart), and a controller killed once the handlers begin (the next run still
restarts the service onto its new unit, from the host's state alone). The re-run after the reboot is
also the idempotence check (changed=0, the boot's start kept); an engine crashing while it loads is
test_vllm_deploy.py's (here a crashing deploy shows only the entry point's exit status and evidence).
The first deploy, the crashing one and the status looks go through the programmatic way in,
`python -m modelwake_runner` (ansible-runner), and read its JSON lines instead of Ansible's text.
The guest is destroyed afterwards, also when a test fails.
"""
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from datetime import datetime, timezone

import pytest

from modelwake_runner.cli import run_playbook
from tests.helpers import ANSIBLE_PLAYBOOK as PLAYBOOK, ROOT, VENV_BIN
from tests.helpers.guesthost import PlayOutput, guest_dir, guest_sh, guest_vars, host_tool

PYTHON = os.path.join(VENV_BIN, "python")
# Per session: two pytest sessions (a developer's and a full `make integration`) never share a guest.
GUEST = "mwl-%d" % (os.getpid() % 100000)
UNIT = "sglang-k26"
FAST = ["--disable-cuda-graph", "--load-rate-mib", "64", "--start-seconds", "1", "--init-seconds", "3",
        "--warmup-seconds", "1"]
# A second catalog entry, never deployed before its test: the first deploy of a unit.
FIRST = "sglang-first"
FIRST_PORT = 30002
# Its load pauses while HOLD exists on the guest: the reboot lands in the load and the re-run's wait
# finds it loading on any machine, fast or loaded. A paused load shows no progress: its stall_timeout
# is long enough for a boot and the re-run's first tasks.
HOLD = "/var/lib/mwl-hold-load"
HELD = FAST + ["--hold-load", HOLD]
HANDLER_WAIT = "RUNNING HANDLER [model_service : Wait for the restarted model service to be ready]"
# The catalog's API key: in the engine's root-only environment file, never in an event or output.
SECRET = "mwl-entry-secret-7f3a"
PHASE_ORDER = ["not_started", "starting", "loading", "initializing", "ready"]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0 or shutil.which("systemd-nspawn") is None,
                       reason="test hosts need root and systemd-nspawn (make system-deps)"),
]


def on_guest(command, check=True):
    return guest_sh(GUEST, command, check=check)


def unit_state(unit=UNIT):
    out = on_guest("systemctl show %s -p InvocationID -p NRestarts -p ActiveState -p SubState -p MainPID -p Job" % unit)
    return dict(line.split("=", 1) for line in out.splitlines())


def settled_state(unit, timeout=60):
    """The unit's state once its main process is the one that stays (or at the deadline).

    Up with no job queued, or started by its start job (a Type=notify start job lasts the whole load);
    never in the middle of a restart job, whose old process is about to go.
    """
    deadline = time.monotonic() + timeout
    while True:
        state = unit_state(unit)
        idle = state["Job"] == "" and state["ActiveState"] in ("active", "activating")
        starting = state["ActiveState"] == "activating" and state["SubState"] == "start" and state["MainPID"] != "0"
        if idle or starting or time.monotonic() > deadline:
            return state
        time.sleep(1)


def started_at(unit=UNIT):
    """Wall-clock start of the unit's running main process, as systemd recorded it (microseconds)."""
    out = on_guest("systemctl show %s -p ExecMainStartTimestamp --timestamp=us+utc --value" % unit)
    return datetime.strptime(out, "%a %Y-%m-%d %H:%M:%S.%f UTC").replace(tzinfo=timezone.utc).timestamp()


def engine_cmdline(unit=UNIT):
    """Command line of the engine the unit's launcher (its main process) runs."""
    pid = unit_state(unit)["MainPID"]
    out = on_guest("for c in $(cat /proc/%s/task/*/children); do tr '\\0' ' ' < /proc/$c/cmdline; echo; done" % pid)
    engines = [line for line in out.splitlines() if "modelwake_sim serve" in line]
    assert len(engines) == 1, out
    return engines[0]


class Guest(object):
    def __init__(self, tmp):
        self.tmp = tmp
        self.inventory = os.path.join(tmp, "inventory.json")

    def write_inventory(self, address, key):
        inventory = {"all": {
            "children": {"model_hosts": {"hosts": {GUEST: {"ansible_host": address}}}},
            "vars": dict(guest_vars(key), **{
                "modelwake_deploy_model": "k26",
                "modelwake_host_models": ["k26"],
                "modelwake_gpus_required": True,
                "modelwake_demo_model_size_mib": 256,
                "modelwake_demo_model_shards": 64,
                "modelwake_models": {"k26": {
                    "engine": "sglang", "engine_package": "modelwake-sim", "engine_version": "0.1.0",
                    "unit": UNIT, "port": 30001,
                    "model_path": "/srv/models/Kimi-K2.6-sim", "tp": 8, "gpus": list(range(8)),
                    "extra_args": FAST, "conflicts": ["sglang-k26-ddtree"], "api_key": SECRET,
                    "ready_timeout": 300, "stall_timeout": 60},
                    "first": {
                        "engine": "sglang", "engine_package": "modelwake-sim", "engine_version": "0.1.0",
                        "unit": FIRST, "port": FIRST_PORT,
                        "model_path": "/srv/models/Kimi-K2.6-sim", "tp": 1, "gpus": [0],
                        "extra_args": HELD, "ready_timeout": 600, "stall_timeout": 300}},
            })}}
        with open(self.inventory, "w") as handle:
            json.dump(inventory, handle)

    def argv(self, playbook, extra):
        argv = [PLAYBOOK, "-i", self.inventory, os.path.join(ROOT, playbook)]
        if extra:
            argv += ["-e", json.dumps(extra)]
        env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_NOCOLOR="1",
                   PYTHONUNBUFFERED="1")
        return argv, env

    def modelwake(self, command, extra=None):
        """Run `python -m modelwake_runner COMMAND` (ansible-runner); return (rc, its JSON objects, every
        file ansible-runner kept of the run: events and Ansible's own output, as text)."""
        artifacts = os.path.join(self.tmp, "runner-%s-%d" % (command, time.monotonic_ns()))
        argv = [PYTHON, "-m", "modelwake_runner", command, "-i", self.inventory, "--artifacts", artifacts]
        if extra:
            argv += ["-e", json.dumps(extra)]
        proc = subprocess.run(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              universal_newlines=True, timeout=900)
        assert proc.stderr == "", proc.stderr  # nothing but the JSON lines, on stdout
        objects = [json.loads(line) for line in proc.stdout.splitlines()]
        kept = []
        for directory, _dirs, files in os.walk(os.path.join(artifacts, "artifacts")):
            for name in files:
                with open(os.path.join(directory, name), errors="replace") as handle:
                    kept.append(handle.read())
        return proc.returncode, objects, "\n".join(kept)

    def play(self, playbook, extra=None, on_object=None):
        """Run a playbook through ansible-runner; return (rc, PlayOutput: the text and its events). Each
        event also goes to `on_object` as it comes."""
        private = tempfile.mkdtemp(prefix="play-", dir=self.tmp)
        objects = []

        def keep(obj):
            objects.append(obj)
            if on_object:
                on_object(obj)
        try:
            runner, _events = run_playbook(playbook, private, [self.inventory], extra, on_object=keep, timeout=900)
            return runner.rc, PlayOutput(runner.stdout.read(), objects)
        finally:
            shutil.rmtree(private, ignore_errors=True)


class Background(object):
    """A playbook run in its own process group, followed line by line, killed (by its group) at the end."""

    def __init__(self, guest, playbook, extra=None, timeout=600, env=None):
        argv, env_base = guest.argv(playbook, extra)
        env = dict(env_base, **(env or {}))
        self.proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     universal_newlines=True, start_new_session=True)
        self.lines = []
        # A deadline for the whole run: a hung play must not hang the test.
        self.watchdog = threading.Timer(timeout, self.kill)
        self.watchdog.start()

    def until(self, marker):
        """Read the play's output until a line contains marker; fail if the play ends first."""
        for line in iter(self.proc.stdout.readline, ""):
            self.lines.append(line)
            if marker in line:
                return
        raise AssertionError("the play ended before %r:\n%s" % (marker, "".join(self.lines)))

    def kill(self):
        """Kill the whole run at once, like a controller that dies (its SSH clients go with it)."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def finish(self):
        """Wait for the play's end; return (rc, output)."""
        rest = self.proc.stdout.read()
        rc = self.proc.wait()
        self.watchdog.cancel()
        self.proc.stdout.close()
        return rc, "".join(self.lines) + rest


def of_kind(objects, kind, **match):
    return [o for o in objects if o["event"] == kind and all(o.get(k) == v for k, v in match.items())]


def in_order(phases):
    """Whether the phases never go back in the order of a start."""
    ranks = [PHASE_ORDER.index(phase) for phase in phases]
    return ranks == sorted(ranks)


def recap(output):
    """The guest's counters in the play's recap event (ok, changed, failed, unreachable, ...)."""
    recaps = of_kind(output.objects, "recap")
    assert recaps and GUEST in recaps[-1]["hosts"], output[-3000:]
    return recaps[-1]["hosts"][GUEST]


@pytest.fixture(scope="module")
def guest(tmp_path_factory):
    host_tool("up", GUEST)
    try:
        host_tool("install-fake-gpus", GUEST)
        g = Guest(str(tmp_path_factory.mktemp("life")))
        g.write_inventory(host_tool("addr", GUEST), host_tool("key"))
        rc, out = g.play("playbooks/demo-model.yml")
        assert rc == 0, out
        # The first deploy through `python -m modelwake_runner`, its live progress every 2 s as structured looks.
        rc, objects, kept = g.modelwake("deploy", {"modelwake_progress_interval": 2})
        assert rc == 0, objects
        looks = of_kind(objects, "progress", host=GUEST)
        assert looks and all(look["unit"] == UNIT + ".service" and look["line"].startswith(look["phase"])
                             for look in looks), looks
        # A look every 2 s: a 4 s load may fall between two, the verdict's phases have it.
        assert in_order([look["phase"] for look in looks]) and any(look.get("bytes_read") for look in looks), looks
        # The handler's wait followed the start through its phases (a look every 5 s: the 4 s load may
        # fall between two); the role's own wait then found it ready.
        restarted, verdict = of_kind(objects, "verdict", host=GUEST)
        assert restarted["task"] == "Wait for the restarted model service to be ready", restarted
        phases = [p["phase"] for p in restarted["phases"]]
        assert len(phases) > 1 and in_order(phases) and phases[-1] == "ready", phases
        assert verdict["unit"] == UNIT + ".service" and verdict["phase"] == "ready", verdict
        assert of_kind(objects, "task_end", host=GUEST, task="Send the smoke completion", status="ok")
        counts = of_kind(objects, "recap")[0]["hosts"][GUEST]
        assert counts["failed"] == 0 and counts["unreachable"] == 0 and counts["changed"] > 0, counts
        assert objects[-1]["event"] == "end" and objects[-1]["ok"] is True, objects[-1]
        # The key went to the engine's environment file, and nowhere a pipeline or its logs see.
        assert SECRET not in json.dumps(objects) and SECRET not in kept
        assert '"2+2=" -> "4"' in kept
        yield g
    finally:
        host_tool("down", GUEST, check=False)


def test_a_restart_lost_with_the_controller_is_done_by_the_next_run(guest):
    # The controller dies once the handlers begin: Ansible forgets the notified restart. Whether the
    # kill landed before or after the handler's `systemctl restart`, the next run must leave the
    # service running the new command line, started after the unit file changed, and converge.
    changed = {"model_service_extra_args": FAST + ["--no-access-log"]}
    run = Background(guest, "deploy-k26.yml", changed)
    try:
        run.until("RUNNING HANDLER")
    finally:
        run.kill()
        killed_rc, killed_out = run.finish()
    assert killed_rc == -signal.SIGKILL, killed_out
    unit_mtime = float(on_guest("stat -c %%.9Y /etc/systemd/system/%s.service" % UNIT))
    before = settled_state(UNIT)
    restarted_before_the_kill = started_at() > unit_mtime
    print("the kill landed %s the handler's restart" % ("after" if restarted_before_the_kill else "before"))
    rc, out = guest.play("deploy-k26.yml", changed)
    assert rc == 0, out
    after = unit_state()
    if restarted_before_the_kill:
        # Nothing is owed: the re-run only waits.
        assert recap(out)["changed"] == 0, out
        assert after["InvocationID"] == before["InvocationID"]
    else:
        # The re-run found the service older than its unit file and restarted it once, through the handler.
        assert "Request the restart an interrupted run left pending, %s" % UNIT in out
        assert out.count("RUNNING HANDLER [model_service : Restart the model service]") == 1, out
        assert recap(out)["changed"] == 2, out
        assert after["InvocationID"] != before["InvocationID"]
    assert "--no-access-log" in engine_cmdline()
    assert started_at() > unit_mtime
    # (That a run changing nothing restarts nothing: the reboot test below, changed=0.)


def journal_since(since, unit=UNIT):
    """The unit's journal lines (the launcher's and the engine's) since the guest's clock read `since`."""
    return on_guest("journalctl -u %s --since @%s -o cat --no-pager" % (unit, since)).splitlines()


def test_the_prefetch_reads_a_cold_model_before_the_engine_and_a_run_that_changes_nothing_reads_nothing(guest):
    # The model's pages out of the host's page cache (written back first: a dirty page stays).
    # (coreutils: dd iflag=nocache count=0 advises the kernel to drop the whole file's cached pages.)
    on_guest("sync; for f in /srv/models/Kimi-K2.6-sim/*.safetensors; do dd if=$f iflag=nocache count=0 status=none; done")
    changed = {"model_service_extra_args": FAST + ["--no-access-log", "--warmup-seconds", "2"]}
    since = on_guest("date +%s")
    rc, out = guest.play("deploy-k26.yml", changed)
    assert rc == 0, out
    lines = journal_since(since)
    said = [line[len("modelwake: "):] for line in lines if line.startswith("modelwake: ")]
    # auto read the cold model, said why, and how it went; then the engine started.
    order = [i for i, line in enumerate(said) if line.startswith(("prefetching: ", "prefetch done: ", "engine started"))]
    assert [said[i].split(":")[0].split(" as ")[0] for i in order][-3:] == [
        "prefetching", "prefetch done", "engine started"], "\n".join(said)
    assert re.search(r"available memory holds the 25\d\.\d MiB model with a 1\.2x margin", said[order[-3]]), said
    # Its progress (bytes, rate, ETA), at least the last report's.
    assert any(re.match(r"prefetching (\S+ MiB) of \1 \(100%\), [\d.]+ GB/s, ETA ", line) for line in said), said
    assert said[order[-2]].startswith("prefetch done: 25") and said[order[-2]].endswith(
        ", 64 files: the page cache holds the model"), said
    before = unit_state()
    # The same run again changes nothing, restarts nothing, and so reads nothing.
    since = on_guest("date +%s")
    rc, out = guest.play("deploy-k26.yml", changed)
    assert rc == 0 and recap(out)["changed"] == 0, out
    assert unit_state()["InvocationID"] == before["InvocationID"]
    assert not [line for line in journal_since(since) if "prefetch" in line]
    # The group and user tasks run only where getent shows a difference: a service user taken out of a
    # GPU group (by hand, or by a rebuilt host image) is put back by the next run, which restarts nothing.
    on_guest("gpasswd -d modelwake video")
    rc, out = guest.play("deploy-k26.yml", changed)
    assert rc == 0 and recap(out)["changed"] == 1, out
    assert of_kind(out.objects, "task_end", host=GUEST, task="Create the service user", status="changed"), out
    assert of_kind(out.objects, "task_end", host=GUEST, task="Create the service group", status="skipped"), out
    assert "modelwake" in on_guest("getent group video").split(":")[3].split(",")
    assert unit_state()["InvocationID"] == before["InvocationID"]
    # (Whether a restart on a warm cache reads it again depends on what the service user can know of
    # the cache on this filesystem: test_prefetch_step.py, as the service user, and docs/operating.md.)


def test_reboot_during_the_first_deploy_comes_back_and_converges(guest):
    first = {"modelwake_deploy_model": "first"}
    # A first deploy: no unit from an earlier attempt of this test.
    on_guest("systemctl disable --now %s; rm -f /etc/systemd/system/%s.service; systemctl daemon-reload"
             % (FIRST, FIRST), check=False)
    on_guest("touch %s" % HOLD)
    run = Background(guest, "deploy-k26.yml", first)
    try:
        try:
            # The unit never ran on this guest: the handler's restart is its first start.
            run.until(HANDLER_WAIT)
            host_tool("reboot", GUEST)
        finally:
            # The controller dies with the host's reboot, at once: a play left to notice the lost host
            # would go on to its failure path (the rollback restarts the unit), another scenario. Whether
            # one of its follow reads saw the reboot first is the machine's timing, so it is not asserted.
            run.kill()
            rc, out = run.finish()
        assert rc != 0 and "Send the smoke completion" not in out, out
        # Enabled before its restart: systemd started it at boot, without Ansible.
        booted = settled_state(FIRST)
        assert booted["ActiveState"] in ("active", "activating"), booted
        assert on_guest("systemctl is-enabled %s" % FIRST) == "enabled"
        # The re-run finds it loading (held) and says so in a live-progress look; the load is let go
        # then, and the wait follows it to ready.
        loading = []

        def release_on_loading(obj):
            if obj["event"] == "progress" and obj.get("unit") == FIRST + ".service" and obj["phase"] == "loading":
                if not loading:
                    on_guest("rm -f %s" % HOLD)
                loading.append(obj)
        rc, out = guest.play("deploy-k26.yml", dict(first, modelwake_progress_interval=5),
                             on_object=release_on_loading)
        assert rc == 0, out
        assert loading, of_kind(out.objects, "progress")
        assert recap(out)["changed"] == 0, out
        # It waited for the load, without restarting what systemd started at boot.
        ready = [v for v in of_kind(out.objects, "verdict", unit=FIRST + ".service") if v["phase"] == "ready"]
        assert ready and ready[-1]["elapsed"] > 0, of_kind(out.objects, "verdict")
        phases = [phase["phase"] for phase in ready[-1]["phases"]]
        assert [p for p in phases if p not in ("not_started", "starting")][:1] == ["loading"], phases
        assert unit_state(FIRST)["InvocationID"] == booted["InvocationID"]
    finally:
        # Later reboots must not start it again.
        on_guest("rm -f %s; systemctl disable --now %s" % (HOLD, FIRST), check=False)


def test_preflight_stops_a_listed_unit_and_refuses_a_foreign_holder(guest):
    holder_file = "/run/modelwake-fake-gpu/holder-%s.json"
    # The model's own unit stopped first, as when another deployment (ddtree) holds the GPUs: started
    # (at boot, by the reboot test above) or restarted later, its Conflicts= would stop ddtree itself.
    on_guest("systemctl stop %s" % UNIT)
    since = on_guest("date +%s")
    on_guest("systemd-run --unit=sglang-k26-ddtree --property=Type=exec python3 -c 'import time; time.sleep(86400)'")
    ddtree_pid = on_guest("systemctl show sglang-k26-ddtree -p MainPID --value")
    on_guest("echo '{\"pid\": %s, \"name\": \"python\", \"gpus\": {\"0\": {\"memory_mib\": 55000, \"utilization\": 0}}}' > %s"
             % (ddtree_pid, holder_file % "ddtree"))
    foreign_pid = on_guest("setsid nohup python3 -c 'import time; time.sleep(86400)' >/dev/null 2>&1 & echo $!")
    try:
        on_guest("echo '{\"pid\": %s, \"name\": \"python\", \"gpus\": {\"1\": {\"memory_mib\": 30000, \"utilization\": 0}}}' > %s"
                 % (foreign_pid, holder_file % "foreign"))
        rc, out = guest.play("deploy-k26.yml")
        assert rc == 2, out
        flat = " ".join(out.split())
        assert "PIDs %s:" % foreign_pid in flat
        assert re.search(r"%s root (session-\d+\.scope|ssh\.service) foreign 1:30000" % foreign_pid, flat), flat
        # Nothing was touched: neither the foreign process nor the listed unit (the play stopped first).
        on_guest("kill -0 %s" % foreign_pid)
        assert on_guest("systemctl is-active sglang-k26-ddtree", check=False) == "active", on_guest(
            "journalctl --since @%s -u sglang-k26-ddtree -u %s -o short-precise --no-pager | tail -60"
            % (since, UNIT), check=False)
    finally:
        on_guest("kill %s; rm -f %s" % (foreign_pid, holder_file % "foreign"), check=False)
    rc, out = guest.play("deploy-k26.yml")
    assert rc == 0, out
    assert "changed: [%s] => (item=sglang-k26-ddtree.service)" % GUEST in out
    assert on_guest("systemctl is-active sglang-k26-ddtree", check=False) in ("inactive", "failed")
    assert unit_state()["ActiveState"] == "active"
    on_guest("rm -f %s" % (holder_file % "ddtree"))


def test_a_container_runtime_missing_on_the_host_stops_the_deploy_before_any_change(guest):
    # The running model, asked to move into a Docker container on a host without Docker.
    with open(guest.inventory) as handle:
        models = json.load(handle)["all"]["vars"]["modelwake_models"]
    models["k26"] = dict(models["k26"], runtime="docker", image_id="sha256:" + "0" * 64)
    before = unit_state()
    rc, out = guest.play("deploy-k26.yml", {"modelwake_models": models})
    assert rc == 2, out
    assert recap(out)["changed"] == 0, out
    flat = " ".join(out.split())
    assert "model_service_runtime is docker but /usr/bin/docker is missing on %s; nothing was changed." % GUEST in flat
    assert "`apt-get update && apt-get install -y docker.io tini`" in flat, flat
    # Refused at model_service's preflight: before gpu_preflight and inference_env ran at all.
    assert "TASK [gpu_preflight" not in out and "TASK [inference_env" not in out, out
    assert unit_state()["InvocationID"] == before["InvocationID"]


def test_status_stop_and_start_again(guest):
    rc, objects, _ = guest.modelwake("status")
    assert rc == 0, objects
    assert [(v["unit"], v["phase"]) for v in objects[-1]["verdicts"]] == [(UNIT + ".service", "ready")], objects[-1]
    rc, out = guest.play("playbooks/stop.yml")
    assert rc == 0, out
    assert on_guest("systemctl is-active %s" % UNIT, check=False) == "inactive"
    assert on_guest("systemctl is-enabled %s" % UNIT, check=False) == "disabled"
    # KillMode=control-group: no rank is left behind (they are titled sglang::scheduler_TP<n>).
    assert on_guest("pgrep -u modelwake", check=False) == ""
    rc, out = guest.play("playbooks/status.yml")
    assert rc == 0 and re.search(r"%s\s+sglang-k26\s+not_started\s" % GUEST, out), out
    # Through the entry point the same look is a non-zero exit: not every service is ready.
    rc, objects, _ = guest.modelwake("status")
    assert rc == 1 and [v["phase"] for v in objects[-1]["verdicts"]] == ["not_started"], objects
    # A unit that is down gets started (no handler fires: nothing changed but the enablement) and waited on.
    rc, out = guest.play("deploy-k26.yml")
    assert rc == 0, out
    assert unit_state()["ActiveState"] == "active"
    assert on_guest("systemctl is-enabled %s" % UNIT) == "enabled"


def test_a_wait_whose_guest_drops_off_the_network_looks_again_and_the_start_goes_on(guest, tmp_path):
    # The guest's link (the host's end of its veth) is taken down during the handler's wait, longer than
    # a poll: the controller's SSH finds the connection dead (keepalives every 2 s here, 15 s in ansible.cfg)
    # and says so, looks again every 2 s, and follows the same wait once the guest answers. The load is held
    # until the cut is seen, so the cut lands in the wait on any machine; then it is let go from this side
    # (the guest's root is an overlay mounted here), and the start goes on through the gap to ready.
    gap_hold = "/var/lib/mwl-hold-gap"
    hold_here = os.path.join(guest_dir(GUEST), "merged", gap_hold.lstrip("/"))
    link = "vb-" + GUEST
    on_guest("touch %s" % gap_hold)
    assert os.path.exists(hold_here)
    # The play's own SSH connections (a control path of its own), with short keepalives.
    ssh = {"ANSIBLE_SSH_ARGS": "-o ControlMaster=auto -o ControlPersist=60s -o ServerAliveInterval=2 "
                               "-o ServerAliveCountMax=2",
           "ANSIBLE_SSH_CONTROL_PATH_DIR": str(tmp_path)}
    run = Background(guest, "deploy-k26.yml", {"model_service_extra_args": FAST + ["--hold-load", gap_hold],
                                               "modelwake_progress_interval": 2}, env=ssh)
    cut = None
    try:
        run.until(HANDLER_WAIT)
        run.until("wait_for_model_ready [%s]: " % GUEST)
        restarted = unit_state()
        subprocess.run(["ip", "link", "set", link, "down"], check=True)
        cut = time.monotonic()
        run.until("wait_for_model_ready [%s]: unreachable for" % GUEST)
        os.unlink(hold_here)
        time.sleep(max(0.0, 10 - (time.monotonic() - cut)))
    finally:
        subprocess.run(["ip", "link", "set", link, "up"], check=False)
        down_for = time.monotonic() - cut if cut else 0
        on_guest("rm -f %s" % gap_hold, check=False)
        rc, out = run.finish()
    assert down_for >= 10
    # 0: the wait ended ready and the smoke completion answered (a failed wait is 2, an unreachable host 4).
    assert rc == 0, out
    assert re.search(r"wait_for_model_ready \[%s\]: answering again after \d+s\n" % re.escape(GUEST), out), out
    assert "a new one looks from now" not in out  # a 10 s gap is far inside the wait's lease
    after = unit_state()
    # The same start throughout: never restarted for the gap, nor judged on it.
    assert after["InvocationID"] == restarted["InvocationID"] and after["NRestarts"] == restarted["NRestarts"], (
        restarted, after)
    assert after["ActiveState"] == "active", after


def test_a_crashing_deploy_through_the_entry_point_ends_non_zero_with_the_evidence(guest):
    crash = {"model_service_extra_args": FAST + ["--fault", "crash1:loading", "--fault-after", "1"]}
    rc, objects, kept = guest.modelwake("deploy", crash)
    assert rc == 1, objects
    end = objects[-1]
    assert end["event"] == "end" and end["ok"] is False and end["rc"] != 0, end
    verdict = [v for v in end["verdicts"] if v["unit"] == UNIT + ".service"][0]
    assert verdict["phase"] == "failed" and "CUDA out of memory" in json.dumps(verdict["evidence"]), verdict
    assert SECRET not in json.dumps(objects) and SECRET not in kept
    # Last in this file: the guest goes with the crashing unit, no deploy to bring it back is needed.
