"""A launcher's engine that runs in a container: its processes leave the launcher's process tree but not
its cgroup.

`podman run` (the launcher's child) has conmon start the container: conmon forks away and is reparented
to PID 1, and the engine is conmon's child. With --cgroups=split (or disabled) both stay in the cgroup of
the unit the launcher runs in, so the engine's processes are the cgroup's processes outside the launcher's
own session (the launcher, the py-spy and nvidia-smi it runs), found by their host PIDs.
"""
import os

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
