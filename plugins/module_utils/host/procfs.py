"""Reading /proc and /sys/fs/cgroup: a server's process tree, its CPU time and I/O counters.

Why these counters:
- CPU: utime+stime of every process in the tree plus cutime+cstime, because vLLM compiles in
  short-lived g++ children that are reaped between two polls: their CPU only shows up in the
  parent's reaped-children counters.
- Disk: `read_bytes` from /proc/<pid>/io, not `rchar`: vLLM's weight reader is a grandchild that
  reads the safetensors through mmap, so its `rchar` stays 0 while `read_bytes` counts the pages
  faulted in from disk. /proc/<pid>/io of another user's process needs privileges: then None.
- Written and socket bytes: `write_bytes` (what the tree caused to be written to storage) and
  `wchar`/`rchar` (bytes passed to write(2)/read(2) and their kin, sockets and pipes included). A
  hub download receives with recv(), which rchar does not count, and writes the file: write_bytes
  and wchar grow while read_bytes stays flat. A load streamed from an object store reads its
  socket with read(): rchar grows with no block read (proc_pid_io(5)).
- Page faults: minflt + majflt of each process. Work on fresh memory (a layer-by-layer repack,
  a new buffer per kernel) faults pages in; a rank spinning in a busy-wait touches none. With the
  ranks' stacks, this tells the two apart (readiness/classifier.py).
"""
import glob
import ipaddress
import os

CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

STATE_NAMES = {
    "R": "running",
    "S": "sleeping",
    "D": "disk sleep",
    "T": "stopped",
    "t": "tracing stop",
    "Z": "zombie",
    "X": "dead",
    "I": "idle",
}


# include/linux/sched.h: "getting shut down", set at the start of do_exit().
PF_EXITING = 0x00000004

# The /proc/<pid>/io counters the tree totals (see the module's docstring for why each).
IO_COUNTERS = ("read_bytes", "write_bytes", "rchar", "wchar")


def _read(path, mode="r"):
    with open(path, mode) as handle:
        return handle.read()


def read_process(pid, proc_root="/proc"):
    """One process as a dict, or None when it does not exist (or vanished while we read it)."""
    base = os.path.join(proc_root, str(pid))
    try:
        stat = _read(os.path.join(base, "stat"))
    except (OSError, ValueError):
        return None
    # comm may itself contain spaces and parentheses: it ends at the LAST ')'.
    close = stat.rfind(")")
    comm = stat[stat.find("(") + 1:close]
    fields = stat[close + 2:].split()
    info = {
        "pid": int(pid),
        "comm": comm,
        "state": fields[0],
        "ppid": int(fields[1]),
        "session": int(fields[3]),
        "own_ticks": int(fields[11]) + int(fields[12]),
        "faults": int(fields[7]) + int(fields[9]),
        "child_ticks": int(fields[13]) + int(fields[14]),
        "starttime": int(fields[19]),
        # PF_EXITING in the kernel's flags: the process is in exit(), releasing what it holds (its GPU
        # memory among them) before it becomes a zombie.
        "exiting": bool(int(fields[6]) & PF_EXITING),
        "cmdline": "",
        # A zombie's exit status as waitpid() gives it (field 52, Linux 3.5+): how a process that died
        # unreaped ended (a rank whose parent is blocked elsewhere); None for the living.
        "exit_status": int(fields[49]) if fields[0] == "Z" and len(fields) > 49 else None,
    }
    info.update(dict.fromkeys(IO_COUNTERS))
    try:
        for line in _read(os.path.join(base, "io")).splitlines():
            name, _colon, value = line.partition(":")
            if name in IO_COUNTERS:
                info[name] = int(value)
    except (OSError, ValueError):
        pass  # no privileges for another user's io: None, never a crash
    try:
        raw = _read(os.path.join(base, "cmdline"), "rb")
        info["cmdline"] = raw.replace(b"\0", b" ").decode("utf-8", "replace").strip()
    except OSError:
        pass
    return info


# The files weights are kept in: a read(2) beyond the disk's while one is open is the page cache.
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".incomplete")


def open_weight_files(pids, proc_root="/proc"):
    """How many weight files (WEIGHT_SUFFIXES) the processes hold open, or None when not one fd table
    could be read (another user's processes without privileges)."""
    found, readable = 0, False
    for pid in pids:
        directory = os.path.join(proc_root, str(pid), "fd")
        try:
            names = os.listdir(directory)
        except OSError:
            continue
        readable = True
        for name in names:
            try:
                target = os.readlink(os.path.join(directory, name))
            except OSError:
                continue
            if target.endswith(WEIGHT_SUFFIXES):
                found += 1
    return found if readable else None


def load(proc_root="/proc"):
    """The host's CPU pressure: {"runnable": processes runnable now, "load1": the 1-minute load
    average, "cores": CPUs online}, or None where /proc/loadavg cannot be read."""
    try:
        fields = _read(os.path.join(proc_root, "loadavg")).split()
        runnable = int(fields[3].split("/")[0])
        return {"runnable": runnable, "load1": float(fields[0]), "cores": os.cpu_count() or 1}
    except (OSError, ValueError, IndexError):
        return None


def is_gone(info):
    """A zombie has finished: only its exit status waits to be collected."""
    return info is None or info["state"] in ("Z", "X")


def children(pid, proc_root="/proc"):
    """Direct children of pid: /proc/<pid>/task/*/children when the kernel has it, else a scan."""
    paths = glob.glob(os.path.join(proc_root, str(pid), "task", "*", "children"))
    if paths:
        found = []
        for path in paths:
            try:
                found.extend(int(x) for x in _read(path).split())
            except (OSError, ValueError):
                continue
        return found
    return [info["pid"] for info in _all_processes(proc_root) if info["ppid"] == pid]


def _all_processes(proc_root):
    for name in os.listdir(proc_root):
        if name.isdigit():
            info = read_process(name, proc_root)
            if info is not None:
                yield info


def tree(root_pids, proc_root="/proc"):
    """The processes of root_pids and all their descendants, as {pid: info}."""
    found = {}
    queue = list(root_pids)
    while queue:
        pid = queue.pop(0)
        if pid in found:
            continue
        info = read_process(pid, proc_root)
        if info is None:
            continue
        found[pid] = info
        queue.extend(children(pid, proc_root))
    return found


class TreeCounter(object):
    """Monotonic CPU-seconds and I/O byte totals (IO_COUNTERS) of a process tree across polls.

    Per process (pid + start time, so a reused pid is a new process) it keeps the last values
    seen. A process that exits keeps what it contributed, so totals never drop. When a parent
    reaps a child, the child's counters are added into the parent's (cutime/cstime; the io of
    a reaped child is added to the parent's io); the part we had already counted while the
    child lived is held as a debt and deducted from those later increases, so it is not
    counted twice. Children too short-lived to be seen create no debt: their work counts fully.
    """

    def __init__(self):
        self.last = {}
        self.cpu_ticks = 0
        self.io = dict((name, 0) for name in IO_COUNTERS)
        self.io_known = dict((name, False) for name in IO_COUNTERS)
        # What reaped children did while we saw them, per counter ("cpu" in ticks): not yet taken
        # over by their reaper's counters.
        self.debt = dict((name, 0) for name in ("cpu",) + IO_COUNTERS)

    def update(self, processes):
        """Fold one poll's {pid: info} into the totals; return (cpu_seconds, read_bytes or None).
        The other I/O totals are in io_totals() afterwards."""
        keys = dict(("%d:%d" % (info["pid"], info["starttime"]), info) for info in processes.values())
        # Processes gone since the last poll first: their reaper's increase may be in this poll.
        for key in [k for k in self.last if k not in keys]:
            gone = self.last.pop(key)
            self.debt["cpu"] += gone["own"] + gone["reaped"]
            for name in IO_COUNTERS:
                self.debt[name] += gone[name] or 0
        for key, info in keys.items():
            prev = self.last.get(key)
            own = info["own_ticks"]
            reaped = info["child_ticks"]
            if prev is None:
                # First sight: everything it has done so far is new work of this tree.
                self.cpu_ticks += own + reaped
            else:
                self.cpu_ticks += max(0, own - prev["own"])
                self.cpu_ticks += self._pay(max(0, reaped - prev["reaped"]), "cpu")
            seen = {"own": own, "reaped": reaped}
            for name in IO_COUNTERS:
                value = info.get(name)
                seen[name] = value
                if value is None:
                    continue
                if prev is None:
                    self.io[name] += value
                    self.io_known[name] = True
                elif prev[name] is not None:
                    self.io[name] += self._pay(max(0, value - prev[name]), name)
                    self.io_known[name] = True
            self.last[key] = seen
        return (self.cpu_ticks / float(CLK_TCK), self.io_totals()["read_bytes"])

    def io_totals(self):
        """{counter: total bytes, or None while no process's /proc/<pid>/io could be read}."""
        return dict((name, self.io[name] if self.io_known[name] else None) for name in IO_COUNTERS)

    def _pay(self, increase, name):
        """The part of a reaper's increase that is new work (name: "cpu" or an IO_COUNTERS name)."""
        paid = min(increase, self.debt[name])
        self.debt[name] -= paid
        return increase - paid


def systemd_cgroups(text):
    """The systemd paths of a /proc/<pid>/cgroup text, in its order: [(hierarchy, path)], hierarchy
    "unified" for cgroup v2's `0::/system.slice/x.service` or "systemd" for the v1 (hybrid) line
    `N:name=systemd:/system.slice/x.service`. Lines of other controllers and malformed ones are left out.
    """
    found = []
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hier, controllers, path = parts
        if hier == "0" and controllers == "":
            found.append(("unified", path))
        elif controllers == "name=systemd":
            found.append(("systemd", path))
    return found


def unit_from_cgroup(text):
    """The systemd unit (service or scope) of a /proc/<pid>/cgroup text, or None.

    The paths are systemd_cgroups' (cgroup v2's `0::` line, v1's `name=systemd` one); the innermost
    .service or .scope wins.
    """
    for _hierarchy, path in systemd_cgroups(text):
        for part in reversed(path.strip("/").split("/")):
            if part.endswith(".service") or part.endswith(".scope"):
                return part
    return None


def process_unit(pid, proc_root="/proc"):
    """The systemd unit a pid belongs to (from /proc/<pid>/cgroup), or None (no unit, or gone)."""
    try:
        return unit_from_cgroup(_read(os.path.join(proc_root, str(pid), "cgroup")))
    except OSError:
        return None


def cgroup_pids(control_group=None, main_pid=None, proc_root="/proc", cgroup_root="/sys/fs/cgroup"):
    """Pids in a systemd unit's cgroup (and its sub-cgroups), cgroup v2 or the v1 name=systemd tree.

    control_group is systemd's ControlGroup property; without it the path is read from
    /proc/<main_pid>/cgroup. Returns [] when neither leads anywhere.
    """
    paths = []
    if control_group:
        paths = [os.path.join(cgroup_root, control_group.lstrip("/")),
                 os.path.join(cgroup_root, "systemd", control_group.lstrip("/"))]
    elif main_pid:
        try:
            text = _read(os.path.join(proc_root, str(main_pid), "cgroup"))
        except OSError:
            text = ""
        for hierarchy, path in systemd_cgroups(text):
            mount = cgroup_root if hierarchy == "unified" else os.path.join(cgroup_root, "systemd")
            paths.append(os.path.join(mount, path.lstrip("/")))
    for path in paths:
        if os.path.isdir(path):
            pids = []
            for dirpath, _dirs, files in os.walk(path):
                if "cgroup.procs" in files:
                    try:
                        pids.extend(int(x) for x in _read(os.path.join(dirpath, "cgroup.procs")).split())
                    except (OSError, ValueError):
                        continue
            return sorted(set(pids))
    return []


def _tcp_rows(proc_root):
    """The rows of /proc/net/tcp and tcp6, split: sl local_address rem_address st tx:rx tr:when
    retrnsmt uid timeout inode ..."""
    for name in ("tcp", "tcp6"):
        try:
            lines = _read(os.path.join(proc_root, "net", name)).splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            yield line.split()


def _listening_inodes(port, proc_root):
    return set(cols[9] for cols in _tcp_rows(proc_root)
               if len(cols) > 9 and cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port)


def listening_socket_owners(port, proc_root="/proc"):
    """Who listens on a TCP port: [] (nobody), else [{"pid": int or None, "comm": str or None}].

    Several processes can hold a listening socket (inherited fds, SO_REUSEPORT). A listener whose
    owner is not visible to us (another user's fds without privileges) is {"pid": None, ...}.
    """
    inodes = _listening_inodes(port, proc_root)
    if not inodes:
        return []
    targets = set("socket:[%s]" % inode for inode in inodes)
    owners = []
    for name in os.listdir(proc_root):
        if not name.isdigit():
            continue
        fd_dir = os.path.join(proc_root, name, "fd")
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            try:
                link = os.readlink(os.path.join(fd_dir, fd))
            except OSError:
                continue
            if link in targets:
                info = read_process(name, proc_root)
                owners.append({"pid": int(name), "comm": info["comm"] if info else None})
                break
    return owners or [{"pid": None, "comm": None}]


def listening_socket_owner(port, proc_root="/proc"):
    """The first process listening on port ({"pid", "comm"}), or None when nobody listens."""
    owners = listening_socket_owners(port, proc_root)
    return owners[0] if owners else None


def _hex_address(text):
    """/proc/net/tcp{,6}'s "0100007F:C350" -> ("127.0.0.1", 50000); an IPv4-mapped IPv6 address
    comes back as IPv4, so a v4 peer matches on either table."""
    address, port = text.split(":")
    raw = bytes.fromhex(address)
    # The kernel prints each 32-bit word in host (little-endian) order.
    raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    ip = ipaddress.ip_address(raw)
    if ip.version == 6 and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return str(ip), int(port, 16)


def established_connections(proc_root="/proc"):
    """Every established TCP connection of this network namespace: [(local_ip, local_port,
    remote_ip, remote_port)]. No process is looked up: the table alone, a few hundred lines."""
    found = []
    for cols in _tcp_rows(proc_root):
        if len(cols) > 3 and cols[3] == "01":
            try:
                found.append(_hex_address(cols[1]) + _hex_address(cols[2]))
            except ValueError:
                continue
    return found
