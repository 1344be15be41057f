"""tools/testhosts against real systemd-nspawn guests: boot, SSH, systemd, reboot, teardown.

Each test's guests are destroyed by name in a finalizer (the tool kills exactly the PIDs it
recorded), so nothing is left behind after a failure either. Guest names start with `mwt-`,
distinct from the demo host and the Molecule scenarios.
"""
import ipaddress
import json
import os
import signal
import subprocess

import pytest

from tests.helpers import TESTHOSTS as TOOL, until
from tests.helpers.guesthost import guest_dir
NETWORK = ipaddress.ip_network("10.213.77.0/24")

pytestmark = pytest.mark.slow


def tool(*args, check=True):
    result = subprocess.run([TOOL] + list(args), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, text=True, timeout=600)
    if check and result.returncode != 0:
        raise AssertionError("testhosts %s failed (%d): %s" % (" ".join(args), result.returncode, result.stderr))
    return result


def in_guest(name, command):
    return tool("ssh", name, command).stdout.strip()


def status():
    return {g["name"]: g for g in json.loads(tool("status", "--json").stdout)["guests"]}


def guest_mounts(name):
    needle = os.sep + os.path.join("guests", name) + os.sep
    with open("/proc/self/mountinfo") as handle:
        return [line for line in handle if needle in line.split()[4] + os.sep]


def pid_alive(pid):
    """True while pid runs (a zombie has exited: nothing here may reap it)."""
    try:
        with open("/proc/%d/stat" % pid) as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.fixture(scope="module")
def guest():
    name = "mwt-basic"
    try:
        tool("up", name)
        yield name
    finally:
        tool("down", name)


def test_guest_runs_systemd(guest):
    assert in_guest(guest, "systemctl is-system-running") == "running"


def test_guest_has_its_name_and_address(guest):
    addr = tool("addr", guest).stdout.strip()
    assert ipaddress.ip_address(addr) in NETWORK
    assert in_guest(guest, "hostname") == guest
    assert addr + "/24" in in_guest(guest, "ip -o -4 addr show dev host0")


def test_guest_has_no_route_beyond_the_bridge(guest):
    # Guests talk to each other and to the host only: no default route, no NAT.
    assert in_guest(guest, "ip -4 route") == "10.213.77.0/24 dev host0 proto kernel scope link src %s" % tool(
        "addr", guest).stdout.strip()


def test_the_guest_console_is_read_into_console_log(guest):
    # The guest's systemd writes its console when a stop job is slow; a console nobody reads fills
    # up and blocks it, and the shutdown never ends (the reboot below then times out).
    console = os.path.join(guest_dir(guest), "console.log")
    before = os.path.getsize(console)
    in_guest(guest, "head -c 100000 /dev/zero | tr '\\0' c | timeout 20 tee /dev/console >/dev/null")
    # nspawn copies the last bytes after tee has returned.
    until("100 KB more in %s" % console, lambda: os.path.getsize(console) - before >= 100000, timeout=10,
          interval=0.1)


def test_reboot_gives_a_new_boot_and_keeps_files_and_the_fake_gpus(guest):
    in_guest(guest, "echo kept > /root/marker")
    tool("install-fake-gpus", guest, "--count", "4", "--memory-mib", "1000")
    query = "nvidia-smi --query-gpu=index,memory.total --format=csv,noheader,nounits"
    gpus = ["%d, 1000" % i for i in range(4)]
    assert in_guest(guest, query).splitlines() == gpus
    boot_before = in_guest(guest, "cat /proc/sys/kernel/random/boot_id")
    machine_id = in_guest(guest, "cat /etc/machine-id")
    nspawn_before = status()[guest]["nspawn_pid"]

    tool("reboot", guest)

    assert in_guest(guest, "cat /proc/sys/kernel/random/boot_id") != boot_before
    assert status()[guest]["nspawn_pid"] != nspawn_before
    assert in_guest(guest, "cat /root/marker") == "kept"
    assert in_guest(guest, "cat /etc/machine-id") == machine_id
    assert in_guest(guest, "systemctl is-system-running --wait") == "running"
    assert in_guest(guest, query).splitlines() == gpus


def test_stop_and_start_keep_the_guest(guest):
    in_guest(guest, "echo survives-stop > /root/stop-marker")
    tool("stop", guest)
    assert status()[guest]["state"] == "stopped"
    assert guest_mounts(guest) == []

    tool("start", guest)
    assert status()[guest]["state"] == "running"
    assert in_guest(guest, "cat /root/stop-marker") == "survives-stop"


def test_down_leaves_nothing_behind(guest):
    name = "mwt-down"
    try:
        tool("up", name)
        # Both guests share the bridge and reach each other over it.
        in_guest(name, "ping -c 1 -W 2 %s" % tool("addr", guest).stdout.strip())
        before = status()[name]
        assert before["state"] == "running" and guest_mounts(name)
        assert os.path.isdir("/sys/class/net/vb-" + name)
    finally:
        tool("down", name)

    assert name not in status()
    assert not pid_alive(before["supervisor_pid"])
    assert not pid_alive(before["nspawn_pid"])
    assert guest_mounts(name) == []
    assert not os.path.exists("/sys/class/net/vb-" + name)
    # The other guest still runs, so the bridge stays for it.
    assert in_guest(guest, "systemctl is-system-running") == "running"


def test_down_after_the_supervisor_and_nspawn_were_killed_leaves_nothing():
    # What an interrupted run can leave: a SIGKILLed nspawn does not take its guest with it.
    name = "mwt-orphan"
    try:
        tool("up", name)
        before = status()[name]
        with open("/proc/%d/task/%d/children" % (before["nspawn_pid"], before["nspawn_pid"])) as handle:
            guest_init = int(handle.read().split()[0])
        os.kill(before["supervisor_pid"], signal.SIGKILL)
        os.kill(before["nspawn_pid"], signal.SIGKILL)
        assert pid_alive(guest_init)
        assert status()[name]["state"] == "orphaned"
    finally:
        tool("down", name)

    assert name not in status()
    assert not pid_alive(guest_init)
    assert guest_mounts(name) == []
    assert not os.path.exists("/sys/class/net/vb-" + name)


@pytest.mark.parametrize("args, complaint", [
    (["up", "Bad_Name"], "guest name 'Bad_Name'"),
    (["up", "mwt-bad", "--addr", "192.168.1.5"], "--addr 192.168.1.5"),
    (["up", "mwt-bad", "--addr", "10.213.77.1"], "other than 10.213.77.1"),
    (["down"], "pass either --all or --prefix"),
    (["addr", "mwt-nonesuch"], "no guest 'mwt-nonesuch'"),
])
def test_bad_input_is_refused_and_changes_nothing(args, complaint):
    before = sorted(status())
    result = tool(*args, check=False)
    assert result.returncode == 1
    assert complaint in result.stderr
    assert sorted(status()) == before
    assert not os.path.exists("/sys/class/net/vb-mwt-bad")
