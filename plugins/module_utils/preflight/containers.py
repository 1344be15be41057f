"""Which container a GPU holder runs in, named by the container runtime (the GPU preflight).

NVML (and nvidia-smi) list a container's processes by their host PIDs, which say nothing of the
container. A holder is in a container when its cgroup path names one (Podman's `libpod-<id>` scope or
`libpod-payload-<id>` sub-cgroup, Docker's `docker-<id>.scope` with the systemd cgroup driver or
`/docker/<id>` with cgroupfs), or, where the cgroup says nothing (Podman's --cgroups=disabled keeps the
container in its caller's cgroup), when it runs in another PID namespace than the host's: the container is
then the one whose first process shares that namespace. Both runtimes present are asked (Podman's `podman
ps`, Docker's `docker ps` and `docker inspect`), for the names and first processes' host PIDs.

Only the name is added here, and the unit a modelwake unit's container was started by (its `modelwake.unit`
label, which the unit's own `podman run` / `docker run` sets): who may stop the holder is still decided by
a systemd unit alone (holders.plan), so a modelwake unit's container is stopped through its unit and any
other container is refused, named.
"""
import json
import os
import re
import subprocess

# The container ID in a cgroup path (64 hex digits).
_CGROUP_CONTAINER = re.compile(
    r"(?:^|/)(?:libpod-(?:payload-|conmon-)?|docker-|docker/)([0-9a-f]{64})(?:\.scope)?(?:/|$)")
PODMAN = "/usr/bin/podman"
DOCKER = "/usr/bin/docker"
SHORT_ID = 12
# The label model_service puts on the containers its units run: the unit's name (sglang-k26.service).
UNIT_LABEL = "modelwake.unit"


def container_id_from_cgroup(text):
    """The container ID a /proc/<pid>/cgroup text names, or None."""
    # Every hierarchy's line (cgroup v2's one, v1's name=systemd and controllers' lines alike).
    for line in text.splitlines():
        path = line.split(":", 2)[2] if line.count(":") >= 2 else ""
        match = _CGROUP_CONTAINER.search(path)
        if match:
            return match.group(1)
    return None


def pid_namespace(pid, proc_root="/proc"):
    """The PID namespace of a process ('pid:[4026531836]'), or None when it cannot be read."""
    try:
        return os.readlink(os.path.join(proc_root, str(pid), "ns", "pid"))
    except OSError:
        return None


def parse_podman_ps(text):
    """[{id, name, pid, unit}] from `podman ps --no-trunc --format json` (running containers)."""
    try:
        entries = json.loads(text or "[]") or []
    except ValueError:
        return []
    containers = []
    for entry in entries:
        names = entry.get("Names") or []
        name = names[0] if isinstance(names, list) and names else (names or None)
        containers.append({"id": entry.get("Id") or entry.get("ID") or "", "name": name,
                           "pid": int(entry.get("Pid") or 0), "unit": (entry.get("Labels") or {}).get(UNIT_LABEL)})
    return containers


def podman_containers(podman=PODMAN):
    """The running Podman containers ([{id, name, pid, unit}]); [] where Podman is absent or answers nothing."""
    if not os.access(podman, os.X_OK):
        return []
    try:
        done = subprocess.run([podman, "ps", "--no-trunc", "--format", "json"], stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, universal_newlines=True, timeout=30, check=False)
    except (OSError, subprocess.SubprocessError):
        return []
    containers = parse_podman_ps(done.stdout) if done.returncode == 0 else []
    unknown = [c["id"] for c in containers if not c["pid"] and c["id"]]
    if unknown:
        # A Podman whose `ps` leaves the PID out: its inspect says it.
        try:
            done = subprocess.run([podman, "inspect", "--type", "container", "--format", "{{.Id}} {{.State.Pid}}"]
                                  + unknown, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                  universal_newlines=True, timeout=30, check=False)
        except (OSError, subprocess.SubprocessError):
            return containers
        pids = dict(line.split() for line in done.stdout.splitlines() if len(line.split()) == 2)
        for container in containers:
            if container["id"] in pids and pids[container["id"]].isdigit():
                container["pid"] = int(pids[container["id"]])
    return containers


# The labels as JSON: `index` on a container without labels (null) fails the whole inspect ("index of untyped
# nil"), as Docker's templates work on the decoded JSON.
DOCKER_INSPECT_FORMAT = "{{.Id}} {{.State.Pid}} {{.Name}} {{json .Config.Labels}}"


def parse_docker_inspect(text):
    """[{id, name, pid, unit}] from `docker inspect --format DOCKER_INSPECT_FORMAT` (one line each; Docker's
    name has a leading '/'; the labels are JSON, `null` on a container without any)."""
    containers = []
    for line in (text or "").splitlines():
        words = line.split(" ", 3)
        if len(words) < 3 or not words[1].isdigit():
            continue
        try:
            labels = json.loads(words[3]) if len(words) == 4 else None
        except ValueError:
            labels = None
        containers.append({"id": words[0], "name": words[2].strip().lstrip("/") or None, "pid": int(words[1]),
                           "unit": labels.get(UNIT_LABEL) if isinstance(labels, dict) else None})
    return containers


def docker_containers(docker=DOCKER, run=subprocess.run):
    """The running Docker containers ([{id, name, pid, unit}]); [] where Docker is absent or its daemon answers
    nothing. `docker ps` gives no PID: `docker inspect` of the running ones does, with their names."""
    if not os.access(docker, os.X_OK):
        return []
    try:
        done = run([docker, "ps", "--quiet", "--no-trunc"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                   universal_newlines=True, timeout=30, check=False)
        ids = done.stdout.split() if done.returncode == 0 else []
        if not ids:
            return []
        done = run([docker, "inspect", "--type", "container", "--format", DOCKER_INSPECT_FORMAT] + ids,
                   stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, universal_newlines=True, timeout=30,
                   check=False)
    except (OSError, subprocess.SubprocessError):
        return []
    # A container gone between the two answers makes inspect fail for it alone: the others are still listed.
    return parse_docker_inspect(done.stdout)


def runtime_containers(podman=PODMAN, docker=DOCKER):
    """The running containers of both runtimes ([{id, name, pid, unit}]), each asked where it is installed."""
    return podman_containers(podman) + docker_containers(docker)


def match_container(container_id, namespace, host_namespace, containers):
    """The container of a holder, pure: {id, name, unit} or None (not in a container).

    container_id: from its cgroup (or None); namespace: its PID namespace; containers: [{id, name,
    pid_ns, unit}]. A holder in another PID namespace that no listed container shares is still in some
    container (or namespace) that the runtime does not know: {id: None, name: None, unit: None}.
    """
    if container_id:
        for container in containers:
            if container["id"] == container_id:
                return {"id": container_id, "name": container["name"], "unit": container.get("unit")}
        return {"id": container_id, "name": None, "unit": None}
    if namespace is None or host_namespace is None or namespace == host_namespace:
        return None
    for container in containers:
        if container.get("pid_ns") == namespace:
            return {"id": container["id"], "name": container["name"], "unit": container.get("unit")}
    return {"id": None, "name": None, "unit": None}


def describe(container):
    """'container NAME (SHORT ID)' for a holder's container; '' when it runs in none."""
    if not container:
        return ""
    if container["id"] is None:
        return "container (another PID namespace, not Podman's or Docker's)"
    short = container["id"][:SHORT_ID]
    return "container %s (%s)" % (container["name"], short) if container["name"] else "container %s" % short


def attach_containers(holders, proc_root="/proc", list_containers=runtime_containers):
    """Set each holder's `container` ({id, name, unit} or None). The runtime is asked only when a holder is
    in a container at all, once."""
    host_namespace = pid_namespace(1, proc_root)
    containers = None
    for holder in holders:
        try:
            with open(os.path.join(proc_root, str(holder["pid"]), "cgroup")) as handle:
                container_id = container_id_from_cgroup(handle.read())
        except OSError:
            container_id = None
        namespace = pid_namespace(holder["pid"], proc_root)
        in_container = container_id or (namespace and host_namespace and namespace != host_namespace)
        if in_container and containers is None:
            containers = [dict(c, pid_ns=pid_namespace(c["pid"], proc_root) if c["pid"] else None)
                          for c in list_containers()]
        holder["container"] = match_container(container_id, namespace, host_namespace, containers or [])
    return holders
