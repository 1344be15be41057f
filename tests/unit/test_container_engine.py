"""host/container_engine.py: a container's engine is found in the launcher's cgroup, outside its session.

podman run is the launcher's child; conmon, reparented to PID 1, and the engine below it are not its
descendants, but they share the unit's cgroup (Podman's --cgroups=split or disabled)."""
from ansible_collections.modelwake.serving.plugins.module_utils.host import container_engine, procfs
from ansible_collections.modelwake.serving.plugins.module_utils.launcher.cli import build_launch_config, parse_args
from ansible_collections.modelwake.serving.plugins.module_utils.readiness.probe import HostProbe

LAUNCHER, PY_SPY, PODMAN, CONMON, ENGINE, RANK, NEIGHBOUR = 100, 101, 200, 300, 301, 302, 400
UNIT_CGROUP = "system.slice/sglang-pod.service"


def write_process(proc, pid, ppid, session, cgroup):
    directory = proc / str(pid)
    directory.mkdir(parents=True)
    (directory / "stat").write_text("%d (python3) S %d %d %d 0 -1 0 0 0 0 0 10 5 0 0 20 0 1 0 777 0 0\n"
                                    % (pid, ppid, session, session))
    (directory / "cgroup").write_text("0::/%s\n" % cgroup)


def host(tmp_path):
    """A unit's cgroup (v2) holding the launcher, its py-spy, podman, conmon and the engine with a rank in a
    sub-cgroup (split); another unit's process beside it."""
    proc, cgroups = tmp_path / "proc", tmp_path / "cgroup"
    for pid, ppid, session in ((LAUNCHER, 1, LAUNCHER), (PY_SPY, LAUNCHER, LAUNCHER), (PODMAN, LAUNCHER, PODMAN),
                               (CONMON, 1, CONMON), (ENGINE, CONMON, ENGINE), (RANK, ENGINE, ENGINE)):
        write_process(proc, pid, ppid, session, UNIT_CGROUP)
    write_process(proc, NEIGHBOUR, 1, NEIGHBOUR, "system.slice/other.service")
    unit = cgroups / UNIT_CGROUP
    (unit / "libpod-payload-abc").mkdir(parents=True)
    (unit / "cgroup.procs").write_text("%d\n%d\n%d\n%d\n" % (LAUNCHER, PY_SPY, PODMAN, CONMON))
    (unit / "libpod-payload-abc" / "cgroup.procs").write_text("%d\n%d\n" % (ENGINE, RANK))
    (cgroups / "system.slice/other.service").mkdir(parents=True)
    (cgroups / "system.slice/other.service/cgroup.procs").write_text("%d\n" % NEIGHBOUR)
    return str(proc), str(cgroups)


def test_the_engine_is_the_cgroups_processes_outside_the_launchers_session(tmp_path):
    proc, cgroups = host(tmp_path)
    roots = container_engine.engine_roots(PODMAN, proc, cgroups, launcher_pid=LAUNCHER)
    assert roots == [PODMAN, CONMON, ENGINE, RANK]
    # Below podman alone the wait would see none of them: conmon is PID 1's child.
    assert sorted(procfs.tree([PODMAN], proc)) == [PODMAN]
    assert sorted(procfs.tree(roots, proc)) == [PODMAN, CONMON, ENGINE, RANK]


def test_without_the_launchers_own_record_only_its_child_is_known(tmp_path):
    proc, cgroups = host(tmp_path)
    assert container_engine.engine_roots(PODMAN, proc, cgroups, launcher_pid=999) == [PODMAN]


def test_the_launchers_option_makes_the_probe_look_in_its_cgroup(tmp_path, monkeypatch):
    proc, cgroups = host(tmp_path)
    argv = ["--url", "http://127.0.0.1:30011", "--engine", "sglang", "--no-start-history", "--", "podman", "run"]
    assert not build_launch_config(parse_args(argv), {}).engine_in_cgroup
    config = build_launch_config(parse_args(["--engine-in-cgroup"] + argv), {}).for_started_server(PODMAN)
    assert config.engine_in_cgroup
    # The probe's process discovery in that mode, on the fake host.
    looked = []
    real = container_engine.engine_roots

    def roots(engine_pid, proc_root):
        looked.append(engine_pid)
        return real(engine_pid, proc_root, cgroups, launcher_pid=LAUNCHER)
    monkeypatch.setattr(container_engine, "engine_roots", roots)
    probe = HostProbe.__new__(HostProbe)
    probe.config, probe.proc_root = config, proc
    probe.root_start = procfs.read_process(PODMAN, proc)["starttime"]
    root, processes, launcher = probe._processes(None)
    assert (root, sorted(processes), launcher, looked) == (PODMAN, [PODMAN, CONMON, ENGINE, RANK], {}, [PODMAN])
