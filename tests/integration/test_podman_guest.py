"""runtime: podman on a real systemd guest: deploy-k26.yml deploys the simulated engine in a container of an
image built from the test hosts' own root filesystem (tools/guest_runtime.py; built once, cached, and
loaded by inference_env from its archive as on an air-gapped host), Podman from Debian's packages.

The unit is the venv's notify unit with `podman run` as the launcher's engine: systemd says activating with
the launcher's STATUS= (the read bytes are the container's, found in the unit's cgroup by host PID) until a
completion answers; a re-run changes nothing and keeps the same container; a pinned image the host cannot
get is refused before any change; an image upgrade whose engine
fails is rolled back to the previous image ID; GPU holders in containers are named by container beside their
host PID, stopped through their unit when it may be stopped, refused otherwise; an engine that crashes in the
container ends the deploy failed with its own error, and its stops leave no container behind; one that hangs
is stalled with the ranks' stacks, read by py-spy from the host. An image whose compressed-tensors lacks the
model's format gets a thin derived image from inference_env (found again by its labels; a failed repair leaves
nothing). The guest is destroyed afterwards, also when a test fails.
"""
import json
import os
import re
import shutil
import subprocess
import time

import pytest

from tests.helpers.container_guest import FAST, OOM, ContainerGuest, play
from tests.helpers import realwheels
from tests.helpers.guesthost import guest_sh, guest_ssh, host_tool, journal_with, verdict_msg, verdicts
from tests.helpers.podman_guest import broken_image, sim_image
from tools.guest_runtime import install_podman

VM = ContainerGuest("mwp-%d" % (os.getpid() % 100000), "pod", "sglang-pod", "podman", port=30011)
GUEST, UNIT, CONTAINER = VM.name, VM.unit, VM.container
on_guest, show, recap = VM.sh, VM.show, VM.recap
container_id, containers = VM.container_id, VM.containers
journal_cursor, journal_since = VM.journal_cursor, VM.journal_since

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0 or shutil.which("systemd-nspawn") is None,
                       reason="test hosts need root and systemd-nspawn (make system-deps)"),
]


def entry(guest):
    """The catalog entry the fixture deployed (the pinned image, the usual arguments)."""
    with open(guest["inventory"]) as handle:
        return dict(json.load(handle)["all"]["vars"]["modelwake_models"]["pod"])


@pytest.fixture(scope="module")
def guest(tmp_path_factory):
    # The guests' cgroup v1 controllers are read-only: the unit's own cgroup, no sub-cgroups.
    yield from VM.deployed(str(tmp_path_factory.mktemp("podman")), install_podman, sim_image,
                           {"model_service_container_cgroups": "disabled"})


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
    # A start watched from systemd's side: activating, with the launcher's STATUS= through the load, then
    # active. The launcher's child is podman: its port check passes only because it finds the engine that
    # listens (conmon's child, outside podman's process tree) in the unit's cgroup.
    VM.restart_is_activating_until_a_completion()


def test_a_rerun_changes_nothing_and_keeps_the_same_container(guest):
    kept = (container_id(), show("MainPID")["MainPID"])
    rc, out = play(guest, "deploy-k26.yml")
    assert rc == 0, out[-5000:]
    assert recap(out)["changed"] == 0, out[-5000:]
    assert (container_id(), show("MainPID")["MainPID"]) == kept


def test_a_pinned_image_the_host_cannot_get_is_refused_before_any_change(guest):
    # A new pin that is neither on the host nor in an archive that exists, and no name to pull it by.
    missing = "sha256:" + "5" * 64
    kept = (container_id(), show("InvocationID")["InvocationID"])
    for archive, why in (("", "the catalog names neither an image_archive to load it from nor an image to pull"),
                         (os.path.join(guest["tmp"], "no-such.tar"), "its archive %s does not exist on the controller"
                          % os.path.join(guest["tmp"], "no-such.tar"))):
        rc, out = play(guest, "deploy-k26.yml", {"modelwake_models": {"pod": dict(entry(guest), image_id=missing,
                                                                                  image_archive=archive)}})
        flat = " ".join(out.split())
        assert rc != 0 and recap(out)["changed"] == 0, flat[-3000:]
        assert "The pinned image %s is not on %s, and %s; nothing was changed." % (missing, GUEST, why) in flat, flat[-3000:]
        # Refused at model_service's preflight: before gpu_preflight and inference_env ran at all.
        assert "TASK [gpu_preflight" not in out and "TASK [inference_env" not in out, flat[-3000:]
    assert (container_id(), show("InvocationID")["InvocationID"]) == kept


def test_a_failed_image_upgrade_is_rolled_back_to_the_previous_image(guest):
    # An image derived with the engine's entry point replaced by one that fails at its import; a re-run with
    # the old pin leaves the unit on it (test above).
    VM.a_failed_image_upgrade_is_rolled_back(guest, broken_image)


def run_holder(command, marker):
    """(host PID, container ID) of `sleep <marker>` in a container `command` starts (its catatonit's child)."""
    on_guest(command)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        pid = on_guest("pgrep -xf 'sleep %s'" % marker, check=False)
        if pid:
            return pid, on_guest("podman ps --no-trunc --filter name=%s --format '{{.ID}}'" % marker_name(marker))
        time.sleep(1)
    raise AssertionError("no container ran sleep %s" % marker)


def marker_name(marker):
    return {"86401": "modelwake-sglang-pod-old", "86402": "stray"}[marker]


def hold_gpu(pid, index, name):
    """The fake nvidia-smi lists `pid` (a host PID, as NVML gives) as holding 30000 MiB of GPU `index`."""
    on_guest("echo '{\"pid\": %s, \"name\": \"python\", \"gpus\": {\"%d\": {\"memory_mib\": 30000, "
             "\"utilization\": 0}}}' > /run/modelwake-fake-gpu/holder-%s.json" % (pid, index, name))


def test_gpu_holders_in_containers_are_named_and_stopped_only_through_a_modelwake_unit(guest):
    host_tool("install-fake-gpus", GUEST, "--count", "2")
    image = guest["image_id"][len("sha256:"):]
    try:
        # An older modelwake unit's container (its unit in the preflight's stop list) holds GPU 0 ...
        old_pid, old_id = run_holder(
            "systemd-run --unit=sglang-pod-old --property=Type=exec --property=TimeoutStopSec=10 /usr/bin/podman run "
            "--rm --init --pull=never --cgroups=disabled --name modelwake-sglang-pod-old %s sleep 86401" % image, "86401")
        hold_gpu(old_pid, 0, "old")
        # ... and a container started by hand holds GPU 1.
        stray_pid, stray_id = run_holder("podman run -d --init --pull=never --cgroups=disabled --name stray %s "
                                         "sleep 86402 >/dev/null" % image, "86402")
        hold_gpu(stray_pid, 1, "stray")
        stop_list = {"gpu_preflight_stop_units": ["sglang-pod-old"]}
        rc, out = play(guest, "deploy-k26.yml", stop_list)
        flat = " ".join(out.split())
        # Refused before any change, naming the stray container by name and short ID beside its host PID.
        assert rc == 2, flat[-5000:]
        assert "PIDs %s in container stray (%s):" % (stray_pid, stray_id[:12]) in flat, flat[-5000:]
        assert re.search(r"%s root \S+ foreign 1:30000 \[container stray \(%s\)\] sleep 86402"
                         % (stray_pid, stray_id[:12]), flat), flat[-5000:]
        assert on_guest("systemctl is-active sglang-pod-old") == "active"
        assert on_guest("podman ps --format '{{.Names}}' --filter name=stray") == "stray"
        on_guest("podman rm --force --time 2 stray >/dev/null; rm -f /run/modelwake-fake-gpu/holder-stray.json")
        # The modelwake unit's container is stopped through its unit; the service itself is left as it was.
        kept = container_id()
        rc, out = play(guest, "deploy-k26.yml", stop_list)
        flat = " ".join(out.split())
        assert rc == 0, flat[-5000:]
        assert "changed: [%s] => (item=sglang-pod-old.service)" % GUEST in out, flat[-5000:]
        assert re.search(r"%s root sglang-pod-old\.service stoppable 0:30000 \[container modelwake-sglang-pod-old "
                         r"\(%s\)\] sleep 86401" % (old_pid, old_id[:12]), flat), flat[-5000:]
        assert on_guest("systemctl is-active sglang-pod-old", check=False) in ("inactive", "failed")
        assert on_guest("pgrep -xf 'sleep 86401'", check=False) == ""
        assert container_id() == kept
    finally:
        # The later tests run without GPUs again.
        on_guest("systemctl stop sglang-pod-old; podman rm --force --ignore --time 0 stray modelwake-sglang-pod-old; "
                 "rm -rf /usr/local/bin/nvidia-smi /run/modelwake-fake-gpu", check=False)


def test_a_hang_in_the_container_is_stalled_with_the_ranks_stacks(guest):
    hanging = dict(entry(guest), stall_timeout=15)
    hanging["extra_args"] = FAST + ["--fault", "hang:loading", "--fault-after", "1"]
    cursor = journal_cursor()
    # Crash-loop stops off (record only): the ad hoc look below takes a start of its own.
    rc, out = play(guest, "deploy-k26.yml", {"modelwake_models": {"pod": hanging}, "model_service_crash_loop_starts": 0})
    said = [v.get("msg") or "" for v in verdicts(out) if v["phase"] in ("failed", "stalled")]
    assert rc != 0 and said and "stalled" in said[-1], out[-5000:]
    # The launcher declared the stall after stall_timeout, with where the rank is: py-spy, run from the host's
    # venv, read the container's engine by its host PID.
    stacks = r"the ranks' stacks: TP0 in hang \(modelwake_sim/ranks\.py:\d+\)"
    journal = journal_with(stacks, lambda: journal_since(cursor))
    assert re.search(r"stalled: no progress for \d+ s in phase loading", journal), journal[-4000:]
    assert re.search(stacks, journal), journal[-4000:]
    assert "stacks unavailable" not in journal, journal[-4000:]
    # The operator's own look, ad hoc, without a py-spy path: the engine runs a bare `python3` in the
    # container, and py-spy is found beside the unit's launcher (the host's venv). A start of its own (the
    # engine hangs a second into the load), judged well before the launcher's 15 s would restart it: the
    # launcher's status, whose rate falls and ETA grows at every look of a hung load, is no progress.
    # (Stopped first: no restart of the launcher's own verdict left pending to cut into it.)
    on_guest("systemctl stop %s && systemctl start --no-block %s" % (UNIT, UNIT))
    cursor = journal_cursor()
    looked = VM.look(guest, stall_timeout=5, poll_interval=1, timeout=120)
    assert looked["phase"] == "stalled", (looked["msg"], looked.get("rule"), looked.get("elapsed"),
                                          journal_since(cursor)[-3000:])
    assert re.search(r"the ranks' stacks: TP0 in hang \(modelwake_sim/ranks\.py:\d+\)", looked["msg"]), looked
    assert not looked.get("stacks_unavailable"), looked
    on_guest("systemctl stop %s" % UNIT, check=False)
    assert containers() == []


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



# The compressed-tensors repair as a thin derived image (roles/inference_env/tasks/image_repair.yml): the image
# holds the K2.6 engine's situation (torch 2.13.0 CPU and compressed-tensors 0.8.1, the cached venv of
# tests/helpers/realwheels.py copied in at one path), the model's config.json needs nvfp4-pack-quantized. No
# engine is started from it (it has none): the repair is checked on the image itself.
CT_VENV = "/opt/" + os.path.basename(realwheels.TEMPLATE_VENV)
CT_MODEL = "/srv/models/ct-nvfp4"
REPAIR_PLAY = """
- name: The inference_env role's image steps (no venv, no engine)
  hosts: model_hosts
  gather_facts: false
  tasks:
    - name: Validate and derive the compressed-tensors requirement
      ansible.builtin.include_role: {name: inference_env, tasks_from: preflight.yml}
    - name: Put the image on the host
      ansible.builtin.include_role: {name: inference_env, tasks_from: image.yml}
    - name: Repair the image
      ansible.builtin.include_role: {name: inference_env, tasks_from: image_repair.yml}
    - name: Show the image the service would run
      ansible.builtin.debug:
        msg: "service image {{ inference_env_container_image_found }}"
"""


def ct_image(base_id, timings):
    """The ID of an image made on the guest from `base_id`'s files with the torch venv at CT_VENV: imported as one
    layer from the base's mounted root and the venv (with vfs, a build's container would copy the base first)."""
    _wheels, template = realwheels.cached(timings)
    work = "/root/ct-image"
    mark = time.monotonic()
    on_guest("mkdir -p %s" % work)
    with subprocess.Popen(["tar", "-C", os.path.dirname(template), "-cf", "-", os.path.basename(template)],
                          stdout=subprocess.PIPE) as tar:
        subprocess.run(guest_ssh(GUEST, "tar -x -C %s" % work), stdin=tar.stdout, check=True, timeout=600)
    timings["push the torch venv"] = round(time.monotonic() - mark, 1)
    mark = time.monotonic()
    root = on_guest("podman image mount %s" % base_id)
    try:
        guest_sh(GUEST, "tar -cf - -C %s . -C %s --transform 's,^%s,opt/%s,' %s | podman import --quiet - "
                        "localhost/ct-old >/dev/null" % (root, work, os.path.basename(template),
                                                        os.path.basename(template), os.path.basename(template)),
                 timeout=600)
    finally:
        on_guest("podman image unmount %s >/dev/null; rm -rf %s" % (base_id, work), check=False)
    timings["make the image"] = round(time.monotonic() - mark, 1)
    return "sha256:" + on_guest("podman image inspect --format '{{.Id}}' localhost/ct-old")


def derived_images(base_id):
    return on_guest("podman images --no-trunc --quiet --filter label=io.modelwake.repair.base=%s" % base_id).split()


def test_the_compressed_tensors_repair_is_a_thin_derived_image_found_again_and_a_failed_one_leaves_nothing(
        guest, tmp_path):
    timings = guest["timings"]
    image = ct_image(guest["image_id"], timings)
    guest_sh(GUEST, "mkdir -p %s && cat > %s/config.json" % (CT_MODEL, CT_MODEL),
             stdin=json.dumps({"architectures": ["DeepseekV3ForCausalLM"], "quantization_config": realwheels.NVFP4}))
    playbook = str(tmp_path / "repair.yml")
    with open(playbook, "w") as handle:
        handle.write(REPAIR_PLAY)
    base_vars = {"inference_env_runtime": "podman", "inference_env_container_image_id": image,
                 "inference_env_container_image_archive": "", "inference_env_container_python": CT_VENV + "/bin/python",
                 # The guests' cgroup controllers are read-only.
                 "inference_env_container_run_args": ["--cgroups=disabled"],
                 "inference_env_model_path": CT_MODEL, "inference_env_engine_version": "0.1.0"}
    images_before = on_guest("podman images --all --quiet --no-trunc | sort")

    # A wheelhouse without the release: the play fails with pip's cause, and the host is as it was.
    lacking = realwheels.wheelhouse(str(tmp_path / "lacking"), patterns=("loguru-",))
    mark = time.monotonic()
    rc, out = play(guest, playbook, dict(base_vars, inference_env_wheelhouse=lacking,
                                         inference_env_stage_dir="/var/cache/modelwake/ct-lacking"))
    timings["failed repair"] = round(time.monotonic() - mark, 1)
    flat = " ".join(out.split())
    assert rc != 0, flat[-5000:]
    assert "the compressed-tensors repair of the image %s failed, nothing was left on the host" % image in flat, flat[-5000:]
    assert "pip install compressed-tensors>=0.10.0 failed in the image" in flat, flat[-5000:]
    assert "No matching distribution found for compressed-tensors>=0.10.0" in flat, flat[-5000:]
    assert on_guest("podman ps --all --quiet --filter name=modelwake-repair") == "" and derived_images(image) == []
    assert on_guest("podman images --all --quiet --no-trunc | sort") == images_before

    # The full wheelhouse: a derived image with 0.15.0.1, torch as it was, the base's entry point kept.
    house = realwheels.wheelhouse(str(tmp_path / "house"))
    repair_vars = dict(base_vars, inference_env_wheelhouse=house, inference_env_stage_dir="/var/cache/modelwake/ct")
    mark = time.monotonic()
    rc, out = play(guest, playbook, repair_vars)
    timings["repair"] = round(time.monotonic() - mark, 1)
    assert rc == 0, out[-5000:]
    derived = derived_images(image)
    assert len(derived) == 1 and derived[0] != image, derived
    assert "service image %s" % derived[0] in out, out[-5000:]
    assert on_guest("podman ps --all --quiet --filter name=modelwake-repair") == ""
    config = "'{{json .Config.Entrypoint}} {{json .Config.Cmd}} {{index .Config.Labels \"io.modelwake.repair.spec\"}}'"
    # (An empty entry point or command reads null or [], as the runtime writes it.)
    base_entry = on_guest("podman image inspect --format %s %s" % (config, image)).replace("null", "[]").split()
    derived_entry = on_guest("podman image inspect --format %s %s" % (config, derived[0])).replace("null", "[]").split()
    assert derived_entry == base_entry[:2] + ["compressed-tensors/minimum/0.10.0"], (base_entry, derived_entry)
    # The image itself (its files, read from the host without a container, which vfs would copy whole): the
    # release the model needs, whose CompressionFormat has the format (the repair imported it before the
    # commit), and torch as it was.
    root = on_guest("podman image mount %s" % derived[0])
    try:
        site = on_guest("ls -d %s%s/lib/python3*/site-packages" % (root, CT_VENV))
        versions = on_guest("cd %s && ls -d compressed_tensors-*.dist-info torch-*.dist-info" % site).split()
        assert versions == ["compressed_tensors-0.15.0.1.dist-info", "torch-%s+cpu.dist-info" % realwheels.TORCH], versions
        assert on_guest("grep -c 'nvfp4_pack_quantized = \"nvfp4-pack-quantized\"' %s/compressed_tensors/config/base.py"
                        % site) == "1"
    finally:
        on_guest("podman image unmount %s >/dev/null" % derived[0], check=False)

    # A re-run finds it by its labels: nothing changes, no container starts.
    mark = time.monotonic()
    rc, out = play(guest, playbook, repair_vars)
    timings["repair re-run"] = round(time.monotonic() - mark, 1)
    assert rc == 0 and recap(out)["changed"] == 0, out[-5000:]
    assert derived_images(image) == derived and "service image %s" % derived[0] in out
