"""runtime: docker on a real systemd guest: deploy-k26.yml deploys the simulated engine in a Docker container of
an image built from the test hosts' own root filesystem (tests/helpers/docker_guest.py; built once, cached, and
loaded by inference_env from its `docker save` archive as on an air-gapped host), Docker from Debian's packages.

The unit is the venv's notify unit with `docker run` as the launcher's engine. The container is containerd's
shim's, outside the unit's cgroup: the launcher finds it by its name (its init's host PID and cgroup) and
systemd says activating with the launcher's STATUS= until a completion answers; a re-run changes nothing and
keeps the same container; an engine that crashes in the container ends the deploy failed with its own error;
no stop leaves a container behind. The guest is destroyed afterwards, also when a test fails.
"""
import json
import os
import re
import shutil
import tempfile
import time

import pytest

from modelwake_runner.cli import run_playbook
from tests.helpers.docker_guest import install_docker, sim_image
from tests.helpers.guesthost import PlayOutput, guest_sh, guest_vars, host_tool, verdict_msg

GUEST = "mwd-%d" % (os.getpid() % 100000)
UNIT = "sglang-dock"
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
    return on_guest("docker container inspect --format '{{.Id}}' %s" % CONTAINER)


def containers():
    return on_guest("docker ps --all --format '{{.Names}}'").split()


def container_engine():
    """(the container's init's host PID, the engine's: the init's child)."""
    init = on_guest("docker inspect --format '{{.State.Pid}}' %s" % CONTAINER)
    return init, on_guest("pgrep -P %s" % init)


def write_inventory(path, variables):
    with open(path, "w") as handle:
        json.dump({"all": {"children": {"model_hosts": {"hosts": {GUEST: {"ansible_host": host_tool("addr", GUEST)}}}},
                           "vars": variables}}, handle)


@pytest.fixture(scope="module")
def guest(tmp_path_factory):
    tmp = str(tmp_path_factory.mktemp("docker"))
    timings = {}
    started = time.monotonic()
    host_tool("up", GUEST)
    try:
        install_docker(GUEST)
        timings["docker"] = round(time.monotonic() - started, 1)
        inventory = os.path.join(tmp, "inventory.json")
        entry = {"engine": "sglang", "engine_package": "modelwake-sim", "engine_version": "0.1.0", "unit": UNIT,
                 "port": 30012, "model_path": "/srv/models/dock-sim", "tp": 1, "extra_args": FAST,
                 "ready_timeout": 300, "stall_timeout": 60, "runtime": "docker"}
        variables = dict(guest_vars(host_tool("key")), **{
            "modelwake_deploy_model": "dock", "modelwake_host_models": ["dock"], "modelwake_gpus_required": False,
            "modelwake_demo_model_size_mib": 64, "modelwake_demo_model_shards": 8, "model_service_poll_interval": 1,
            # Quick restarts: the crash test waits for the launcher to stop its loop (3 starts).
            "model_service_restart_sec": 2,
            # In the image: its own Python, the simulator in its site directory.
            "model_service_container_command": "{{ ['python3', '-m', 'modelwake_sim', 'serve', '--engine', "
                                               "model_service_engine] }}",
            "modelwake_models": {"dock": entry}})
        write_inventory(inventory, variables)
        guest = {"inventory": inventory, "tmp": tmp, "timings": timings}
        rc, out = play(guest, "playbooks/demo-model.yml")  # the model on the guest, the simulator's wheels here
        assert rc == 0, out[-5000:]
        mark = time.monotonic()
        archive, image_id = sim_image(GUEST)
        timings["image"] = round(time.monotonic() - mark, 1)
        entry.update(image_id=image_id, image_archive=archive)
        write_inventory(inventory, variables)
        mark = time.monotonic()
        rc, out = play(guest, "deploy-k26.yml")
        timings["first deploy"] = round(time.monotonic() - mark, 1)
        assert rc == 0, out[-5000:]
        guest.update(image_id=image_id, deploy=out)
        yield guest
    finally:
        host_tool("down", GUEST, check=False)
        print("test_docker_guest timings (s): %s, total %.0f" % (timings, time.monotonic() - started))


def test_the_container_runs_outside_the_units_cgroup_and_systemd_waits_for_a_completion(guest):
    # The image the unit runs is the pinned one, loaded from its archive.
    assert on_guest("docker container inspect --format '{{.Image}}' %s" % CONTAINER) == guest["image_id"]
    main = show("MainPID")["MainPID"]
    procs = on_guest("cat /sys/fs/cgroup/systemd%s/cgroup.procs" % show("ControlGroup")["ControlGroup"]).split()
    init, engine = container_engine()
    # The launcher and the docker client in the unit's cgroup; the container's init and the engine (its child)
    # elsewhere, in the container's own cgroup (below containerd's).
    assert main in procs and engine not in procs and init not in procs, (main, engine, init, procs)
    assert "modelwake_sim serve" in on_guest("cat /proc/%s/cmdline | tr '\\0' ' '" % engine)
    assert on_guest("grep name=systemd /proc/%s/cgroup" % engine) == on_guest("grep name=systemd /proc/%s/cgroup" % init)
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
    # The launcher's STATUS= through the load (the container's reads, found by its name) while systemd still
    # says activating.
    assert [text for active, text in seen if active == "activating" and text.startswith("loading")], said
    assert seen[-1][1].startswith("ready in "), said
    journal = on_guest("journalctl -u %s -o cat --since=-5min" % UNIT)
    # Ready only after a completion answered (the launcher's own line at READY=1): its port check passes only
    # because it finds the engine that listens among the container's processes.
    assert re.search(r"^modelwake: ready in .*a completion .* answered", journal, re.M), journal[-3000:]
    assert "held by another process" not in journal
    # The engine's own output in the unit's journal, through docker's attached stdout and the launcher's pipe.
    assert "load" in journal.lower(), journal[-3000:]
    # The restart's stop removed the old container, a new one runs.
    assert containers() == [CONTAINER] and container_id() != old_container


def test_a_rerun_changes_nothing_and_keeps_the_same_container(guest):
    kept = (container_id(), show("MainPID")["MainPID"])
    rc, out = play(guest, "deploy-k26.yml")
    assert rc == 0, out[-5000:]
    assert recap(out)["changed"] == 0, out[-5000:]
    assert (container_id(), show("MainPID")["MainPID"]) == kept


def test_a_stop_leaves_no_container_running(guest):
    assert containers() == [CONTAINER]
    init, engine = container_engine()
    on_guest("systemctl stop %s" % UNIT)
    assert show("ActiveState")["ActiveState"] in ("inactive", "failed")
    # Neither the container nor its engine (outside the unit's cgroup, so not killed with it) outlives the unit.
    assert containers() == []
    for pid in (init, engine):
        assert on_guest("test -d /proc/%s && echo alive || echo gone" % pid) == "gone"
    assert on_guest("pgrep -f 'modelwake_sim serve'", check=False) == ""


def test_a_crash_in_the_container_fails_the_deploy_with_its_cause_and_leaves_no_container(guest):
    crashing = dict(json.load(open(guest["inventory"]))["all"]["vars"]["modelwake_models"]["dock"])
    crashing["extra_args"] = FAST + ["--fault", "crash1:loading"]
    # Two starts with one cause end the loop (3 by default): each start is a new container.
    rc, out = play(guest, "deploy-k26.yml", {"modelwake_models": {"dock": crashing}, "model_service_crash_loop_starts": 2})
    message = verdict_msg(out)
    assert rc != 0 and message and message.startswith("failed"), out[-5000:]
    assert OOM in message, message
    # The launcher's crash-loop guard ends the restarts; each stop removed its container.
    deadline = time.monotonic() + 120
    while show("ActiveState")["ActiveState"] not in ("failed", "inactive") and time.monotonic() < deadline:
        time.sleep(1)
    assert show("ActiveState")["ActiveState"] in ("failed", "inactive")
    assert containers() == []
