"""runtime: docker on a real systemd guest: deploy-k26.yml deploys the simulated engine in a Docker container of
an image built from the test hosts' own root filesystem (tools/guest_runtime.py; built once, cached, and
loaded by inference_env from its `docker save` archive as on an air-gapped host), Docker from Debian's packages.

The unit is the venv's notify unit with `docker run` as the launcher's engine. The container is containerd's
shim's, outside the unit's cgroup: the launcher finds it by its name (its init's host PID and cgroup) and
systemd says activating with the launcher's STATUS= until a completion answers; a re-run changes nothing and
keeps the same container; an image upgrade whose engine fails is rolled back to the previous image ID; a GPU
holder in a container started by hand is named by its container beside its host PID, and refused; an engine
that crashes in the container ends the deploy failed with its own error; no stop leaves a container behind;
a deploy while dockerd is down is refused before any change.
The guest is destroyed afterwards, also when a test fails.
"""
import json
import os
import re
import shutil
import time

import pytest

from tests.helpers.container_guest import FAST, OOM, ContainerGuest, play
from tests.helpers.docker_guest import broken_image, sim_image
from tests.helpers.guesthost import host_tool, verdict_msg
from tools.guest_runtime import install_docker

VM = ContainerGuest("mwd-%d" % (os.getpid() % 100000), "dock", "sglang-dock", "docker", port=30012)
GUEST, UNIT, CONTAINER = VM.name, VM.unit, VM.container
on_guest, show, recap = VM.sh, VM.show, VM.recap
container_id, containers = VM.container_id, VM.containers

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0 or shutil.which("systemd-nspawn") is None,
                       reason="test hosts need root and systemd-nspawn (make system-deps)"),
]


def container_engine():
    """(the container's init's host PID, the engine's: the init's child)."""
    init = on_guest("docker inspect --format '{{.State.Pid}}' %s" % CONTAINER)
    return init, on_guest("pgrep -P %s" % init)


@pytest.fixture(scope="module")
def guest(tmp_path_factory):
    yield from VM.deployed(str(tmp_path_factory.mktemp("docker")), install_docker, sim_image)


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
    # A start watched from systemd's side: activating, with the launcher's STATUS= through the load (the
    # container's reads, found by its name), then active: its port check passes only because it finds the
    # engine that listens among the container's processes.
    VM.restart_is_activating_until_a_completion()


def test_a_rerun_changes_nothing_and_keeps_the_same_container(guest):
    kept = (container_id(), show("MainPID")["MainPID"])
    rc, out = play(guest, "deploy-k26.yml")
    assert rc == 0, out[-5000:]
    assert recap(out)["changed"] == 0, out[-5000:]
    assert (container_id(), show("MainPID")["MainPID"]) == kept


def test_a_failed_image_upgrade_is_rolled_back_to_the_previous_image(guest):
    # An image derived with `docker build` (the engine's entry point replaced by one that fails at its import);
    # the unit's ExecStartPre removes the failed start's container, the old image's starts anew.
    VM.a_failed_image_upgrade_is_rolled_back(guest, broken_image)


def test_a_gpu_holder_in_a_docker_container_is_named_by_container_and_host_pid(guest):
    host_tool("install-fake-gpus", GUEST, "--count", "2")
    try:
        # A container started by hand holds GPU 1: its processes are containerd's shim's, in no unit of
        # modelwake's, and NVML lists them by host PID.
        on_guest("docker run -d --init --pull=never --name stray %s sleep 86402 >/dev/null" % guest["image_id"])
        deadline = time.monotonic() + 60
        stray_pid = ""
        while not stray_pid and time.monotonic() < deadline:
            stray_pid = on_guest("pgrep -xf 'sleep 86402'", check=False)
            time.sleep(0.3)
        assert stray_pid, "the container's sleep did not start"
        stray_id = on_guest("docker container inspect --format '{{.Id}}' stray")
        VM.hold_gpu(stray_pid, 1, "stray")
        rc, out = play(guest, "deploy-k26.yml")
        flat = " ".join(out.split())
        # Refused before any change, naming the container by its name and short ID beside the host PID.
        assert rc == 2, flat[-5000:]
        assert "PIDs %s in container stray (%s):" % (stray_pid, stray_id[:12]) in flat, flat[-5000:]
        assert re.search(r"%s root \S+ foreign 1:30000 \[container stray \(%s\)\] sleep 86402"
                         % (stray_pid, stray_id[:12]), flat), flat[-5000:]
        assert on_guest("docker ps --format '{{.Names}}' --filter name=stray") == "stray"
    finally:
        on_guest("docker rm --force stray >/dev/null; rm -rf /usr/local/bin/nvidia-smi /run/modelwake-fake-gpu",
                 check=False)


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


def test_a_deploy_while_dockerd_is_down_is_refused_before_any_change(guest):
    # Last in this file: stopping dockerd stops every container, and no case after it needs one.
    on_guest("systemctl stop docker.socket docker")
    try:
        rc, out = play(guest, "deploy-k26.yml")
    finally:
        on_guest("systemctl start docker")
    flat = " ".join(out.split())
    assert rc != 0 and VM.recap(out)["changed"] == 0, flat[-3000:]
    assert ("`/usr/bin/docker info` did not answer on %s: Docker's daemon is not running or its socket is not reachable; "
            "nothing was changed. Start it: `systemctl enable --now docker`" % GUEST) in flat, flat[-3000:]
    # Refused at model_service's preflight: before gpu_preflight and inference_env ran at all.
    assert "TASK [gpu_preflight" not in out and "TASK [inference_env" not in out, flat[-3000:]
