"""The model_service role's unit for runtime podman, rendered through Ansible itself (the rendering play of
test_model_service_render): the launcher stays the notify unit's main process and runs `podman run` as its
engine, the image by its pinned ID, values never on the command line, and the stop removes the container."""
import shlex

import pytest

from tests.unit.test_model_service_render import SECRET, VENV, directive, exec_start, make_model, run_play


def exec_argv(unit_text):
    """ExecStart='s words (the template quotes only unusual ones, as a shell would read them here)."""
    return shlex.split(exec_start(unit_text)[len("ExecStart="):])

IMAGE_ID = "sha256:" + "29a7c7b4edaaf8a873c4fa6376889f6a3d9e3cad6a94b893360f36ec24022565"


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("podman-render")
    model = str(tmp_path / "models" / "k26")
    make_model(model)
    common = {"model_service_runtime": "podman", "model_service_container_image_id": IMAGE_ID,
              "model_service_model_path": model}
    hosts = {
        "podman": dict(common, model_service_engine="vllm", model_service_unit="vllm-pod", model_service_tp=2,
                       model_service_gpus=[2, 3], model_service_env={"NCCL_DEBUG": "INFO"},
                       model_service_api_key=SECRET, model_service_launcher=True),
        "podmansim": dict(common, model_service_engine="sglang", model_service_unit="sglang-pod",
                          model_service_container_command=["python3", "-m", "modelwake_sim", "serve", "--engine", "sglang"],
                          model_service_container_cgroups="disabled", model_service_launcher=False),
    }
    proc, root = run_play(tmp_path, hosts)
    assert proc.returncode == 0, proc.stdout
    return {"proc": proc, "root": root, "model": model}


def unit(rendered, host):
    return (rendered["root"] / host / "unit.service").read_text()


def test_the_launcher_runs_podman_as_its_engine_by_the_images_id(rendered):
    text = unit(rendered, "podman")
    argv = exec_argv(text)
    assert argv[:2] == [VENV + "/bin/python", "/opt/modelwake/lib/modelwake-launch"]
    assert directive(text, "Type") == ["notify"]
    podman = argv[argv.index("--") + 1:]
    model = rendered["model"]
    assert podman[:podman.index(IMAGE_ID) + 1] == [
        "/usr/bin/podman", "run", "--rm", "--replace", "--pull=never", "--name", "modelwake-vllm-pod",
        "--cgroups=split", "--sdnotify=ignore", "--init", "--network=host", "--log-driver=none",
        "--volume", "%s:%s:ro" % (model, model),
        "--volume", "/var/cache/modelwake/vllm-pod:/var/cache/modelwake/vllm-pod",
        "--workdir", "/var/cache/modelwake/vllm-pod", "--user=modelwake:0",
        "--env=CUDA_DEVICE_ORDER", "--env=DG_JIT_CACHE_DIR", "--env=FLASHINFER_WORKSPACE_BASE", "--env=HOME",
        "--env=NCCL_DEBUG", "--env=PYTHONUNBUFFERED", "--env=TORCHINDUCTOR_CACHE_DIR", "--env=TRITON_CACHE_DIR",
        "--env=VLLM_API_KEY", "--env=VLLM_CACHE_ROOT", "--env=VLLM_ENGINE_READY_TIMEOUT_S", "--env=XDG_CACHE_HOME",
        "--device=nvidia.com/gpu=2", "--device=nvidia.com/gpu=3", IMAGE_ID]
    # The engine's own command follows the image, from the image's Python, not the host's venv.
    engine = podman[podman.index(IMAGE_ID) + 1:]
    assert engine[:5] == ["python3", "-m", "vllm.entrypoints.openai.api_server", "--model", model]


def test_no_secret_reaches_the_unit_and_the_engine_gets_its_values_from_the_environment_file(rendered):
    text = unit(rendered, "podman")
    assert SECRET not in text and SECRET not in rendered["proc"].stdout
    assert SECRET in (rendered["root"] / "podman" / "etc" / "vllm-pod.env").read_text()
    assert directive(text, "EnvironmentFile")


def test_a_container_unit_runs_as_root_and_removes_its_container_at_every_stop(rendered):
    for host, name in (("podman", "modelwake-vllm-pod"), ("podmansim", "modelwake-sglang-pod")):
        text = unit(rendered, host)
        assert directive(text, "User") == [] and directive(text, "Group") == []
        assert directive(text, "ExecStopPost") == ["-/usr/bin/podman rm --force --ignore " + name]
        assert directive(text, "KillMode") == ["control-group"]
        # Podman writes /var/lib/containers and /run, makes cgroups and unpacks set-uid files.
        assert directive(text, "ProtectSystem") == ["full"]
        for absent in ("ProtectControlGroups", "RestrictSUIDSGID", "NoNewPrivileges", "CapabilityBoundingSet"):
            assert directive(text, absent) == [], absent


def test_without_the_launcher_systemd_runs_podman_itself_and_the_operators_command(rendered):
    argv = exec_argv(unit(rendered, "podmansim"))
    assert argv[0] == "/usr/bin/podman" and "--cgroups=disabled" in argv
    assert "--env=CUDA_DEVICE_ORDER" not in argv and not [a for a in argv if a.startswith("--device")]
    assert argv[argv.index(IMAGE_ID) + 1:][:6] == ["python3", "-m", "modelwake_sim", "serve", "--engine", "sglang"]


def test_a_podman_unit_without_a_pinned_image_id_is_refused(tmp_path):
    model = str(tmp_path / "m")
    make_model(model)
    proc, root = run_play(tmp_path, {"nopin": {"model_service_runtime": "podman", "model_service_model_path": model,
                                               "model_service_container_image_id": "docker.io/vllm/vllm-openai:latest"}})
    assert proc.returncode != 0
    assert "model_service_container_image_id, the image's ID as sha256:<64 hex digits>" in proc.stdout
    assert not (root / "nopin" / "unit.service").exists()


NEW_IMAGE_ID = "sha256:" + "7" * 64


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
