"""HostProbe gathers a real snapshot: a real server process, its log file, its port; systemd scripted."""
import json
import os
import subprocess
import sys

import pytest

from ansible_collections.modelwake.serving.plugins.module_utils.host import procfs
from ansible_collections.modelwake.serving.plugins.module_utils.common.errors import InputError
from ansible_collections.modelwake.serving.plugins.module_utils.readiness.probe import HostProbe
from ansible_collections.modelwake.serving.plugins.module_utils.readiness.snapshot import ProcessTree

from tests.helpers.fakes import fresh_nvml_api
from tests.helpers.network import free_port as closed_port
from tests.helpers.traces import config


# A tiny server: listens, answers /health 503 like SGLang warming up, logs a line, tells its port.
SERVER = r"""
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass
    def do_GET(self):
        self.send_response(503 if self.path == "/health" else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()
srv = http.server.HTTPServer(("127.0.0.1", 0), H)
with open(sys.argv[1], "a") as log:
    log.write("[2026-05-25 19:06:14 TP0] Load weight begin. avail mem=85 GB\n")
print(srv.server_address[1], flush=True)
srv.serve_forever()
"""


@pytest.fixture
def fake_nvml():
    module = fresh_nvml_api()
    module.configure([{"uuid": "GPU-0", "memory_used_mib": 1024, "memory_total_mib": 97887, "utilization": 3}])
    return module


@pytest.fixture
def server(tmp_path):
    log = tmp_path / "server.log"
    proc = subprocess.Popen([sys.executable, "-c", SERVER, str(log)], stdout=subprocess.PIPE, universal_newlines=True)
    port = int(proc.stdout.readline())
    yield proc, port, str(log)
    if proc.poll() is None:  # still ours and unreaped: the pid cannot belong to anyone else
        proc.kill()
    proc.wait()


def test_pid_mode_snapshot_of_a_real_server(server, fake_nvml):
    proc, port, log = server
    cfg = config(pid=proc.pid, url="http://127.0.0.1:%d" % port, log_path=log, engine="sglang")
    probe = HostProbe(cfg, nvml=fake_nvml)
    snap = probe.snapshot(0.0, remaining=60)
    assert snap.process.alive is True and snap.process.root_pid == proc.pid
    assert proc.pid in snap.process.pids and snap.process.states[str(proc.pid)] in ("S", "R")
    assert snap.process.cpu_seconds > 0 and snap.process.read_bytes is not None
    assert snap.gpus == [{"index": 0, "uuid": "GPU-0", "memory_used_mib": 1024, "memory_total_mib": 97887,
                          "memory_free_mib": 97887 - 1024, "utilization": 3}]
    assert snap.log_context == ["[2026-05-25 19:06:14 TP0] Load weight begin. avail mem=85 GB"] and snap.log_lines == []
    assert snap.http.health.code == 503 and snap.http.listening is True
    assert [o["pid"] for o in snap.listeners] == [proc.pid]
    json.dumps(snap.to_dict())  # plain data
    assert snap.errors == []
    proc.kill()
    proc.wait()
    gone = probe.snapshot(5.0)
    assert gone.process.alive is False and gone.process.pids == []
    assert gone.http.listening is False


def test_pid_mode_refuses_a_pid_that_is_gone():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    with pytest.raises(InputError, match="no process with pid %d" % proc.pid):
        HostProbe(config(pid=proc.pid))


@pytest.fixture
def idle_process():
    """A real process that waits on its stdin: a unit's MainPID for the scripted systemd."""
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    yield proc
    proc.stdin.close()
    proc.wait()


class SystemdScript(object):
    """Scripted systemctl/journalctl answers; the unit's MainPID is a real process."""

    def __init__(self, main_pid, load_state="loaded", accounting=()):
        self.main_pid = main_pid
        self.load_state = load_state
        self.accounting = list(accounting)  # (CPUUsageNSec, IOReadBytes) per systemctl call
        self.calls = []

    def __call__(self, argv, timeout=30):
        self.calls.append(argv)
        if argv[0] == "systemctl":
            return 0, ("ActiveState=active\nSubState=running\nMainPID=%d\nNRestarts=0\nExecMainStatus=0\n"
                       "LoadState=%s\nInvocationID=inv1\nControlGroup=/system.slice/nowhere-%d.service\n"
                       % (self.main_pid, self.load_state, os.getpid())
                       + ("CPUUsageNSec=%d\nIOReadBytes=%d\n" % self.accounting.pop(0) if self.accounting else "")), ""
        if argv[0] == "journalctl":
            entry = {"__CURSOR": "c1", "_SYSTEMD_INVOCATION_ID": "inv1", "MESSAGE": "Init torch distributed begin."}
            return 0, json.dumps(entry) + "\n", ""
        return 127, "", "not scripted"


def test_unit_mode_snapshot_uses_systemd_and_the_journal(idle_process, fake_nvml):
    proc = idle_process
    runner = SystemdScript(proc.pid)
    cfg = config(unit="sglang-k26.service", url="http://127.0.0.1:%d" % closed_port())
    snap = HostProbe(cfg, runner=runner, nvml=fake_nvml).snapshot(0.0)
    assert snap.unit["MainPID"] == proc.pid and snap.unit["ActiveState"] == "active"
    # The cgroup is not there (no systemd here): the MainPID's tree stands in.
    assert snap.process.pids == [proc.pid] and snap.process.alive is True
    assert snap.log_lines == ["Init torch distributed begin."] and snap.log_context == []
    assert snap.http.health.kind == "refused"


def test_unit_mode_counts_what_the_cgroup_saw_beyond_the_tree(idle_process, fake_nvml):
    proc = idle_process
    # HostProbe's own check of the unit, then two looks: the cgroup did 3 s of CPU and read 64 MiB
    # between them, the idle tree nothing.
    runner = SystemdScript(proc.pid, accounting=[(0, 0), (10 ** 9, 0), (4 * 10 ** 9, 64 * 2 ** 20)])
    probe = HostProbe(config(unit="sglang-k26.service", url="http://127.0.0.1:%d" % closed_port()),
                      runner=runner, nvml=fake_nvml)
    first = probe.snapshot(0.0).process
    second = probe.snapshot(5.0).process
    assert round(second.cpu_seconds - first.cpu_seconds, 1) == 3.0
    assert second.read_bytes - (first.read_bytes or 0) == 64 * 2 ** 20


def test_unit_mode_refuses_a_unit_that_does_not_exist(fake_nvml):
    cfg = config(unit="nope.service")
    with pytest.raises(InputError, match="unit nope.service does not exist"):
        HostProbe(cfg, runner=SystemdScript(1, load_state="not-found"), nvml=fake_nvml)
    with pytest.raises(InputError, match="cannot ask systemd"):
        HostProbe(cfg, runner=lambda argv, timeout=30: (1, "", "System has not been booted with systemd"))


def test_procfs_sees_the_probe_server_as_the_listener(server):
    proc, port, _log = server
    assert procfs.listening_socket_owner(port)["pid"] == proc.pid


def test_a_host_without_gpu_tools_is_no_warning_but_a_broken_driver_is(server, fake_nvml):
    proc, port, _log = server
    fake_nvml.configure(init_error="NVML Shared Library Not Found")
    cfg = config(pid=proc.pid, url="http://127.0.0.1:%d" % port, ready_check="health")
    no_tools = HostProbe(cfg, nvml=fake_nvml, runner=lambda argv, timeout=30: (127, "", "nvidia-smi: command not found"))
    assert no_tools.snapshot(0.0).errors == []
    broken = HostProbe(cfg, nvml=fake_nvml, runner=lambda argv, timeout=30: (9, "", "couldn't communicate with the NVIDIA driver"))
    assert broken.snapshot(0.0).errors == ["nvidia-smi failed (rc 9): couldn't communicate with the NVIDIA driver"]


class RestartScript(object):
    """systemctl answers that follow a restart: the old run (inv-old, pid 1111) drains while the
    wait begins, then the new run (inv-new, a real process) starts. The journal holds the old run's
    drain, with the error a request refused during the drain printed (vLLM's, under a real restart)
    and one of its lines read late under the new run's id, then the new run's first line."""

    JOURNAL = [
        {"__CURSOR": "c1", "_PID": "1111", "_SYSTEMD_INVOCATION_ID": "inv-old",
         "MESSAGE": "[shutdown] API server: stopping engine client mode=drain timeout=30s"},
        {"__CURSOR": "c2", "_PID": "1111", "_SYSTEMD_INVOCATION_ID": "inv-old",
         "MESSAGE": "Traceback (most recent call last):"},
        {"__CURSOR": "c3", "_PID": "1111", "_SYSTEMD_INVOCATION_ID": "inv-new",
         "MESSAGE": "RuntimeError: cannot schedule new futures after shutdown"},
        {"__CURSOR": "c4", "_PID": "1", "INVOCATION_ID": "inv-old", "MESSAGE": "Stopped vllm-k26.service."},
    ]

    def __init__(self, new_pid, states):
        self.new_pid = new_pid
        self.states = list(states)  # one (ActiveState, SubState, run) per systemctl call; the last repeats
        self.journal_reads = 0

    def __call__(self, argv, timeout=30):
        if argv[0] == "systemctl":
            active, sub, run = self.states.pop(0) if len(self.states) > 1 else self.states[0]
            pid, invocation = (1111, "inv-old") if run == "old" else (self.new_pid, "inv-new")
            return 0, ("ActiveState=%s\nSubState=%s\nMainPID=%d\nNRestarts=0\nExecMainStatus=0\nLoadState=loaded\n"
                       "Type=simple\nInvocationID=%s\nControlGroup=/system.slice/nowhere-%d.service\n"
                       % (active, sub, pid, invocation, os.getpid())), ""
        if argv[0] == "journalctl":
            self.journal_reads += 1
            new_line = {"__CURSOR": "c5", "_PID": str(self.new_pid), "_SYSTEMD_INVOCATION_ID": "inv-new",
                        "MESSAGE": "INFO: Started server process [%d]" % self.new_pid}
            return 0, "\n".join(json.dumps(e) for e in self.JOURNAL + [new_line]) + "\n", ""
        return 127, "", "not scripted"


def test_a_wait_begun_during_a_restarts_drain_starts_its_story_at_the_next_run(idle_process, fake_nvml):
    from ansible_collections.modelwake.serving.plugins.module_utils.readiness.classifier import Classifier

    proc = idle_process
    stopping = ("deactivating", "stop-sigterm", "old")
    runner = RestartScript(proc.pid, [stopping, stopping, stopping, ("active", "running", "new")])
    cfg = config(unit="vllm-k26.service", url="http://127.0.0.1:%d" % closed_port(), engine="vllm")
    probe = HostProbe(cfg, runner=runner, nvml=fake_nvml)
    classifier = Classifier(cfg)
    looks = [probe.snapshot(t) for t in (0.0, 1.0)]
    # While the old run stops, nothing of it is read: no journal, no HTTP, no processes.
    assert [look.earlier_run for look in looks] == [
        {"invocation": "inv-old", "pid": 1111, "state": "deactivating, stop-sigterm"}] * 2
    assert looks[0].http is None and looks[0].process == ProcessTree() and runner.journal_reads == 0
    looks.append(probe.snapshot(2.0))
    verdicts = [classifier.observe(look) for look in looks]
    assert verdicts[0].phase == "not_started" and verdicts[0].pid is None
    assert "the earlier run of vllm-k26.service (pid 1111) is still stopping (deactivating, stop-sigterm)" \
        in verdicts[0].msg
    # The new run: only its own line, not the old run's drain nor its error read late under the new id.
    assert looks[2].earlier_run is None and runner.journal_reads == 1
    assert looks[2].log_lines == ["INFO: Started server process [%d]" % proc.pid] and looks[2].log_context == []
    assert verdicts[2].phase == "starting" and not verdicts[2].terminal and verdicts[2].pid == proc.pid
    assert "cannot schedule" not in json.dumps([v.to_dict() for v in verdicts])


def test_a_wait_begun_on_a_running_unit_reads_its_run_at_once(idle_process, fake_nvml):
    proc = idle_process
    runner = RestartScript(proc.pid, [("active", "running", "new")])
    probe = HostProbe(config(unit="vllm-k26.service", url="http://127.0.0.1:%d" % closed_port()),
                      runner=runner, nvml=fake_nvml)
    look = probe.snapshot(0.0)
    assert look.earlier_run is None and look.http is not None and runner.journal_reads == 1
    # Its first read filters by this run alone; the old run's writer is learnt from its own lines.
    assert look.log_lines == ["INFO: Started server process [%d]" % proc.pid]


def test_a_single_look_at_a_stopping_unit_reports_it_as_it_is(fake_nvml):
    """The status playbook's look (timeout 0) is not a wait for a next run: it reads the stopping unit."""
    stopping = ("deactivating", "stop-sigterm", "old")
    runner = RestartScript(os.getpid(), [stopping])
    probe = HostProbe(config(unit="vllm-k26.service", url="http://127.0.0.1:%d" % closed_port(), timeout=0),
                      runner=runner, nvml=fake_nvml)
    look = probe.snapshot(0.0)
    assert look.earlier_run is None and look.unit["ActiveState"] == "deactivating" and look.http is not None
    assert runner.journal_reads == 1
