"""wait_for_model_ready's view of a Type=notify unit run by the launcher: `activating` with a
StatusText is a start in progress (its phase named by the status), not a failure; the status is
one more signal; the launcher's own process is not the server's progress; the launcher's last
status is part of a failure's message."""
import os
import subprocess
import sys

import pytest

from ansible_collections.modelwake.serving.plugins.module_utils.host import procfs, systemd
from ansible_collections.modelwake.serving.plugins.module_utils.readiness.probe import HostProbe

from tests.helpers.network import free_port as closed_port
from tests.helpers.traces import config, http, replay, Trace
from tests.unit.test_probe import fake_nvml  # noqa: F401 (pytest fixture)

UNIT = "sglang-k26.service"


def notify_unit(status, active="activating", sub="start", restarts=0, main_pid=100, result="success"):
    return {"ActiveState": active, "SubState": sub, "MainPID": main_pid, "NRestarts": restarts, "Type": "notify",
            "StatusText": status, "Result": result, "ExecMainStatus": None, "LoadState": "loaded"}





@pytest.mark.parametrize("cmdline, expected", [
    ("/opt/modelwake/venv/bin/python /opt/modelwake/lib/modelwake-launch --url http://127.0.0.1:30001 -- x", True),
    ("python3 -m modelwake launch --url http://127.0.0.1:30001 -- x", True),
    ("/opt/modelwake/venv/bin/python -m modelwake_sim serve --engine sglang", False),
    ("python -m sglang.launch_server --model-path /srv/modelwake-launcher-test", False),
    ("", False),
])
def test_the_launcher_is_recognised_by_its_command_line(cmdline, expected):
    assert systemd.is_launcher(cmdline) is expected


def test_an_activating_notify_unit_with_a_silent_engine_is_loading_not_failed_nor_stalled():
    """No log line, no CPU, no reads the module can see (say, the journal is unreadable): the
    launcher's status names the phase and its changes are progress."""
    trace = Trace(pids=(100, 101))
    cfg = config(unit=UNIT, engine="sglang", stall_timeout=60, poll_interval=5)
    snaps = [trace.step(0, unit=notify_unit("starting the engine"))]
    for i, t in enumerate(range(5, 200, 5)):
        snaps.append(trace.step(t, unit=notify_unit("loading %d%% (%d/64 shards)" % (i * 100 // 64, i))))
    verdicts = replay(cfg, snaps)
    phases = [v.phase for _t, v in verdicts]
    assert phases[0] == "starting" and set(phases[1:]) == {"loading"}
    assert not any(v.terminal for _t, v in verdicts)
    assert "systemd status 'loading" in verdicts[-1][1].last_progress["what"]


def test_an_unchanging_status_is_no_progress():
    trace = Trace(pids=(100, 101))
    cfg = config(unit=UNIT, engine="sglang", stall_timeout=60, poll_interval=5)
    snaps = [trace.step(t, unit=notify_unit("loading 40% (26/64 shards)")) for t in range(0, 100, 5)]
    verdicts = replay(cfg, snaps)
    assert verdicts[-1][1].phase == "stalled" and verdicts[-1][0] == 60


def test_a_status_whose_only_change_is_the_stacks_age_is_no_progress():
    """The launcher's STATUS= ends with where the ranks are and for how long: that grows at every
    look of a hang, and must not keep it alive (a SIGSTOPped worker under a notify unit)."""
    trace = Trace(pids=(100, 101))
    cfg = config(unit=UNIT, engine="sglang", stall_timeout=60, poll_interval=5)
    snaps = [trace.step(t, unit=notify_unit("initializing: Load weight end (since 0s) | VLLM::Worker (pid 101) state T "
                                            "(stopped) in load_weights (loader.py:449) for %ds" % t))
             for t in range(0, 100, 5)]
    verdicts = replay(cfg, snaps)
    assert verdicts[-1][1].phase == "stalled" and verdicts[-1][0] == 60


def test_the_launchers_last_status_is_in_the_failure_message():
    trace = Trace(pids=(100, 101))
    cfg = config(unit=UNIT, engine="sglang", stall_timeout=600, poll_interval=5)
    snaps = [trace.step(0, cpu=1.0, unit=notify_unit("loading 40% (26/64 shards)")),
             trace.step(5, alive=False, unit=notify_unit("stalled: no progress for 600 s in phase loading",
                                                         active="activating", sub="auto-restart", main_pid=0,
                                                         result="exit-code"))]
    verdicts = replay(cfg, snaps)
    verdict = verdicts[-1][1]
    assert verdict.phase == "failed"
    assert 'status "stalled: no progress for 600 s in phase loading"' in verdict.msg


LAUNCHER_LIKE = r"""
import subprocess, sys
# The engine in a session of its own, as the launcher starts it.
child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE,
                         start_new_session=True)
n = 0
for i in range(3000000):  # the launcher's own work: HTTP probes, nvidia-smi, reading /proc
    n += i
print(child.pid, flush=True)
sys.stdin.read()
child.stdin.close()
child.wait()
"""


class NotifySystemd(object):
    """Scripted systemctl/journalctl: a notify unit whose MainPID is a real launcher-like process."""

    def __init__(self, main_pid):
        self.main_pid = main_pid

    def __call__(self, argv, timeout=30):
        if argv[0] == "systemctl":
            return 0, ("ActiveState=activating\nSubState=start\nMainPID=%d\nNRestarts=0\nType=notify\n"
                       "StatusText=loading 12%% (8/64 shards)\nLoadState=loaded\nInvocationID=inv1\n"
                       "ControlGroup=/system.slice/nowhere-%d.service\n" % (self.main_pid, os.getpid())), ""
        if argv[0] == "journalctl":
            return 0, "", ""
        return 127, "", "not scripted"


def test_the_probe_counts_the_engine_under_the_launcher_not_the_launcher(fake_nvml):  # noqa: F811
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER_LIKE, "/opt/modelwake/lib/modelwake-launch"],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, universal_newlines=True)
    try:
        engine_pid = int(launcher.stdout.readline())
        cfg = config(unit=UNIT, url="http://127.0.0.1:%d" % closed_port())
        snap = HostProbe(cfg, runner=NotifySystemd(launcher.pid), nvml=fake_nvml).snapshot(0.0)
        assert snap.process.pids == [engine_pid] and snap.process.alive is True
        launcher_cpu = procfs.read_process(launcher.pid)["own_ticks"] / float(procfs.CLK_TCK)
        assert launcher_cpu >= 0.1
        assert snap.process.cpu_seconds < launcher_cpu  # the engine's start-up only
        assert snap.unit["StatusText"] == "loading 12% (8/64 shards)"
    finally:
        launcher.stdin.close()
        launcher.wait()


# A launcher reading its engine's stacks: on "start", a py-spy-like tool that works (in the launcher's
# session, as run_command runs it) and waits; on "stop", the tool ends and is reaped. Its engine, in
# a session of its own, sleeps (a stopped worker, a hang).
LAUNCHER_READING_STACKS = r"""
import subprocess, sys
engine = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE,
                          start_new_session=True)
print(engine.pid, flush=True)
tool = None
for line in sys.stdin:
    if line.strip() == "start":
        tool = subprocess.Popen([sys.executable, "-c", "import sys\nn = 0\nfor i in range(3000000): n += i\n"
                                 "print(flush=True)\nsys.stdin.read()"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        tool.stdout.readline()  # its work is done
        print(tool.pid, flush=True)
    else:
        tool.stdin.close()
        tool.wait()
        print("reaped", flush=True)
engine.stdin.close()
engine.wait()
"""


class AccountedNotifySystemd(NotifySystemd):
    """A notify unit whose cgroup accounting is what the kernel counts: all CPU of the launcher's
    processes, reaped children's included, read from /proc at each `systemctl show`."""

    def __call__(self, argv, timeout=30):
        rc, out, err = NotifySystemd.__call__(self, argv, timeout)
        if argv[0] == "systemctl":
            ticks = sum(info["own_ticks"] + info["child_ticks"] for info in procfs.tree([self.main_pid]).values())
            out += "CPUUsageNSec=%d\n" % (ticks * 10 ** 9 // procfs.CLK_TCK)
        return rc, out, err


def test_the_launchers_stack_reads_are_neither_the_engines_processes_nor_its_progress(fake_nvml):  # noqa: F811
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER_READING_STACKS, "/opt/modelwake/lib/modelwake-launch"],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, universal_newlines=True)

    def say(word):
        launcher.stdin.write(word + "\n")
        launcher.stdin.flush()
        return launcher.stdout.readline().strip()

    try:
        engine_pid = int(launcher.stdout.readline())
        runner = AccountedNotifySystemd(launcher.pid)
        probe = HostProbe(config(unit=UNIT, url="http://127.0.0.1:%d" % closed_port()), runner=runner, nvml=fake_nvml)
        first = probe.snapshot(0.0)
        assert first.process.pids == [engine_pid]
        tool_pid = int(say("start"))
        # A look while the tool runs: it is not one of the server's processes, its work not the server's.
        during = probe.snapshot(2.0)
        assert during.process.pids == [engine_pid], during.process
        assert during.process.cpu_seconds - first.process.cpu_seconds < 0.05, during.process
        assert procfs.read_process(tool_pid)["own_ticks"] / float(procfs.CLK_TCK) >= 0.1
        assert say("stop") == "reaped"
        # Reaped into the launcher: the cgroup still holds its work, the server's figures do not.
        after = probe.snapshot(4.0)
        assert int(after.unit["CPUUsageNSec"]) / 1e9 - probe.accounting.first[2] >= 0.1
        assert after.process.cpu_seconds - first.process.cpu_seconds < 0.05, after.process
    finally:
        launcher.stdin.close()
        launcher.wait()


def test_a_notify_unit_is_ready_only_once_systemd_has_its_ready_notification():
    """The completion may answer a look before the launcher's own look sends READY=1: ready
    must not run ahead of `systemctl start` and of the units ordered After= the model."""
    trace = Trace(pids=(100, 101))
    cfg = config(unit=UNIT, engine="sglang", stall_timeout=600, poll_interval=5)
    answering = http(health=200, models=200, completion=200, ready=True, model="m")
    snaps = [trace.step(0, cpu=1.0, unit=notify_unit("initializing: warm-up")),
             trace.step(5, cpu=1.0, http_result=answering, unit=notify_unit("initializing: warm-up")),
             trace.step(10, cpu=1.0, http_result=answering,
                        unit=notify_unit("ready in 9s", active="active", sub="running"))]
    verdicts = replay(cfg, snaps)
    assert [v.phase for _t, v in verdicts] == ["initializing", "initializing", "ready"]
    assert "waits for its launcher's READY=1" in verdicts[1][1].msg


def test_a_plain_unit_is_ready_as_soon_as_the_completion_answers():
    trace = Trace(pids=(100, 101))
    cfg = config(unit=UNIT, engine="sglang", stall_timeout=600, poll_interval=5)
    unit = dict(notify_unit(""), Type="simple", ActiveState="active", SubState="running")
    answering = http(health=200, models=200, completion=200, ready=True, model="m")
    verdicts = replay(cfg, [trace.step(0, cpu=1.0, http_result=answering, unit=unit)])
    assert verdicts[0][1].phase == "ready"
