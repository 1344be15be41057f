"""A launcher's engine that runs in a container: its processes leave the launcher's process tree but not
its cgroup.

`podman run` (the launcher's child) has conmon start the container: conmon forks away and is reparented
to PID 1, and the engine is conmon's child. With --cgroups=split (or disabled) both stay in the cgroup of
the unit the launcher runs in, so the engine's processes are the cgroup's processes outside the launcher's
own session (the launcher, the py-spy and nvidia-smi it runs), found by their host PIDs.

`docker run` differs: the container is containerd's shim's, outside the unit's cgroup (DockerContainer).
"""
import os
import subprocess

from . import procfs


def engine_roots(engine_pid, proc_root="/proc", cgroup_root="/sys/fs/cgroup", launcher_pid=None):
    """The roots of the engine's process trees: the launcher's child and every process of the launcher's
    cgroup (and its sub-cgroups) in another session than the launcher's (launcher_pid: this process)."""
    launcher_pid = launcher_pid or os.getpid()
    me = procfs.read_process(launcher_pid, proc_root)
    if me is None:
        return [engine_pid]
    roots = [engine_pid]
    for pid in procfs.cgroup_pids(None, launcher_pid, proc_root, cgroup_root):
        info = procfs.read_process(pid, proc_root)
        if info is not None and info["session"] != me["session"] and pid not in roots:
            roots.append(pid)
    return roots


class DockerContainer(object):
    """The engine's processes in a Docker container (runtime docker): outside the launcher's cgroup and tree.

    `docker run` (the launcher's child) only asks dockerd; containerd's shim starts the container, so the
    engine is the shim's descendant in a cgroup of its own (moby#35647). The container's name is known
    (modelwake-<unit>): `docker inspect` gives its init's host PID (Docker's --init, the engine's parent),
    and that process's cgroup holds the container's processes. The PID is asked again only when that
    process is gone (a new container, or none yet), not at every look.
    """

    def __init__(self, name, docker="docker", run=subprocess.run):
        self.name = name
        self.docker = docker
        self.run = run
        self.init = None  # (host PID, its start time) of the container's init, once found

    def init_pid(self, proc_root="/proc"):
        """The container's init's host PID, or None while it has none (not started, or ended)."""
        if self.init is not None:
            info = procfs.read_process(self.init[0], proc_root)
            if info is not None and not procfs.is_gone(info) and info["starttime"] == self.init[1]:
                return self.init[0]
            self.init = None
        try:
            done = self.run([self.docker, "inspect", "--type", "container", "--format", "{{.State.Pid}}", self.name],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, universal_newlines=True, timeout=10,
                            check=False)
        except (OSError, subprocess.SubprocessError):
            return None
        text = done.stdout.strip() if done.returncode == 0 else ""
        pid = int(text) if text.isdigit() and int(text) > 0 else None  # 0: created, not running
        info = procfs.read_process(pid, proc_root) if pid else None
        if info is None or procfs.is_gone(info):
            return None
        self.init = (pid, info["starttime"])
        return pid

    def container_pids(self, proc_root="/proc", cgroup_root="/sys/fs/cgroup"):
        """The processes of the container's cgroup, or its init alone where that cgroup is not found; []
        while it has none."""
        init = self.init_pid(proc_root)
        if init is None:
            return []
        return procfs.cgroup_pids(None, init, proc_root, cgroup_root) or [init]

    def engine_roots(self, engine_pid, proc_root="/proc", cgroup_root="/sys/fs/cgroup"):
        """The roots of the engine's process trees: the launcher's child (the docker client) and the
        container's processes."""
        roots = [engine_pid]
        for pid in self.container_pids(proc_root, cgroup_root):
            if pid not in roots:
                roots.append(pid)
        return roots


def launcher_container(cmdline):
    """The Docker container a launcher's command line names (--engine-container NAME), or None: how a wait
    on the unit, outside the launcher, finds the engine the unit's cgroup does not hold."""
    options = (cmdline or "").split(" -- ", 1)[0].split()
    for index, word in enumerate(options):
        if word == "--engine-container" and index + 1 < len(options):
            return options[index + 1]
        if word.startswith("--engine-container="):
            return word.split("=", 1)[1]
    return None
