"""host/container_engine.py's DockerContainer: under `docker run` the engine is containerd's shim's, outside
the launcher's tree and cgroup; it is found from the container's init (`docker inspect`'s State.Pid) and
that process's cgroup (moby#35647)."""

from ansible_collections.modelwake.serving.plugins.module_utils.host import container_engine, procfs
from ansible_collections.modelwake.serving.plugins.module_utils.launcher.cli import build_launch_config, parse_args
from ansible_collections.modelwake.serving.plugins.module_utils.readiness.probe import HostProbe
from tests.helpers.fakes import ScriptedRun

LAUNCHER, CLIENT, SHIM, INIT, ENGINE, RANK, OTHER_INIT = 100, 200, 300, 301, 302, 303, 400
NAME = "modelwake-sglang-dock"
UNIT_CGROUP = "system.slice/sglang-dock.service"
CONTAINER_CGROUP = "system.slice/containerd.service/c0ffee"


def write_process(proc, pid, ppid, cgroup, starttime=777):
    directory = proc / str(pid)
    directory.mkdir(parents=True)
    (directory / "stat").write_text("%d (python3) S %d %d %d 0 -1 0 0 0 0 0 10 5 0 0 20 0 1 0 %d 0 0\n"
                                    % (pid, ppid, pid, pid, starttime))
    # A hybrid host's lines: the v1 name=systemd path is the container's own.
    (directory / "cgroup").write_text("1:cpu:/\n9:name=systemd:/%s\n0::/%s\n" % (cgroup, cgroup))


def host(tmp_path):
    """The unit's cgroup holds the launcher and the docker client; containerd's shim, the container's init
    (docker-init), the engine and a rank are elsewhere, the last three in the container's cgroup."""
    proc, cgroups = tmp_path / "proc", tmp_path / "cgroup"
    write_process(proc, LAUNCHER, 1, UNIT_CGROUP)
    write_process(proc, CLIENT, LAUNCHER, UNIT_CGROUP)
    write_process(proc, SHIM, 1, "system.slice/containerd.service")
    for pid, ppid in ((INIT, SHIM), (ENGINE, INIT), (RANK, ENGINE)):
        write_process(proc, pid, ppid, CONTAINER_CGROUP)
    container = cgroups / "systemd" / CONTAINER_CGROUP
    container.mkdir(parents=True)
    (container / "cgroup.procs").write_text("%d\n%d\n%d\n" % (INIT, ENGINE, RANK))
    return str(proc), str(cgroups)


def test_the_engine_is_the_containers_cgroup_found_from_its_init(tmp_path):
    proc, cgroups = host(tmp_path)
    docker = ScriptedRun((0, "%d\n" % INIT))
    container = container_engine.DockerContainer(NAME, run=docker)
    roots = container.engine_roots(CLIENT, proc, cgroups)
    assert roots == [CLIENT, INIT, ENGINE, RANK]
    assert docker.commands == [["docker", "inspect", "--type", "container", "--format", "{{.State.Pid}}", NAME]]
    # Below the client alone the wait would see nothing of the engine; the shim is not counted.
    assert sorted(procfs.tree([CLIENT], proc)) == [CLIENT]
    assert sorted(procfs.tree(roots, proc)) == [CLIENT, INIT, ENGINE, RANK]


def test_the_init_is_asked_once_and_again_only_when_it_is_gone(tmp_path):
    proc, cgroups = host(tmp_path)
    docker = ScriptedRun((0, "%d\n" % INIT), (1, ""))
    container = container_engine.DockerContainer(NAME, run=docker)
    container.engine_roots(CLIENT, proc, cgroups)
    assert container.engine_roots(CLIENT, proc, cgroups) == [CLIENT, INIT, ENGINE, RANK]
    assert len(docker.commands) == 1
    # The container ended (its init's PID reused by another process): asked again; none now.
    (tmp_path / "proc" / str(INIT) / "stat").write_text(
        "%d (bash) S 1 %d %d 0 -1 0 0 0 0 0 10 5 0 0 20 0 1 0 999 0 0\n" % (INIT, INIT, INIT))
    assert container.engine_roots(CLIENT, proc, cgroups) == [CLIENT]
    assert len(docker.commands) == 2


def test_a_container_not_running_yet_leaves_the_client_alone(tmp_path):
    proc, cgroups = host(tmp_path)
    # Created, not started: State.Pid 0; no such container: inspect fails; no docker at all: OSError.
    for answer in ((0, "0\n"), (1, "")):
        container = container_engine.DockerContainer(NAME, run=ScriptedRun(answer))
        assert container.engine_roots(CLIENT, proc, cgroups) == [CLIENT]

    def missing(*_args, **_kwargs):
        raise FileNotFoundError("docker")
    assert container_engine.DockerContainer(NAME, run=missing).engine_roots(CLIENT, proc, cgroups) == [CLIENT]


def test_without_its_cgroup_the_init_and_its_descendants_are_the_engine(tmp_path):
    proc, cgroups = host(tmp_path)
    (tmp_path / "cgroup" / "systemd" / CONTAINER_CGROUP / "cgroup.procs").unlink()
    (tmp_path / "cgroup" / "systemd" / CONTAINER_CGROUP).rmdir()
    roots = container_engine.DockerContainer(NAME, run=ScriptedRun((0, "%d\n" % INIT))).engine_roots(CLIENT, proc, cgroups)
    assert roots == [CLIENT, INIT]
    assert sorted(procfs.tree(roots, proc)) == [CLIENT, INIT, ENGINE, RANK]


def test_the_launchers_option_makes_the_probe_look_in_the_container(tmp_path, monkeypatch):
    proc, cgroups = host(tmp_path)
    argv = ["--url", "http://127.0.0.1:30011", "--engine", "sglang", "--no-start-history", "--", "docker", "run"]
    assert build_launch_config(parse_args(argv), {}).engine_container is None
    config = build_launch_config(parse_args(["--engine-container", NAME] + argv), {}).for_started_server(CLIENT)
    assert config.engine_container == NAME and not config.engine_in_cgroup
    probe = HostProbe(config, proc_root=proc)
    assert probe.docker_container.name == NAME
    real = probe.docker_container.engine_roots
    monkeypatch.setattr(probe.docker_container, "run", ScriptedRun((0, "%d\n" % INIT)))
    monkeypatch.setattr(probe.docker_container, "engine_roots",
                        lambda pid, proc_root: real(pid, proc_root, cgroups))
    probe.root_start = procfs.read_process(CLIENT, proc)["starttime"]
    root, processes, launcher = probe._processes(None)
    assert (root, sorted(processes), launcher) == (CLIENT, [CLIENT, INIT, ENGINE, RANK], {})


def test_a_wait_on_the_unit_finds_the_container_its_launcher_names(tmp_path, monkeypatch):
    # wait_for_model_ready on the unit (the deploy's handler) is not the launcher: the launcher's command line
    # names the container, and its processes join the unit's (client and launcher) as the server's.
    proc, cgroups = host(tmp_path)
    launch = "/opt/venv/bin/python /opt/modelwake/lib/modelwake-launch --engine-container %s --py-spy x -- docker run" % NAME
    (tmp_path / "proc" / str(LAUNCHER) / "cmdline").write_text(launch.replace(" ", "\0"))
    (tmp_path / "proc" / str(LAUNCHER) / "stat").write_text(
        "%d (python3) S 1 %d %d 0 -1 0 0 0 0 0 10 5 0 0 20 0 1 0 777 0 0\n" % (LAUNCHER, LAUNCHER, LAUNCHER))
    (tmp_path / "proc" / str(CLIENT) / "stat").write_text(
        "%d (docker) S %d %d %d 0 -1 0 0 0 0 0 10 5 0 0 20 0 1 0 777 0 0\n" % (CLIENT, LAUNCHER, CLIENT, CLIENT))
    unit_dir = tmp_path / "cgroup" / "systemd" / UNIT_CGROUP
    unit_dir.mkdir(parents=True)
    (unit_dir / "cgroup.procs").write_text("%d\n%d\n" % (LAUNCHER, CLIENT))
    config = build_launch_config(parse_args(["--url", "http://127.0.0.1:30011", "--engine", "sglang",
                                             "--no-start-history", "--", "docker", "run"]), {})
    config.unit = "sglang-dock.service"
    probe = HostProbe.__new__(HostProbe)
    probe.config, probe.proc_root, probe.docker_container = config, proc, None
    docker = ScriptedRun((0, "%d\n" % INIT))
    real_container, real_cgroup_pids = container_engine.DockerContainer, procfs.cgroup_pids
    monkeypatch.setattr(container_engine, "DockerContainer", lambda name: real_container(name, run=docker))

    def fake_host_cgroup_pids(control_group, main_pid, proc_root, cgroup_root=None):
        return real_cgroup_pids(control_group, main_pid, proc_root, cgroups)
    monkeypatch.setattr(procfs, "cgroup_pids", fake_host_cgroup_pids)
    unit = {"MainPID": LAUNCHER, "ControlGroup": "/" + UNIT_CGROUP}
    root, processes, launcher = probe._processes(unit)
    assert root == LAUNCHER and sorted(launcher) == [LAUNCHER]
    assert sorted(processes) == [CLIENT, INIT, ENGINE, RANK]
    assert probe.docker_container.name == NAME and docker.commands[0][-1] == NAME


def test_a_launchers_command_line_names_its_container_before_the_engines_command():
    assert container_engine.launcher_container("python modelwake-launch --engine-container c1 -- docker run") == "c1"
    assert container_engine.launcher_container("python modelwake-launch --engine-container=c2 -- x") == "c2"
    # After `--` the words are the engine's, never the launcher's options.
    assert container_engine.launcher_container("python modelwake-launch -- docker run --engine-container c3") is None
    assert container_engine.launcher_container("python modelwake-launch --engine-in-cgroup -- podman run") is None
