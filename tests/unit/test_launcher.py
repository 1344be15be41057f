"""The launcher's pure parts: status texts, Prometheus text, options, and what systemd hears
after each look, replayed through wait_for_ready with a fake clock and a real notify socket."""
import os
import socket
import stat
import uuid

import pytest

from ansible_collections.modelwake.serving.plugins.module_utils.readiness.verdict import Verdict
from ansible_collections.modelwake.serving.plugins.module_utils.common.errors import ModelWakeError
from ansible_collections.modelwake.serving.plugins.module_utils.launcher.cli import API_KEY_ENV, build_launch_config, engine_environment, parse_args
from ansible_collections.modelwake.serving.plugins.module_utils.launcher.reporter import Reporter
from ansible_collections.modelwake.serving.plugins.module_utils.launcher.textfile import prometheus_text, write_textfile
from ansible_collections.modelwake.serving.plugins.module_utils.launcher.notify import Notifier
from ansible_collections.modelwake.serving.plugins.module_utils.readiness.config import build_config
from ansible_collections.modelwake.serving.plugins.module_utils.readiness.waiter import wait_for_ready

from tests.helpers.traces import K26_EXPECTED_BYTES, MIB, FakeClock, ReplayProbe, config, http, k26_start

def test_prometheus_text_has_one_gauge_per_phase_and_the_load_numbers():
    verdict = Verdict(phase="loading", msg="", bytes_read=1234, fraction=0.5, eta=60.0, since=10.0)
    text = prometheus_text('sglang-"k26".service', verdict, 1764480010.5, expected_load=930)
    lines = text.splitlines()
    name = 'name="sglang-\\"k26\\".service"'
    assert 'modelwake_phase{%s,phase="loading"} 1' % name in lines
    assert 'modelwake_phase{%s,phase="ready"} 0' % name in lines
    assert sum(1 for line in lines if line.startswith("modelwake_phase{")) == 8
    assert "# TYPE modelwake_read_bytes_total counter" in lines
    assert 'modelwake_read_bytes_total{%s} 1234' % name in lines
    assert 'modelwake_load_ratio{%s} 0.5' % name in lines
    assert 'modelwake_load_eta_seconds{%s} 60.0' % name in lines
    assert 'modelwake_phase_start_timestamp_seconds{%s} 1764480010.5' % name in lines
    assert 'modelwake_load_expected_seconds{%s} 930' % name in lines


def test_prometheus_text_leaves_out_what_is_unknown():
    lines = prometheus_text("sglang-k26.service", Verdict(phase="starting", msg=""), 1764480000.0).splitlines()
    families = sorted(set(line.split()[2] for line in lines if line.startswith("# TYPE ")))
    assert families == ["modelwake_phase", "modelwake_phase_start_timestamp_seconds"]


def test_textfile_is_replaced_atomically(tmp_path):
    path = str(tmp_path / "modelwake.prom")
    assert write_textfile(path, "a 1\n") is None
    assert write_textfile(path, "a 2\n") is None
    assert open(path).read() == "a 2\n"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o644
    assert os.listdir(str(tmp_path)) == ["modelwake.prom"]  # no temporary file left
    assert "could not be written" in write_textfile(str(tmp_path / "missing" / "x.prom"), "a 1\n")


class Receiver(object):
    """The test's own notify socket, drained after each look: fields filed under the fake time."""

    def __init__(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.address = "@modelwake-test-%s" % uuid.uuid4().hex
        self.sock.bind("\0" + self.address[1:])
        self.sock.setblocking(False)
        self.log = []  # (t, field)

    def drain(self, t):
        while True:
            try:
                data = self.sock.recv(65536)
            except BlockingIOError:
                return
            self.log.extend((t, field) for field in data.decode("utf-8").split("\n"))

    def times(self, key):
        return [t for t, field in self.log if field.startswith(key + "=")]

    def values(self, key):
        return [field.split("=", 1)[1] for _t, field in self.log if field.startswith(key + "=")]


@pytest.fixture
def receiver():
    got = Receiver()
    yield got
    got.sock.close()


WALL_START = 1764480000.0  # the wall clock when the replayed start began


def replay_start(receiver, story, cfg, textfile=None):
    clock = FakeClock()
    probe = ReplayProbe(clock, lambda trace, t: story[t])
    reporter = Reporter(Notifier({"NOTIFY_SOCKET": receiver.address}), clock, extend_seconds=cfg.stall_timeout + 40,
                        name="sglang-k26.service", textfile=textfile, wall_clock=lambda: WALL_START)
    verdicts = {}

    def on_snapshot(snap, verdict):
        reporter.on_snapshot(snap, verdict)
        receiver.drain(snap.t)
        verdicts[snap.t] = verdict

    result = wait_for_ready(cfg, probe, clock=clock, sleep=clock.sleep, on_snapshot=on_snapshot)
    return result, verdicts


def test_a_k26_start_tells_systemd_each_phase_extends_while_progressing_and_ready_once(receiver, tmp_path):
    story = dict((snap.t, snap) for snap in k26_start(poll=10))
    cfg = config(engine="sglang", poll_interval=10, stall_timeout=300, expected_bytes=K26_EXPECTED_BYTES)
    textfile = str(tmp_path / "k26.prom")
    result, verdicts = replay_start(receiver, story, cfg, textfile=textfile)
    assert result["phase"] == "ready"
    statuses = receiver.values("STATUS")
    assert statuses[0].startswith("starting")
    assert any(s.startswith("loading ") and "MiB/s" in s and "ETA" in s for s in statuses)
    assert any(s.startswith("initializing") for s in statuses)
    assert statuses[-1] == "ready in 20m50s"
    # READY=1 once, at the look whose completion passed, never before.
    assert receiver.times("READY") == [1250]
    assert verdicts[1250].phase == "ready"
    # Every look with progress pushed systemd's deadline: never more than one budget apart.
    extends = receiver.times("EXTEND_TIMEOUT_USEC")
    assert set(receiver.values("EXTEND_TIMEOUT_USEC")) == {"340000000"}
    assert extends[0] == 0 and max(b - a for a, b in zip(extends, extends[1:])) <= 10
    # A status at least every 30 s while starting, even when the text does not change.
    status_times = receiver.times("STATUS")
    assert max(b - a for a, b in zip(status_times, status_times[1:])) <= 30
    metrics = open(textfile).read().splitlines()
    assert 'modelwake_phase{name="sglang-k26.service",phase="ready"} 1' in metrics
    # The phase's start in wall-clock time: the launcher's start plus the ready verdict's own since.
    assert 'modelwake_phase_start_timestamp_seconds{name="sglang-k26.service"} %s' % (
        WALL_START + verdicts[1250].since) in metrics


def test_a_hang_stops_the_extensions_and_never_says_ready(receiver):
    """Loading progresses for 100 s, then nothing moves: no EXTEND after the last progress, the
    stalled verdict as the last status, no READY=1."""
    from tests.helpers.traces import Trace

    trace = Trace()
    story = {}
    for t in range(0, 101, 10):
        story[t] = trace.step(t, cpu=1.0, read=100 * MIB,
                              lines=["[2026-05-25 19:06:14 TP0] Load weight begin."] if t == 0 else [])
    for t in range(110, 1000, 10):
        story[t] = trace.step(t, http_result=http("refused"))
    cfg = config(engine="sglang", poll_interval=10, stall_timeout=300)
    result, _verdicts = replay_start(receiver, story, cfg)
    assert result["phase"] == "stalled"
    assert receiver.times("READY") == []
    assert max(receiver.times("EXTEND_TIMEOUT_USEC")) <= 110  # the last look that saw progress
    assert receiver.values("STATUS")[-1].startswith("stalled: no progress for 300 s in phase loading")


def test_options_need_a_command_and_a_budget_longer_than_the_stall(capsys):
    with pytest.raises(SystemExit):
        parse_args(["--url", "http://127.0.0.1:30001"])
    assert "command: give the engine command after --" in capsys.readouterr().err
    options = parse_args(["--url", "http://127.0.0.1:30001", "--stall-timeout", "60", "--poll-interval", "5",
                          "--extend-timeout", "65", "--", "python3", "-m", "x", "--flag"])
    assert options.command == ["python3", "-m", "x", "--flag"]
    with pytest.raises(ModelWakeError, match="extend-timeout: must be at least"):
        build_launch_config(options, {})


def test_the_api_key_comes_from_the_environment_and_stays_out_of_the_engine(tmp_path):
    options = parse_args(["--url", "http://127.0.0.1:30001", "--stall-timeout", "60", "--", "true"])
    cfg = build_launch_config(options, {API_KEY_ENV: "sk-secret"})
    assert cfg.api_key == "sk-secret" and "sk-secret" not in repr(cfg)
    assert options.extend_timeout == 60 + 2 * 5 + 30
    env = engine_environment({API_KEY_ENV: "k", "NOTIFY_SOCKET": "@x", "WATCHDOG_USEC": "1", "PATH": "/bin",
                              "MODELWAKE_API_KEY": "engine-key"})
    assert env == {"PATH": "/bin", "MODELWAKE_API_KEY": "engine-key"}


def test_the_wait_config_is_checked_before_the_engine_runs_and_takes_its_pid_after():
    options = parse_args(["--url", "http://127.0.0.1:30001", "--", "true"])
    cfg = build_launch_config(options, {})
    # The engine's output comes through the launcher's pipe; no process is named before it runs.
    assert cfg.follows_log and cfg.pid is None and cfg.unit is None
    started = cfg.for_started_server(4242)
    assert started.pid == 4242 and started.follows_log and cfg.pid is None
    with pytest.raises(ValueError):
        started.for_started_server(4343)
    with pytest.raises(ModelWakeError, match="^unit: "):
        build_config({"url": "http://127.0.0.1:30001", "pid": os.getpid()}, starts_server=True)


def test_bad_options_name_the_field(tmp_path):
    options = parse_args(["--url", "ftp://x", "--", "true"])
    with pytest.raises(ModelWakeError, match="^url: "):
        build_launch_config(options, {})
    options = parse_args(["--url", "http://127.0.0.1:1", "--textfile", str(tmp_path / "no" / "x.prom"), "--", "true"])
    with pytest.raises(ModelWakeError, match="^textfile: "):
        build_launch_config(options, {})
    options = parse_args(["--url", "http://127.0.0.1:1", "--expected-load-seconds", "0", "--", "true"])
    with pytest.raises(ModelWakeError, match="^expected-load-seconds: must be greater than 0"):
        build_launch_config(options, {})


def test_the_other_nodes_of_a_group_are_watched_by_name_and_address():
    options = parse_args(["--url", "http://127.0.0.1:30001", "--peer", "k26-node1=10.213.77.12", "--peer-port",
                          "50000", "--", "true"])
    cfg = build_launch_config(options, {})
    assert cfg.peers == {"k26-node1": ["10.213.77.12"]} and cfg.peer_port == 50000
    for bad in ("k26-node1", "=10.213.77.12", "k26-node1="):
        options = parse_args(["--url", "http://127.0.0.1:30001", "--peer", bad, "--peer-port", "50000", "--", "true"])
        with pytest.raises(ModelWakeError, match="^peer: give NAME=ADDRESS"):
            build_launch_config(options, {})
    options = parse_args(["--url", "http://127.0.0.1:30001", "--peer", "k26-node1=10.213.77.12", "--", "true"])
    with pytest.raises(ModelWakeError, match="^peer_port: the dist-init port"):
        build_launch_config(options, {})
