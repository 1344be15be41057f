"""procfs against real processes started by the tests (no sleeping: pipes and waitpid synchronise)."""
import os
import signal
import socket
import subprocess
import sys

import pytest

from ansible_collections.modelwake.serving.plugins.module_utils.host import procfs

MIB = 1024 * 1024

TREE = r"""
import mmap, os, sys
path = sys.argv[1]
child = os.fork()
if child == 0:
    grandchild = os.fork()
    if grandchild == 0:
        sys.stdin.read()
        os._exit(0)
    with open(path, "rb") as f:
        m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        total = sum(m[i] for i in range(0, len(m), 4096))  # page faults, not read() calls
    print("ready %d %d" % (os.getpid(), grandchild), flush=True)
    sys.stdin.read()
    os.waitpid(grandchild, 0)
    os._exit(0)
sys.stdin.read()
os.waitpid(child, 0)
"""

REAPER = r"""
import os, sys
r, w = os.pipe()
child = os.fork()
if child == 0:
    os.close(w)
    n = 0
    for i in range(4000000):
        n += i * i
    print("burnt %d" % os.getpid(), flush=True)
    os.read(r, 1)
    os._exit(0)
os.close(r)
sys.stdin.readline()
os.close(w)
os.waitpid(child, 0)
print("reaped", flush=True)
sys.stdin.read()
"""


@pytest.fixture
def spawn():
    """Start `python -c code args`; every process started is killed at the end, by pid."""
    started = []

    def start(code, *args):
        proc = subprocess.Popen([sys.executable, "-c", code] + list(args), stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, universal_newlines=True)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        for pid in procfs.tree([proc.pid]):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        proc.wait()


def cold_file(path, size):
    """A file whose pages are not in the page cache, so reading it counts in read_bytes."""
    with open(path, "wb") as handle:
        handle.write(os.urandom(size))
        handle.flush()
        os.fsync(handle.fileno())
        os.posix_fadvise(handle.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    return str(path)


def test_tree_walks_children_and_grandchildren_and_counts_mmap_reads_as_read_bytes(spawn, tmp_path):
    path = cold_file(tmp_path / "shard.safetensors", 8 * MIB)
    proc = spawn(TREE, path)
    _word, child, grandchild = proc.stdout.readline().split()
    child, grandchild = int(child), int(grandchild)
    found = procfs.tree([proc.pid])
    assert sorted(found) == sorted([proc.pid, child, grandchild])
    assert found[grandchild]["ppid"] == child
    # The grandchild-style reader reads through mmap: read_bytes sees it.
    assert found[child]["read_bytes"] >= 8 * MIB
    _cpu, read_bytes = procfs.TreeCounter().update(found)
    assert read_bytes >= 8 * MIB
    proc.stdin.close()
    assert proc.wait() == 0


def test_reaped_child_cpu_counts_once_and_totals_never_drop(spawn):
    proc = spawn(REAPER)
    _word, child = proc.stdout.readline().split()
    counter = procfs.TreeCounter()
    before, _ = counter.update(procfs.tree([proc.pid]))
    child_cpu = procfs.read_process(child)["own_ticks"] / float(procfs.CLK_TCK)
    assert child_cpu > 0.05  # the child burnt CPU
    assert procfs.read_process(proc.pid)["child_ticks"] == 0
    proc.stdin.write("go\n")
    proc.stdin.flush()
    assert proc.stdout.readline().strip() == "reaped"
    parent = procfs.read_process(proc.pid)
    assert parent["child_ticks"] / float(procfs.CLK_TCK) >= child_cpu  # moved into cutime/cstime
    after, _ = counter.update(procfs.tree([proc.pid]))
    assert before <= after < before + child_cpu / 2  # not dropped, not counted twice


def test_reaped_child_never_seen_alive_counts_through_cutime(spawn):
    proc = spawn(REAPER)
    proc.stdout.readline()
    proc.stdin.write("go\n")
    proc.stdin.flush()
    proc.stdout.readline()
    cpu, _ = procfs.TreeCounter().update(procfs.tree([proc.pid]))
    assert cpu >= procfs.read_process(proc.pid)["child_ticks"] / float(procfs.CLK_TCK) > 0.05


def test_sigstopped_process_is_state_t_and_zombie_is_gone(spawn):
    proc = spawn("import sys; sys.stdin.read()")
    os.kill(proc.pid, signal.SIGSTOP)
    os.waitpid(proc.pid, os.WUNTRACED)  # returns once it has stopped
    info = procfs.read_process(proc.pid)
    assert info["state"] == "T" and procfs.STATE_NAMES["T"] == "stopped"
    assert not procfs.is_gone(info)
    os.kill(proc.pid, signal.SIGCONT)
    proc.stdin.close()
    os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)  # exited, not yet reaped
    info = procfs.read_process(proc.pid)
    assert info["state"] == "Z" and procfs.is_gone(info)


def test_missing_process_and_unreadable_io(tmp_path):
    assert procfs.read_process(2 ** 22 + 7) is None
    fake = tmp_path / "proc" / "4242"
    fake.mkdir(parents=True)
    (fake / "stat").write_text("4242 (VLLM::Worker (x)) S 1 4242 4242 0 -1 0 0 0 0 0 150 50 20 5 20 0 1 0 777 0 0\n")
    info = procfs.read_process(4242, str(tmp_path / "proc"))
    assert info["comm"] == "VLLM::Worker (x)"
    assert (info["own_ticks"], info["child_ticks"], info["starttime"]) == (200, 25, 777)
    assert info["read_bytes"] is None  # /proc/<pid>/io not readable: None, not a crash


def test_children_found_by_scanning_when_the_kernel_has_no_children_file(tmp_path):
    root = tmp_path / "proc"
    for pid, ppid in ((10, 1), (11, 10), (12, 11), (13, 1)):
        (root / str(pid)).mkdir(parents=True)
        (root / str(pid) / "stat").write_text("%d (p) S %d 0 0 0 -1 0 0 0 0 0 1 1 0 0 20 0 1 0 5 0 0\n" % (pid, ppid))
    assert sorted(procfs.tree([10], str(root))) == [10, 11, 12]


def test_totals_survive_a_child_that_exits_unreaped_by_the_tree():
    counter = procfs.TreeCounter()
    a = {"pid": 1, "own_ticks": 100, "child_ticks": 0, "starttime": 1, "read_bytes": 10 * MIB}
    b = {"pid": 2, "own_ticks": 50, "child_ticks": 0, "starttime": 2, "read_bytes": 30 * MIB}
    cpu1, read1 = counter.update({1: a, 2: b})
    cpu2, read2 = counter.update({1: a})  # b exited and was reaped outside the tree
    assert (cpu2, read2) == (cpu1, read1)
    a2 = dict(a, own_ticks=110, child_ticks=50, read_bytes=40 * MIB)  # then reaped by a: no double count
    cpu3, read3 = counter.update({1: a2})
    assert cpu3 == pytest.approx(cpu1 + 10.0 / procfs.CLK_TCK)
    assert read3 == read1
    b_again = dict(b, starttime=99)  # pid 2 reused by a new process: new work
    _cpu4, read4 = counter.update({1: a2, 2: b_again})
    assert read4 == read1 + 30 * MIB


@pytest.mark.parametrize("layout", ["v2", "v1"])
def test_cgroup_pids_of_a_unit(tmp_path, layout):
    cgroot = tmp_path / "cgroup"
    unit = "system.slice/sglang-k26.service"
    base = cgroot / unit if layout == "v2" else cgroot / "systemd" / unit
    (base / "sub").mkdir(parents=True)
    (base / "cgroup.procs").write_text("500\n501\n")
    (base / "sub" / "cgroup.procs").write_text("502\n")
    assert procfs.cgroup_pids("/" + unit, cgroup_root=str(cgroot)) == [500, 501, 502]
    proc = tmp_path / "proc" / "500"
    proc.mkdir(parents=True)
    line = "0::/%s\n" % unit if layout == "v2" else "12:cpu,cpuacct:/x\n1:name=systemd:/%s\n" % unit
    (proc / "cgroup").write_text(line)
    assert procfs.cgroup_pids(None, 500, str(tmp_path / "proc"), str(cgroot)) == [500, 501, 502]
    assert procfs.cgroup_pids(None, 999, str(tmp_path / "proc"), str(cgroot)) == []


def test_systemd_cgroups_reads_the_unified_and_the_v1_systemd_lines_only():
    text = "12:memory:/system.slice/x.service\n1:name=systemd:/system.slice/a.service\n0::/system.slice/b.service\nbad\n"
    assert procfs.systemd_cgroups(text) == [("systemd", "/system.slice/a.service"),
                                            ("unified", "/system.slice/b.service")]
    assert procfs.systemd_cgroups("") == []


def test_listening_socket_owner_is_found_and_a_bound_only_socket_is_not_listening():
    listener = socket.socket()
    bound = socket.socket()
    try:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        port = listener.getsockname()[1]
        owner = procfs.listening_socket_owner(port)
        assert owner["pid"] == os.getpid()
        assert owner["comm"] == procfs.read_process(os.getpid())["comm"]
        # vLLM binds its port early and listens only when ready: bound is not listening.
        bound.bind(("127.0.0.1", 0))
        assert procfs.listening_socket_owners(bound.getsockname()[1]) == []
    finally:
        listener.close()
        bound.close()
    assert procfs.listening_socket_owner(port) is None


# Writes a file, then reads a socket with read(2) (os.read) and with recv(2), one step per line on stdin.
WRITER_AND_RECEIVER = r"""
import os, socket, sys
path = sys.argv[1]
a, b = socket.socketpair()
sys.stdin.readline()
with open(path, "wb") as f:
    f.write(b"x" * (4 * 1024 * 1024))
print("written", flush=True)
sys.stdin.readline()
b.sendall(b"y" * 65536)
got = 0
while got < 65536:
    got += len(os.read(a.fileno(), 65536))
print("read", flush=True)
sys.stdin.readline()
b.sendall(b"z" * 65536)
got = 0
while got < 65536:
    got += len(a.recv(65536))
print("received", flush=True)
sys.stdin.read()
"""


def test_written_and_socket_bytes_are_counted_for_the_tree(spawn, tmp_path):
    proc = spawn(WRITER_AND_RECEIVER, str(tmp_path / "blob.incomplete"))
    counter = procfs.TreeCounter()

    def step(command, answer):
        before = counter.io_totals()
        proc.stdin.write(command + "\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == answer
        counter.update(procfs.tree([proc.pid]))
        after = counter.io_totals()
        return dict((name, after[name] - before[name]) for name in procfs.IO_COUNTERS)

    counter.update(procfs.tree([proc.pid]))
    grown = step("write", "written")
    assert grown["wchar"] >= 4 * MIB and grown["write_bytes"] >= 4 * MIB  # a file written (ext4, not tmpfs)
    assert grown["read_bytes"] == 0
    grown = step("read", "read")
    assert grown["rchar"] >= 65536 and grown["read_bytes"] == 0  # read(2) on a socket: rchar only
    grown = step("recv", "received")
    assert grown["rchar"] < 65536  # recv(2) is not in rchar: a hub download shows in the writes only


def test_io_counters_are_parsed_and_unreadable_io_is_none(tmp_path):
    fake = tmp_path / "proc" / "4243"
    fake.mkdir(parents=True)
    (fake / "stat").write_text("4243 (python3) S 1 4243 4243 0 -1 0 0 0 0 0 1 1 0 0 20 0 1 0 9 0 0\n")
    (fake / "io").write_text("rchar: 11\nwchar: 22\nsyscr: 3\nsyscw: 4\nread_bytes: 4096\nwrite_bytes: 8192\n"
                             "cancelled_write_bytes: 0\n")
    info = procfs.read_process(4243, str(tmp_path / "proc"))
    assert [info[name] for name in procfs.IO_COUNTERS] == [4096, 8192, 11, 22]
    (fake / "io").unlink()
    info = procfs.read_process(4243, str(tmp_path / "proc"))
    assert [info[name] for name in procfs.IO_COUNTERS] == [None] * 4
    counter = procfs.TreeCounter()
    counter.update({4243: info})
    assert counter.io_totals() == dict.fromkeys(procfs.IO_COUNTERS)


def test_written_bytes_survive_an_exit_and_a_reaper_takes_over_without_double_count():
    counter = procfs.TreeCounter()

    def proc(pid, starttime, child_ticks=0, **io):
        info = {"pid": pid, "own_ticks": 1, "child_ticks": child_ticks, "starttime": starttime}
        info.update(dict((name, io.get(name, 0)) for name in procfs.IO_COUNTERS))
        return info

    parent = proc(1, 1, write_bytes=5 * MIB, wchar=5 * MIB, rchar=1 * MIB)
    child = proc(2, 2, write_bytes=20 * MIB, wchar=20 * MIB, rchar=7 * MIB)
    counter.update({1: parent, 2: child})
    first = counter.io_totals()
    assert first["write_bytes"] == 25 * MIB and first["rchar"] == 8 * MIB
    counter.update({1: parent})  # the child exited
    assert counter.io_totals() == first
    # The parent reaps it: the child's io is added to the parent's. Already counted: no growth.
    reaped = proc(1, 1, write_bytes=25 * MIB, wchar=25 * MIB, rchar=8 * MIB)
    counter.update({1: reaped})
    assert counter.io_totals() == first
    # Then the parent itself writes 3 MiB more: that is new.
    counter.update({1: proc(1, 1, write_bytes=28 * MIB, wchar=28 * MIB, rchar=8 * MIB)})
    assert counter.io_totals()["write_bytes"] == 28 * MIB and counter.io_totals()["wchar"] == 28 * MIB


def test_open_weight_files_counts_the_weights_a_process_holds_open(tmp_path):
    shard = tmp_path / "model-00001-of-00002.safetensors"
    shard.write_bytes(b"\0" * 16)
    other = tmp_path / "config.json"
    other.write_text("{}")
    with open(str(shard), "rb"), open(str(other)):
        assert procfs.open_weight_files([os.getpid()]) == 1
    assert procfs.open_weight_files([os.getpid()]) == 0
    assert procfs.open_weight_files([], proc_root=str(tmp_path)) is None  # no fd table read: unknown
