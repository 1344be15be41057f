"""The followed wait on the host side (plugins/module_utils/readiness/follow.py), with real processes:
a server, the detached wait the module leaves behind, and the controller's shell command run by sh
as a connection runs it. The Ansible side runs in tests/integration/test_live_progress.py."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from ansible_collections.modelwake.serving.plugins.module_utils.readiness import follow

from tests.helpers import ROOT, poll

# /health answers 503 until `ready_after` seconds have passed, then 200; the port on stdout.
SERVER = r"""
import http.server, sys, time
began, ready_after = time.monotonic(), float(sys.argv[1])
class H(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass
    def do_GET(self):
        self.send_response(200 if time.monotonic() - began > ready_after else 503)
        self.send_header("Content-Length", "0")
        self.end_headers()
srv = http.server.HTTPServer(("127.0.0.1", 0), H)
print(srv.server_address[1], flush=True)
srv.serve_forever()
"""

# What the module does before it returns: check the input, build the probe, start the wait.
START = r"""
import json, sys
from ansible_collections.modelwake.serving.plugins.module_utils.readiness.config import build_config
from ansible_collections.modelwake.serving.plugins.module_utils.readiness.follow import start
from ansible_collections.modelwake.serving.plugins.module_utils.readiness.probe import HostProbe
params, interval, lease = json.loads(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
config = build_config(params)
print(json.dumps(start(config, HostProbe(config), interval, lease_seconds=lease)))
"""


@pytest.fixture
def server():
    def run(ready_after):
        proc = subprocess.Popen([sys.executable, "-c", SERVER, str(ready_after)], stdout=subprocess.PIPE,
                                universal_newlines=True)
        started.append(proc)
        return proc, int(proc.stdout.readline())
    started = []
    yield run
    for proc in started:
        proc.kill()
        proc.wait()


def start_wait(proc, port, interval=1.0, lease=120.0, timeout=60):
    params = {"url": "http://127.0.0.1:%d" % port, "pid": proc.pid, "ready_check": "health", "timeout": timeout,
              "stall_timeout": 600, "poll_interval": 0.5, "completion_timeout": 5}
    began = time.monotonic()
    out = subprocess.run([sys.executable, "-c", START, json.dumps(params), str(interval), str(lease)], cwd=ROOT,
                         stdout=subprocess.PIPE, universal_newlines=True, check=True, timeout=30).stdout
    return json.loads(out), time.monotonic() - began


def read(info, interval):
    """The controller's read, as a connection runs it: one sh command."""
    command = follow.FOLLOW_COMMAND.format(interval=interval, **info)
    began = time.monotonic()
    out = subprocess.run(["/bin/sh", "-c", command], stdout=subprocess.PIPE, universal_newlines=True,
                         check=True, timeout=interval + 30).stdout
    return follow.parse_read(out, info), time.monotonic() - began


def alive(pid):
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    with open("/proc/%d/stat" % pid) as handle:
        return handle.read().rsplit(")", 1)[1].split()[0] != "Z"


def gone_within(pid, seconds):
    return poll(lambda: not alive(pid), seconds, 0.1)


def test_the_module_returns_at_once_and_the_wait_goes_on_in_a_private_detached_process(server):
    proc, port = server(ready_after=4)
    info, took = start_wait(proc, port)
    assert took < 5  # the module's process ended; the wait did not
    try:
        assert alive(info["pid"]) and info["pid"] != proc.pid
        assert os.stat(info["path"]).st_mode & 0o777 == 0o600
        assert os.stat(info["fifo"]).st_mode & 0o777 == 0o600
        # A session of its own: the connection's hang-up and signals do not reach it.
        assert os.getsid(info["pid"]) != os.getsid(0)
        (state, data), _ = read(info, 2)
        assert state == "running" and data["done"] is False and data["result"]["phase"] in ("starting", "initializing")
        assert data["boot_id"] == info["boot_id"] == follow.boot_id()
    finally:
        subprocess.run(["/bin/sh", "-c", "kill %d; %s" % (info["pid"], follow.CLEANUP_COMMAND.format(**info))])


def test_the_end_of_the_wait_wakes_the_read_at_once_and_the_process_leaves_after_the_cleanup(server):
    proc, port = server(ready_after=3)
    info, _ = start_wait(proc, port)
    (state, data), took = read(info, 60)
    assert state == "done", data
    assert took < 30  # woken by the wait's byte, not by the 60 s interval
    assert data["result"]["phase"] == "ready" and data["result"]["failed"] is False
    assert data["result"]["elapsed"] >= 2
    assert alive(info["pid"])  # it keeps the FIFO until the controller has read the verdict
    subprocess.run(["/bin/sh", "-c", follow.CLEANUP_COMMAND.format(**info)], check=True)
    assert gone_within(info["pid"], 5)
    assert not os.path.exists(info["path"]) and not os.path.exists(info["fifo"])


def test_a_wait_nobody_follows_any_more_ends_by_itself_and_leaves_nothing(server):
    proc, port = server(ready_after=600)
    info, _ = start_wait(proc, port, lease=2)
    assert gone_within(info["pid"], 15)  # no read for 2 s: the controller is gone
    assert not os.path.exists(info["path"]) and not os.path.exists(info["fifo"])


def test_reads_keep_the_lease(server):
    proc, port = server(ready_after=600)
    info, _ = start_wait(proc, port, lease=3)
    try:
        for _ in range(3):
            (state, _data), _ = read(info, 2)
            assert state == "running"
        assert alive(info["pid"])  # 6 s of reads every 2 s: longer than the lease, and still waiting
    finally:
        subprocess.run(["/bin/sh", "-c", "kill %d; %s" % (info["pid"], follow.CLEANUP_COMMAND.format(**info))])


def test_a_killed_wait_reads_as_gone_without_waiting_for_the_interval(server):
    proc, port = server(ready_after=600)
    info, _ = start_wait(proc, port)
    try:
        os.kill(info["pid"], signal.SIGKILL)
        assert gone_within(info["pid"], 5)
        (state, data), took = read(info, 2)
        assert state == "gone" and data["done"] is False
    finally:
        subprocess.run(["/bin/sh", "-c", follow.CLEANUP_COMMAND.format(**info)])


def test_parse_read_tells_a_reboot_by_the_boot_id():
    info = {"boot_id": "boot-a", "pid": 1, "path": "/x", "fifo": "/y"}
    last = json.dumps({"done": False, "result": {"phase": "loading", "elapsed": 90}})
    assert follow.parse_read("boot-b gone\n", info) == ("rebooted", None)
    assert follow.parse_read("boot-a running\n" + last, info)[0] == "running"
    assert follow.parse_read("boot-a gone\n" + last, info)[0] == "gone"
    done = json.dumps({"done": True, "result": {"phase": "ready"}})
    assert follow.parse_read("boot-a gone\n" + done, info)[0] == "done"  # the verdict counts, whoever is left


# vLLM's own lines, then the access log's lines of the wait's probes (recorded:
# tests/fixtures/traces/vllm-kill-worker.log), then SGLang's warm-up's request and the module's.
ENGINE_LINE = "INFO:     Application startup complete."
PROBE_LINES = ['INFO:     127.0.0.1:52368 - "GET /health HTTP/1.1" 200 OK',
               'INFO:     127.0.0.1:52372 - "POST /v1/completions HTTP/1.1" 200 OK',
               '[2026-11-30 04:41:07] INFO:     127.0.0.1:46884 - "GET /health HTTP/1.1" 503 Service Unavailable']


def progress_after(*looks):
    from ansible_collections.modelwake.serving.plugins.module_utils.readiness.verdict import Verdict
    from ansible_collections.modelwake.serving.plugins.module_utils.readiness.config import build_config
    from ansible_collections.modelwake.serving.plugins.module_utils.readiness.snapshot import Snapshot
    config = build_config({"url": "http://127.0.0.1:30001", "pid": os.getpid(), "ready_check": "health",
                           "timeout": 60, "stall_timeout": 600, "poll_interval": 1, "completion_timeout": 5})
    progress = follow.Progress(config, 0.0, clock=lambda: 1.0)
    for t, lines in enumerate(looks):
        progress.update(Snapshot(t=float(t), log_lines=lines), Verdict(phase="initializing", msg="initializing"))
    return progress


def test_the_quoted_log_line_is_the_engines_own_not_the_probes_access_log():
    progress = progress_after(["(APIServer pid=4307) INFO 11-30 04:44:27 [launcher.py:195] Route: /health", ENGINE_LINE]
                              + PROBE_LINES)
    assert progress.log_line == ENGINE_LINE and progress.info["log_line"] == ENGINE_LINE


def test_a_look_with_only_probe_requests_keeps_the_engines_last_line():
    progress = progress_after([ENGINE_LINE], PROBE_LINES[:1], PROBE_LINES[1:])
    assert progress.log_line == ENGINE_LINE
