"""Who the engine runs as in its container (model_service_container_user), rendered through Ansible itself (the
rendering play of test_model_service_render): by default the service user, by its uid:gid on the host (read
there: the image's /etc/passwd does not know the host's user), for podman and docker alike; `image` keeps the
image's own user."""
import pwd

import pytest

from tests.unit.test_model_service_container_render import IMAGE_ID, exec_argv
from tests.unit.test_model_service_render import make_model, run_play

# A user every Debian host has, other than root: it stands for the service user.
SERVICE_USER = "nobody"


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("container-user")
    model = str(tmp_path / "models" / "k26")
    make_model(model)
    common = {"model_service_container_image_id": IMAGE_ID, "model_service_model_path": model,
              "model_service_engine": "sglang", "model_service_user": SERVICE_USER, "model_service_launcher": False}
    hosts = {
        "podman": dict(common, model_service_runtime="podman", model_service_unit="pod-service"),
        "docker": dict(common, model_service_runtime="docker", model_service_unit="dock-service"),
        "podmanimage": dict(common, model_service_runtime="podman", model_service_unit="pod-image",
                            model_service_container_user="image"),
        "dockerimage": dict(common, model_service_runtime="docker", model_service_unit="dock-image",
                            model_service_container_user="image"),
        # Before the user exists (a check-mode run of a new host): its names, which the image cannot resolve.
        "podmannew": dict(common, model_service_runtime="podman", model_service_unit="pod-new",
                          model_service_user="modelwake-not-created-yet"),
    }
    proc, root = run_play(tmp_path, hosts)
    assert proc.returncode == 0, proc.stdout
    return root


def run_options(root, host):
    """The `podman run` / `docker run` options before the image: who runs the engine is decided there."""
    argv = exec_argv((root / host / "unit.service").read_text())
    return argv[:argv.index(IMAGE_ID)]


@pytest.mark.parametrize("host", ["podman", "docker"])
def test_the_engine_runs_as_the_service_users_host_ids_by_default(rendered, host):
    entry = pwd.getpwnam(SERVICE_USER)
    users = [word for word in run_options(rendered, host) if word.startswith("--user")]
    # The group is the service group (root in the rendering play), by its number too.
    assert users == ["--user=%d:0" % entry.pw_uid]


@pytest.mark.parametrize("host", ["podmanimage", "dockerimage"])
def test_image_keeps_the_images_own_user(rendered, host):
    options = run_options(rendered, host)
    assert options[0] in ("/usr/bin/podman", "/usr/bin/docker")
    assert not [word for word in options if word.startswith("--user")]


def test_a_service_user_not_created_yet_is_named(rendered):
    users = [word for word in run_options(rendered, "podmannew") if word.startswith("--user")]
    assert users == ["--user=modelwake-not-created-yet:0"]


@pytest.mark.parametrize("host, cache_directory", [("podman", []), ("docker", []),
                                                    ("podmanimage", ["modelwake/pod-image"])])
def test_the_service_users_cache_directory_is_not_a_root_units_cache_directory(rendered, host, cache_directory):
    """systemd hands a CacheDirectory= to the unit's user, root for a container unit, at every start: the engine
    run as the service user could no longer write its HOME. The role makes that directory the user's instead."""
    text = (rendered / host / "unit.service").read_text()
    assert [line.split("=", 1)[1] for line in text.splitlines() if line.startswith("CacheDirectory=")] == cache_directory
