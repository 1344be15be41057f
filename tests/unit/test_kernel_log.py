"""The kernel log reader (host/kernel_log.py) on a scripted kernel log in /dev/kmsg's format, and
the probe's Xid records: only those since the server's start, only the new ones at each look, and a
log that cannot be read said, never fatal."""
import os
import subprocess
import sys

import pytest

from ansible_collections.modelwake.serving.plugins.module_utils.host import kernel_log, procfs
from ansible_collections.modelwake.serving.plugins.module_utils.readiness.probe import HostProbe
from ansible_collections.modelwake.serving.plugins.module_utils.readiness.waiter import wait_for_ready

from tests.helpers.fakes import fresh_nvml_api
from tests.helpers.network import free_port as closed_port
from tests.helpers.traces import config

FALLEN = "NVRM: Xid (PCI:0000:41:00): 79, pid=1234, name=python3, GPU has fallen off the bus."
ECC = "NVRM: Xid (PCI:0000:42:00): 94, pid=1234, name=python3, Contained: SM (0x1). RST: No"


def record(seq, usec, message, prio=4):
    return "%d,%d,%d,-;%s\n" % (prio, seq, usec, message)


def append(path, *records):
    with open(str(path), "a") as log:
        log.write("".join(records))


def test_records_are_read_by_sequence_time_and_message():
    assert kernel_log.parse_record("4,1207,5120000,-;" + FALLEN) == (1207, 5120000, FALLEN)
    assert kernel_log.parse_record("6,12,9000,c;a message; with a semicolon\n") == (12, 9000, "a message; with a semicolon")
    # The dictionary lines after a record, and what is not a record.
    assert kernel_log.parse_record(" SUBSYSTEM=pci") is None
    assert kernel_log.parse_record("garbage") is None
    assert kernel_log.parse_record("4,x,1,-;m") is None


def test_only_xid_lines_since_the_start_and_only_the_new_ones_at_each_look(tmp_path):
    path = tmp_path / "kmsg"
    append(path, record(1, 1000000, "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  580.95.05"),
           record(2, 2000000, "NVRM: Xid (PCI:0000:41:00): 63, pid=77, Row Remapper: New row marked for remapping"),
           record(3, 6000000, "nvidia-peermem: module loaded"),
           record(4, 7000000, FALLEN))
    log = kernel_log.KernelLog(since_usec=5000000, path=str(path))
    assert log.read_new() == [{"seq": 4, "usec": 7000000, "message": FALLEN}]  # the Xid of before the start is not
    assert log.error is None
    assert log.read_new() == []
    # A record written in two pieces is read once whole.
    line = record(5, 8000000, ECC)
    append(path, line[:20])
    assert log.read_new() == []
    append(path, line[20:], record(6, 9000000, "eth0: link up"))
    assert log.read_new() == [{"seq": 5, "usec": 8000000, "message": ECC}]
    # Reopened (after an error, or by a new reader at the same place), the sequence keeps it from repeating.
    log.close()
    assert log.read_new() == []


def test_a_host_without_a_kernel_log_is_no_error_and_one_that_appears_is_read(tmp_path):
    log = kernel_log.KernelLog(path=str(tmp_path / "missing"))
    assert log.read_new() == [] and log.absent and log.error is None
    append(tmp_path / "missing", record(1, 1, FALLEN))  # it appears: read from then on
    assert [r["seq"] for r in log.read_new()] == [1] and log.error is None and not log.absent


def test_a_log_that_exists_and_cannot_be_read_says_why_and_reads_nothing(tmp_path):
    unreadable = tmp_path / "kmsg"
    unreadable.mkdir()  # opens, and every read fails (as root, a mode cannot refuse it)
    log = kernel_log.KernelLog(path=str(unreadable))
    assert log.read_new() == [] and not log.absent
    assert log.error == "kernel log unreadable: %s: Is a directory" % unreadable


def test_the_path_is_dev_kmsg_unless_a_test_names_another(monkeypatch):
    monkeypatch.delenv(kernel_log.PATH_ENV, raising=False)
    assert kernel_log.KernelLog().path == "/dev/kmsg"
    monkeypatch.setenv(kernel_log.PATH_ENV, "/tmp/scripted-kmsg")
    assert kernel_log.KernelLog().path == "/tmp/scripted-kmsg"


@pytest.mark.skipif(not os.access("/dev/kmsg", os.R_OK), reason="/dev/kmsg is not readable here")
def test_the_real_dev_kmsg_is_read_record_by_record_without_blocking():
    log = kernel_log.KernelLog(since_usec=0, path="/dev/kmsg", match="")
    first = log.read_new()
    assert log.error is None and first and all(r["usec"] >= 0 for r in first)
    assert [r["seq"] for r in first] == sorted(r["seq"] for r in first)
    assert all(r["seq"] > first[-1]["seq"] for r in log.read_new())  # only what came since
    log.close()


# -- the probe ---------------------------------------------------------------------------------

@pytest.fixture
def sleeper():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield proc
    proc.kill()
    proc.wait()


def start_usec(pid):
    return int(procfs.read_process(pid)["starttime"] * 1e6 / procfs.CLK_TCK)


def test_the_probe_names_the_gpu_of_each_xid_since_the_servers_start(sleeper, tmp_path):
    nvml = fresh_nvml_api()
    nvml.configure([{"uuid": "GPU-%d" % i, "memory_used_mib": 0, "memory_total_mib": 97887, "utilization": 0,
                     "bus_id": "00000000:%02X:00.0" % (0x40 + i)} for i in range(4)])
    path = tmp_path / "kmsg"
    start = start_usec(sleeper.pid)
    append(path, record(10, start - 10 ** 6, ECC))  # a fault of an earlier run: not this start's
    probe = HostProbe(config(pid=sleeper.pid, url="http://127.0.0.1:%d" % closed_port(), gpus=[1]), nvml=nvml)
    probe.kernel_log_path = str(path)
    snap = probe.snapshot(0.0)
    assert snap.xids == [] and snap.errors == []
    append(path, record(11, start + 1000, FALLEN), record(12, start + 2000, "NVRM: Xid (PCI:0000:99:00): 13, Graphics"))
    snap = probe.snapshot(5.0)
    assert [(x["code"], x["gpu"], x["pci"], x["usec"]) for x in snap.xids] == [
        (79, 1, "0000:41:00", start + 1000), (13, None, "0000:99:00", start + 2000)]
    assert probe.snapshot(10.0).xids == []


def test_an_unreadable_kernel_log_is_a_signal_that_could_not_be_read(sleeper, tmp_path):
    probe = HostProbe(config(pid=sleeper.pid, url="http://127.0.0.1:%d" % closed_port()), nvml=fresh_nvml_api())
    probe.kernel_log_path = str(tmp_path / "kmsg-denied")
    (tmp_path / "kmsg-denied").mkdir()
    snap = probe.snapshot(0.0)
    assert snap.xids == [] and snap.notes == []
    assert snap.errors == ["kernel log unreadable: %s: Is a directory" % (tmp_path / "kmsg-denied")]


def test_no_kernel_log_on_the_host_is_a_note_not_a_warning(sleeper, tmp_path):
    # A container or a guest has no /dev/kmsg: said once in the result's evidence, never as a warning.
    cfg = config(pid=sleeper.pid, url="http://127.0.0.1:%d" % closed_port(), timeout=0)
    probe = HostProbe(cfg, nvml=fresh_nvml_api())
    probe.kernel_log_path = str(tmp_path / "none")
    result = wait_for_ready(cfg, probe)
    assert "warnings" not in result or not any("kernel log" in w for w in result["warnings"]), result.get("warnings")
    assert result["evidence"].count("kernel log: none on this host (%s)" % (tmp_path / "none")) == 1
