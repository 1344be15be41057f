"""runtime: podman on a real systemd guest: deploy-k26.yml deploys the simulated engine in a container of an
image built from the test hosts' own root filesystem (tests/helpers/podman_guest.py; built once, cached, and
loaded by inference_env from its archive as on an air-gapped host), Podman from Debian's packages.

The unit is the venv's notify unit with `podman run` as the launcher's engine: systemd says activating with
the launcher's STATUS= (the read bytes are the container's, found in the unit's cgroup by host PID) until a
completion answers; a re-run changes nothing and keeps the same container; an engine that crashes in the
container ends the deploy failed with its own error, and its stops leave no container behind. The guest is
destroyed afterwards, also when a test fails.
"""
import json
import os
import re
import shutil
import tempfile
import time

import pytest

from modelwake_runner.cli import run_playbook
from tests.helpers.guesthost import PlayOutput, guest_sh, guest_vars, host_tool, verdict_msg
from tests.helpers.podman_guest import install_podman, sim_image

GUEST = "mwp-%d" % (os.getpid() % 100000)
UNIT = "sglang-pod"
CONTAINER = "modelwake-" + UNIT
# A load of a few seconds (64 MiB at 16 MiB/s), so that several looks see it.
FAST = ["--disable-cuda-graph", "--load-rate-mib", "16", "--start-seconds", "1", "--init-seconds", "2",
        "--warmup-seconds", "1"]
OOM = "torch.OutOfMemoryError: CUDA out of memory."

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0 or shutil.which("systemd-nspawn") is None,
                       reason="test hosts need root and systemd-nspawn (make system-deps)"),
]


def on_guest(command, check=True):
    return guest_sh(GUEST, command, check=check)


def show(*properties):
    out = on_guest("systemctl show %s %s" % (UNIT, " ".join("-p " + name for name in properties)))
    return dict(line.split("=", 1) for line in out.splitlines())


def play(guest, playbook, extra=None):
    private = tempfile.mkdtemp(prefix="play-", dir=guest["tmp"])
    objects = []
    runner, _events = run_playbook(playbook, private, [guest["inventory"]], extra, on_object=objects.append,
                                   timeout=900)
    return runner.rc, PlayOutput(runner.stdout.read(), objects)


def recap(output):
    recaps = [o["hosts"] for o in output.objects if o["event"] == "recap"]
    assert recaps and GUEST in recaps[-1], output[-3000:]
    return recaps[-1][GUEST]


def container_id():
    return on_guest("podman container inspect --format '{{.Id}}' %s" % CONTAINER)


def containers():
    return on_guest("podman ps --all --format '{{.Names}}'").split()


@pytest.fixture(scope="module")
def guest(tmp_path_factory):
    tmp = str(tmp_path_factory.mktemp("podman"))
    timings = {}
    started = time.monotonic()
    host_tool("up", GUEST)
    try:
        install_podman(GUEST)
        timings["podman"] = round(time.monotonic() - started, 1)
        inventory = os.path.join(tmp, "inventory.json")
        entry = {"engine": "sglang", "engine_package": "modelwake-sim", "engine_version": "0.1.0", "unit": UNIT,
                 "port": 30011, "model_path": "/srv/models/pod-sim", "tp": 1, "extra_args": FAST,
                 "ready_timeout": 300, "stall_timeout": 60, "runtime": "podman"}
        variables = dict(guest_vars(host_tool("key")), **{
            "modelwake_deploy_model": "pod", "modelwake_host_models": ["pod"], "modelwake_gpus_required": False,
            "modelwake_demo_model_size_mib": 64, "modelwake_demo_model_shards": 8, "model_service_poll_interval": 1,
            # Quick restarts: the crash test waits for the launcher to stop its loop (3 starts).
            "model_service_restart_sec": 2,
            # In the image: its own Python, the simulator in its site directory.
            "model_service_container_command": "{{ ['python3', '-m', 'modelwake_sim', 'serve', '--engine', "
                                               "model_service_engine] }}",
            # The guests' cgroup v1 controllers are read-only: the unit's own cgroup, no sub-cgroups.
            "model_service_container_cgroups": "disabled",
            "modelwake_models": {"pod": entry}})
        with open(inventory, "w") as handle:
            json.dump({"all": {"children": {"model_hosts": {"hosts": {GUEST: {"ansible_host": host_tool("addr", GUEST)}}}},
                               "vars": variables}}, handle)
        guest = {"inventory": inventory, "tmp": tmp, "timings": timings}
        rc, out = play(guest, "playbooks/demo-model.yml")  # the model on the guest, the simulator's wheels here
        assert rc == 0, out[-5000:]
        mark = time.monotonic()
        archive, image_id = sim_image(GUEST)
        timings["image"] = round(time.monotonic() - mark, 1)
        entry.update(image_id=image_id, image_archive=archive)
        with open(inventory, "w") as handle:
            json.dump({"all": {"children": {"model_hosts": {"hosts": {GUEST: {"ansible_host": host_tool("addr", GUEST)}}}},
                               "vars": variables}}, handle)
        mark = time.monotonic()
        rc, out = play(guest, "deploy-k26.yml")
        timings["first deploy"] = round(time.monotonic() - mark, 1)
        assert rc == 0, out[-5000:]
        guest.update(image_id=image_id, deploy=out)
        yield guest
    finally:
        host_tool("down", GUEST, check=False)
        print("test_podman_guest timings (s): %s, total %.0f" % (timings, time.monotonic() - started))


def test_the_container_runs_in_the_units_cgroup_and_systemd_waits_for_a_completion(guest):
    # The image the unit runs is the pinned one, loaded from its archive.
    assert on_guest("podman container inspect --format '{{.Image}}' %s" % CONTAINER) == guest["image_id"][len("sha256:"):]
    main = show("MainPID")["MainPID"]
    procs = on_guest("cat /sys/fs/cgroup/systemd%s/cgroup.procs" % show("ControlGroup")["ControlGroup"]).split()
    engine = on_guest("pgrep -f -o 'modelwake_sim serve'")
    conmon = on_guest("pgrep -o conmon")
    # The launcher, conmon and the engine (by its host PID) in the unit's cgroup.
    assert {main, conmon, engine} <= set(procs), (main, conmon, engine, procs)
    assert "modelwake-launch" in on_guest("cat /proc/%s/cmdline | tr '\\0' ' '" % main)
    # A start watched from systemd's side: activating, with the launcher's STATUS= through the load, then active.
    before = show("InvocationID")["InvocationID"]
    old_container = container_id()
    on_guest("systemctl restart --no-block %s" % UNIT)
    seen = []
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        state = show("InvocationID", "ActiveState", "SubState", "StatusText")
        if state["InvocationID"] not in ("", before):
            seen.append((state["ActiveState"], state["StatusText"]))
            if state["ActiveState"] != "activating":
                break
        time.sleep(0.3)
    said = "\n".join("%s: %s" % pair for pair in seen)
    states = [active for active, _text in seen]
    assert states[-1] == "active" and set(states[:-1]) == {"activating"}, said
    # The launcher's STATUS= through the phases of the load while systemd still says activating.
    assert [text for active, text in seen if active == "activating" and text.startswith("loading")], said
    assert seen[-1][1].startswith("ready in "), said
    journal = on_guest("journalctl -u %s -o cat --since=-5min" % UNIT)
    # Ready only after a completion answered (the launcher's own line at READY=1). The launcher's child is
    # podman: its port check passes only because it finds the engine that listens (conmon's child, outside
    # podman's process tree) in the unit's cgroup.
    assert re.search(r"^modelwake: ready in .*a completion .* answered", journal, re.M), journal[-3000:]
    assert "held by another process" not in journal
    # The engine's own output in the unit's journal, through the launcher's pipe.
    assert "Load weight end" in journal or "load" in journal.lower(), journal[-3000:]
    # The old container was removed by the stop, a new one runs.
    assert containers() == [CONTAINER] and container_id() != old_container


def test_a_rerun_changes_nothing_and_keeps_the_same_container(guest):
    kept = (container_id(), show("MainPID")["MainPID"])
    rc, out = play(guest, "deploy-k26.yml")
    assert rc == 0, out[-5000:]
    assert recap(out)["changed"] == 0, out[-5000:]
    assert (container_id(), show("MainPID")["MainPID"]) == kept


def test_a_crash_in_the_container_fails_the_deploy_with_its_cause_and_leaves_no_container(guest):
    crashing = dict(json.load(open(guest["inventory"]))["all"]["vars"]["modelwake_models"]["pod"])
    crashing["extra_args"] = FAST + ["--fault", "crash1:loading"]
    rc, out = play(guest, "deploy-k26.yml", {"modelwake_models": {"pod": crashing}})
    message = verdict_msg(out)
    assert rc != 0 and message and message.startswith("failed"), out[-5000:]
    assert OOM in message, message
    # The launcher's crash-loop guard ends the restarts; each stop removed its container.
    deadline = time.monotonic() + 120
    while show("ActiveState")["ActiveState"] not in ("failed", "inactive") and time.monotonic() < deadline:
        time.sleep(1)
    assert show("ActiveState")["ActiveState"] in ("failed", "inactive")
    assert containers() == []
