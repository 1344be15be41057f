"""The model_service role's unit for runtime docker, rendered through Ansible itself (the rendering play of
test_model_service_render): the launcher stays the notify unit's main process and runs `docker run` as its
engine, finds the container by its name (it runs outside the unit's cgroup), and every stop removes it."""
import pytest

from tests.unit.test_model_service_podman_render import IMAGE_ID, exec_argv
from tests.unit.test_model_service_render import SECRET, VENV, directive, make_model, run_play


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("docker-render")
    model = str(tmp_path / "models" / "k26")
    make_model(model)
    common = {"model_service_runtime": "docker", "model_service_container_image_id": IMAGE_ID,
              "model_service_model_path": model}
    hosts = {
        "docker": dict(common, model_service_engine="vllm", model_service_unit="vllm-dock", model_service_tp=2,
                       model_service_gpus=[2, 3], model_service_env={"NCCL_DEBUG": "INFO"},
                       model_service_api_key=SECRET, model_service_launcher=True),
        "dockersim": dict(common, model_service_engine="sglang", model_service_unit="sglang-dock",
                          model_service_container_command=["python3", "-m", "modelwake_sim", "serve", "--engine", "sglang"],
                          model_service_launcher=False),
    }
    proc, root = run_play(tmp_path, hosts)
    assert proc.returncode == 0, proc.stdout
    return {"proc": proc, "root": root, "model": model}


def unit(rendered, host):
    return (rendered["root"] / host / "unit.service").read_text()


def test_the_launcher_runs_docker_as_its_engine_and_finds_the_container_by_its_name(rendered):
    text = unit(rendered, "docker")
    argv = exec_argv(text)
    assert argv[:2] == [VENV + "/bin/python", "/opt/modelwake/lib/modelwake-launch"]
    assert directive(text, "Type") == ["notify"]
    launcher = argv[:argv.index("--")]
    # The container is outside the unit's cgroup: found by its name, not in the launcher's cgroup.
    assert launcher[launcher.index("--engine-container") + 1] == "modelwake-vllm-dock"
    assert "--engine-in-cgroup" not in launcher
    assert launcher[launcher.index("--py-spy") + 1] == VENV + "/bin/py-spy"
    docker = argv[argv.index("--") + 1:]
    model = rendered["model"]
    assert docker[:docker.index(IMAGE_ID) + 1] == [
        "/usr/bin/docker", "run", "--rm", "--pull=never", "--name", "modelwake-vllm-dock",
        "--init", "--network=host", "--log-driver=none",
        "--volume", "%s:%s:ro" % (model, model),
        "--volume", "/var/cache/modelwake/vllm-dock:/var/cache/modelwake/vllm-dock",
        "--workdir", "/var/cache/modelwake/vllm-dock", "--user=modelwake:0",
        "--env=CUDA_DEVICE_ORDER", "--env=DG_JIT_CACHE_DIR", "--env=FLASHINFER_WORKSPACE_BASE", "--env=HOME",
        "--env=NCCL_DEBUG", "--env=PYTHONUNBUFFERED", "--env=TORCHINDUCTOR_CACHE_DIR", "--env=TRITON_CACHE_DIR",
        "--env=VLLM_API_KEY", "--env=VLLM_CACHE_ROOT", "--env=VLLM_ENGINE_READY_TIMEOUT_S", "--env=XDG_CACHE_HOME",
        "--gpus=device=2", "--gpus=device=3", IMAGE_ID]
    # The engine's own command follows the image, from the image's Python, not the host's venv.
    engine = docker[docker.index(IMAGE_ID) + 1:]
    assert engine[:5] == ["python3", "-m", "vllm.entrypoints.openai.api_server", "--model", model]


def test_no_secret_reaches_the_unit_and_the_engine_gets_its_values_from_the_environment_file(rendered):
    text = unit(rendered, "docker")
    assert SECRET not in text and SECRET not in rendered["proc"].stdout
    assert SECRET in (rendered["root"] / "docker" / "etc" / "vllm-dock.env").read_text()
    assert directive(text, "EnvironmentFile")


def test_every_start_and_stop_removes_the_container_that_outlives_the_units_cgroup(rendered):
    for host, name in (("docker", "modelwake-vllm-dock"), ("dockersim", "modelwake-sglang-dock")):
        text = unit(rendered, host)
        assert directive(text, "User") == [] and directive(text, "Group") == []
        # A leftover container goes before the start (docker has no --replace), the unit's at every stop.
        assert directive(text, "ExecStartPre") == ["-/usr/bin/docker rm --force " + name]
        assert directive(text, "ExecStopPost") == ["-/usr/bin/docker rm --force " + name]
        assert "podman" not in text
        assert directive(text, "KillMode") == ["control-group"]


def test_without_the_launcher_systemd_runs_docker_itself_and_the_operators_command(rendered):
    argv = exec_argv(unit(rendered, "dockersim"))
    assert argv[0] == "/usr/bin/docker"
    assert "--env=CUDA_DEVICE_ORDER" not in argv and not [a for a in argv if a.startswith("--gpus")]
    assert argv[argv.index(IMAGE_ID) + 1:][:6] == ["python3", "-m", "modelwake_sim", "serve", "--engine", "sglang"]


def test_a_docker_unit_without_a_pinned_image_id_is_refused(tmp_path):
    model = str(tmp_path / "m")
    make_model(model)
    proc, root = run_play(tmp_path, {"nopin": {"model_service_runtime": "docker", "model_service_model_path": model,
                                               "model_service_container_image_id": "vllm/vllm-openai:latest"}})
    assert proc.returncode != 0
    assert "model_service_container_image_id, the image's ID as sha256:<64 hex digits>" in proc.stdout
    assert not (root / "nopin" / "unit.service").exists()
