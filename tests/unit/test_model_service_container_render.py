"""The model_service role's unit for the container runtimes (podman, docker), rendered through Ansible itself
(the rendering play of test_model_service_render): the launcher stays the notify unit's main process and runs
`podman run` / `docker run` as its engine, the image by its pinned ID, values never on the command line, and
every stop removes the container. Docker's container runs outside the unit's cgroup: the launcher finds it by
its name. One shape of test for both runtimes; what only one runtime does is tested for it alone."""
import os
import shlex
import subprocess

import pytest
import yaml

from tests.helpers.paths import ROOT
from tests.unit.test_model_service_render import SECRET, VENV, directive, exec_start, make_model, run_play

IMAGE_ID = "sha256:" + "29a7c7b4edaaf8a873c4fa6376889f6a3d9e3cad6a94b893360f36ec24022565"
NEW_IMAGE_ID = "sha256:" + "7" * 64

# Per runtime: the rendered hosts' names and units (the engine under the launcher, the simulator without it),
# the extra variables of the simulator's host, and the unit's stop command before the container's name.
RUNTIMES = {
    "podman": {"host": "podman", "unit": "vllm-pod", "sim_host": "podmansim", "sim_unit": "sglang-pod",
               "sim_vars": {"model_service_container_cgroups": "disabled"},
               "remove": "-/usr/bin/podman rm --force --ignore "},
    "docker": {"host": "docker", "unit": "vllm-dock", "sim_host": "dockersim", "sim_unit": "sglang-dock",
               "sim_vars": {}, "remove": "-/usr/bin/docker rm --force "},
}


# The engine's environment, by name (values from the unit's environment file, none on the command line).
ENGINE_ENV = ["--env=CUDA_DEVICE_ORDER", "--env=DG_JIT_CACHE_DIR", "--env=FLASHINFER_WORKSPACE_BASE", "--env=HOME",
              "--env=NCCL_DEBUG", "--env=PYTHONUNBUFFERED", "--env=TORCHINDUCTOR_CACHE_DIR", "--env=TRITON_CACHE_DIR",
              "--env=VLLM_API_KEY", "--env=VLLM_CACHE_ROOT", "--env=VLLM_ENGINE_READY_TIMEOUT_S",
              "--env=XDG_CACHE_HOME"]


def podman_argv(model):
    """`podman run`'s words up to the image, for the engine under the launcher."""
    return [
        "/usr/bin/podman", "run", "--rm", "--replace", "--pull=never", "--name", "modelwake-vllm-pod",
        "--label=modelwake.unit=vllm-pod.service",
        "--cgroups=split", "--sdnotify=ignore", "--init", "--network=host", "--ipc=host", "--log-driver=none",
        "--volume", "%s:%s:ro" % (model, model),
        "--volume", "/var/cache/modelwake/vllm-pod:/var/cache/modelwake/vllm-pod",
        "--workdir", "/var/cache/modelwake/vllm-pod", "--user=modelwake:0",
        *ENGINE_ENV,
        "--device=nvidia.com/gpu=2", "--device=nvidia.com/gpu=3", "--entrypoint=python3", IMAGE_ID]


def docker_argv(model):
    """`docker run`'s words up to the image, for the engine under the launcher."""
    return [
        "/usr/bin/docker", "run", "--rm", "--pull=never", "--name", "modelwake-vllm-dock",
        "--label=modelwake.unit=vllm-dock.service",
        "--init", "--network=host", "--ipc=host", "--log-driver=none",
        "--volume", "%s:%s:ro" % (model, model),
        "--volume", "/var/cache/modelwake/vllm-dock:/var/cache/modelwake/vllm-dock",
        "--workdir", "/var/cache/modelwake/vllm-dock", "--user=modelwake:0",
        *ENGINE_ENV,
        "--gpus=device=2", "--gpus=device=3", "--entrypoint=python3", IMAGE_ID]


ENGINE_ARGV = {"podman": podman_argv, "docker": docker_argv}
# How each runtime is given a GPU (none without the launcher's GPU list).
GPU_FLAG = {"podman": "--device", "docker": "--gpus"}


def exec_argv(unit_text):
    """ExecStart='s words (the template quotes only unusual ones, as a shell would read them here)."""
    return shlex.split(exec_start(unit_text)[len("ExecStart="):])


@pytest.fixture(scope="module", params=sorted(RUNTIMES))
def rendered(request, tmp_path_factory):
    runtime = request.param
    names = RUNTIMES[runtime]
    tmp_path = tmp_path_factory.mktemp("%s-render" % runtime)
    model = str(tmp_path / "models" / "k26")
    make_model(model)
    common = {"model_service_runtime": runtime, "model_service_container_image_id": IMAGE_ID,
              "model_service_model_path": model}
    hosts = {
        names["host"]: dict(common, model_service_engine="vllm", model_service_unit=names["unit"], model_service_tp=2,
                            model_service_gpus=[2, 3], model_service_env={"NCCL_DEBUG": "INFO"},
                            model_service_api_key=SECRET, model_service_launcher=True),
        names["sim_host"]: dict(common, model_service_engine="sglang", model_service_unit=names["sim_unit"],
                                model_service_container_command=["python3", "-m", "modelwake_sim", "serve",
                                                                 "--engine", "sglang"],
                                model_service_launcher=False, **names["sim_vars"]),
    }
    proc, root = run_play(tmp_path, hosts)
    assert proc.returncode == 0, proc.stdout
    return {"runtime": runtime, "proc": proc, "root": root, "model": model}


def unit(rendered, host):
    return (rendered["root"] / host / "unit.service").read_text()


def engine_unit(rendered):
    """The unit of the engine under the launcher."""
    return unit(rendered, RUNTIMES[rendered["runtime"]]["host"])


def sim_unit(rendered):
    """The unit of the simulator that systemd runs without the launcher."""
    return unit(rendered, RUNTIMES[rendered["runtime"]]["sim_host"])


def test_the_launcher_runs_the_runtime_as_its_engine_by_the_images_id(rendered):
    text = engine_unit(rendered)
    argv = exec_argv(text)
    assert argv[:2] == [VENV + "/bin/python", "/opt/modelwake/lib/modelwake-launch"]
    assert directive(text, "Type") == ["notify"]
    runtime = argv[argv.index("--") + 1:]
    model = rendered["model"]
    assert runtime[:runtime.index(IMAGE_ID) + 1] == ENGINE_ARGV[rendered["runtime"]](model)
    # The engine's processes share tensors through the host's /dev/shm, not a container's 64 MB one.
    assert "--ipc=host" in runtime[:runtime.index(IMAGE_ID)]
    # The engine's own command, from the image's Python, not the host's venv: its entry point named (not the
    # image's own ENTRYPOINT, which would come first), the rest after the image.
    engine = runtime[runtime.index(IMAGE_ID) + 1:]
    assert runtime[runtime.index(IMAGE_ID) - 1] == "--entrypoint=python3"
    assert engine[:4] == ["-m", "vllm.entrypoints.openai.api_server", "--model", model]


@pytest.mark.parametrize("rendered", ["docker"], indirect=True)
def test_the_docker_launcher_finds_the_container_by_its_name(rendered):
    argv = exec_argv(engine_unit(rendered))
    launcher = argv[:argv.index("--")]
    # The container is outside the unit's cgroup: found by its name, not in the launcher's cgroup.
    assert launcher[launcher.index("--engine-container") + 1] == "modelwake-vllm-dock"
    assert "--engine-in-cgroup" not in launcher
    assert launcher[launcher.index("--py-spy") + 1] == VENV + "/bin/py-spy"


def test_no_secret_reaches_the_unit_and_the_engine_gets_its_values_from_the_environment_file(rendered):
    names = RUNTIMES[rendered["runtime"]]
    text = engine_unit(rendered)
    assert SECRET not in text and SECRET not in rendered["proc"].stdout
    assert SECRET in (rendered["root"] / names["host"] / "etc" / ("%s.env" % names["unit"])).read_text()
    assert directive(text, "EnvironmentFile")


def test_a_container_unit_runs_as_root_and_removes_its_container_at_every_stop(rendered):
    names = RUNTIMES[rendered["runtime"]]
    for host, unit_name in ((names["host"], names["unit"]), (names["sim_host"], names["sim_unit"])):
        text = unit(rendered, host)
        assert directive(text, "User") == [] and directive(text, "Group") == []
        assert directive(text, "ExecStopPost") == [names["remove"] + "modelwake-" + unit_name]
        assert directive(text, "KillMode") == ["control-group"]


@pytest.mark.parametrize("rendered", ["podman"], indirect=True)
def test_podman_units_leave_podman_the_system_access_it_needs(rendered):
    for host in (RUNTIMES["podman"]["host"], RUNTIMES["podman"]["sim_host"]):
        text = unit(rendered, host)
        # Podman writes /var/lib/containers and /run, makes cgroups and unpacks set-uid files.
        assert directive(text, "ProtectSystem") == ["full"]
        for absent in ("ProtectControlGroups", "RestrictSUIDSGID", "NoNewPrivileges", "CapabilityBoundingSet"):
            assert directive(text, absent) == [], absent


@pytest.mark.parametrize("rendered", ["docker"], indirect=True)
def test_docker_units_remove_a_leftover_container_before_the_start(rendered):
    for host, unit_name in (("docker", "vllm-dock"), ("dockersim", "sglang-dock")):
        text = unit(rendered, host)
        # A leftover container goes before the start (docker has no --replace), the unit's at every stop.
        assert directive(text, "ExecStartPre") == ["-/usr/bin/docker rm --force modelwake-" + unit_name]
        assert "podman" not in text


def test_without_the_launcher_systemd_runs_the_runtime_itself_and_the_operators_command(rendered):
    runtime = rendered["runtime"]
    argv = exec_argv(sim_unit(rendered))
    assert argv[0] == "/usr/bin/" + runtime
    if runtime == "podman":
        assert "--cgroups=disabled" in argv
    assert "--env=CUDA_DEVICE_ORDER" not in argv and not [a for a in argv if a.startswith(GPU_FLAG[runtime])]
    assert argv[argv.index(IMAGE_ID) - 1] == "--entrypoint=python3"
    assert argv[argv.index(IMAGE_ID) + 1:][:5] == ["-m", "modelwake_sim", "serve", "--engine", "sglang"]


@pytest.mark.parametrize("runtime, tag", [("podman", "docker.io/vllm/vllm-openai:latest"),
                                          ("docker", "vllm/vllm-openai:latest")])
def test_a_container_unit_without_a_pinned_image_id_is_refused(tmp_path, runtime, tag):
    model = str(tmp_path / "m")
    make_model(model)
    proc, root = run_play(tmp_path, {"nopin": {"model_service_runtime": runtime, "model_service_model_path": model,
                                               "model_service_container_image_id": tag}})
    assert proc.returncode != 0
    assert "model_service_container_image_id, the image's ID as sha256:<64 hex digits>" in proc.stdout
    assert not (root / "nopin" / "unit.service").exists()


def test_the_image_the_unit_ran_is_kept_for_the_rollback_of_a_failed_image_upgrade(tmp_path, monkeypatch):
    """tasks/unit.yml reads the image ID the unit ran (kept on the host beside the unit) before rendering
    another: a new ID is an image upgrade the restart handler rolls back when the start fails; the rollback's
    _model_service_image_rollback_to renders the previous ID again, in the unit and the kept file."""
    import tests.unit.test_model_service_render as render
    monkeypatch.setattr(render, "PLAY", render.PLAY.replace(
        "    - name: Stop before the handlers", "    - name: Show the upgrade\n      ansible.builtin.debug:\n"
        "        msg: \"upgrade {{ _model_service_image_upgrade.before }} -> {{ _model_service_image_upgrade.after }}"
        " changed={{ _model_service_image_upgrade.changed | bool }}\"\n"
        "    - name: Stop before the handlers"))
    model = str(tmp_path / "models" / "k26")
    make_model(model)
    kept = tmp_path / "sglang-pod.image"
    host = {"model_service_runtime": "podman", "model_service_engine": "sglang", "model_service_unit": "sglang-pod",
            "model_service_model_path": model, "model_service_container_cgroups": "disabled"}
    runs = []
    for number, (image_id, extra) in enumerate([(IMAGE_ID, {}), (NEW_IMAGE_ID, {}),
                                                (NEW_IMAGE_ID, {"_model_service_image_rollback_to": IMAGE_ID})]):
        work = tmp_path / ("run%d" % number)
        work.mkdir()
        proc, root = run_play(work, {"pod": dict(host, model_service_container_image_id=image_id)},
                              extra=dict(extra, _model_service_image_file=str(kept)))
        assert proc.returncode == 0, proc.stdout
        runs.append((" ".join(proc.stdout.split()), (root / "pod" / "unit.service").read_text(), kept.read_text().strip()))
    # A first deploy: nothing to go back to.
    assert "upgrade -> %s changed=False" % IMAGE_ID in runs[0][0], runs[0][0]
    assert runs[0][2] == IMAGE_ID and IMAGE_ID in exec_argv(runs[0][1])
    # A new image: the previous ID is known, the restart may roll back to it.
    assert "upgrade %s -> %s changed=True" % (IMAGE_ID, NEW_IMAGE_ID) in runs[1][0], runs[1][0]
    assert runs[1][2] == NEW_IMAGE_ID and NEW_IMAGE_ID in exec_argv(runs[1][1])
    # The rollback's render: the previous image in the unit and in the kept file again.
    argv = exec_argv(runs[2][1])
    assert IMAGE_ID in argv and NEW_IMAGE_ID not in argv and runs[2][2] == IMAGE_ID


def docker_creating_wait(tmp_path, substate, container_exists, deadline="2"):
    """Run vars/main.yml's _model_service_docker_creating_wait (tasks/rollback.yml's, runtime docker) with a
    systemctl that shows the unit in `substate` and a docker whose inspect finds the container or not; its
    exit status (124: still waiting at the deadline) and the commands it ran."""
    with open(os.path.join(ROOT, "roles", "model_service", "vars", "main.yml")) as handle:
        script = yaml.safe_load(handle)["_model_service_docker_creating_wait"]
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "commands"
    for name, body in (("systemctl", "echo %s" % substate), ("docker", "exit %d" % (0 if container_exists else 1))):
        tool = bin_dir / name
        tool.write_text("#!/bin/sh\necho \"%s $*\" >> %s\n%s\n" % (name, log, body))
        tool.chmod(0o755)
    done = subprocess.run(["timeout", deadline, "/bin/sh", "-c", script, "sh", "sglang-dock.service",
                           str(bin_dir / "docker"), "modelwake-sglang-dock"],
                          env=dict(os.environ, PATH="%s:%s" % (bin_dir, os.environ["PATH"])), timeout=30, check=False)
    return done.returncode, log.read_text().splitlines()


def test_the_docker_rollback_lets_a_start_create_its_container_before_the_restart(tmp_path):
    # Between starts (systemd's restart delay) or stopped: nothing is being created, the restart goes ahead.
    for number, substate in enumerate(("auto-restart", "dead", "failed", "running")):
        work = tmp_path / str(number)
        work.mkdir()
        rc, commands = docker_creating_wait(work, substate, container_exists=False)
        assert (rc, commands) == (0, ["systemctl show --property=SubState --value sglang-dock.service"]), substate
    # Starting, and its container exists: a stop now leaves nothing to a later start.
    work = tmp_path / "created"
    work.mkdir()
    rc, commands = docker_creating_wait(work, "start", container_exists=True)
    assert rc == 0 and commands[-1] == "docker container inspect modelwake-sglang-dock", commands
    # Starting (or in ExecStartPre) without its container yet: `docker run` may be creating it, so it waits
    # (here until the deadline, when the restart goes ahead anyway).
    for substate in ("start", "start-pre"):
        work = tmp_path / substate
        work.mkdir()
        rc, commands = docker_creating_wait(work, substate, container_exists=False, deadline="1.5")
        assert rc == 124, (substate, commands)
        assert commands.count("docker container inspect modelwake-sglang-dock") >= 2, commands


@pytest.mark.parametrize("runtime", ["podman", "docker"])
def test_a_host_without_nvidia_devices_runs_the_container_without_gpus(tmp_path, runtime):
    # A CPU host, or the test hosts' scripted GPUs: no /dev/nvidiactl, so no mapping that would fail the start.
    model = str(tmp_path / "m")
    make_model(model)
    host = {"model_service_runtime": runtime, "model_service_model_path": model, "model_service_gpus": [0, 1],
            "model_service_tp": 2, "model_service_container_image_id": IMAGE_ID}
    proc, root = run_play(tmp_path, {"cpu": host}, extra={"_model_service_nvidia_ctl": str(tmp_path / "no-device")})
    assert proc.returncode == 0, proc.stdout
    argv = exec_argv((root / "cpu" / "unit.service").read_text())
    assert not [word for word in argv if word.startswith(("--device=nvidia.com/gpu=", "--gpus=device="))], argv
    # The launcher still watches the host's GPUs the model was given.
    assert argv[argv.index("--gpus") + 1] == "0,1", argv


@pytest.mark.parametrize("runtime,missing,words", [
    ("podman", {"_model_service_cdi_dirs": ["/nonexistent/cdi"]},
     "Podman maps GPUs 2, 3 into the container by CDI, and gpu has no CDI specification naming nvidia.com/gpu in "
     "/nonexistent/cdi; nothing was changed. Generate it with the NVIDIA Container Toolkit: `nvidia-ctk cdi generate "
     "--output=/etc/cdi/nvidia.yaml`"),
    ("docker", {"_model_service_nvidia_hook": "/nonexistent/nvidia-container-runtime-hook"},
     "Docker gives the container GPUs 2, 3 through the NVIDIA Container Toolkit, and "
     "/nonexistent/nvidia-container-runtime-hook is missing on gpu; nothing was changed."),
])
def test_gpus_the_host_cannot_map_into_a_container_are_refused_before_anything_is_written(tmp_path, runtime, missing,
                                                                                          words):
    model = str(tmp_path / "m")
    make_model(model)
    host = {"model_service_runtime": runtime, "model_service_model_path": model, "model_service_gpus": [2, 3],
            "model_service_tp": 2, "model_service_container_image_id": IMAGE_ID}
    proc, root = run_play(tmp_path, {"gpu": host}, extra=missing)
    assert proc.returncode != 0
    assert words in " ".join(proc.stdout.split()), proc.stdout
    assert not os.path.exists(os.path.join(str(root), "gpu"))
