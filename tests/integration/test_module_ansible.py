"""wait_for_model_ready run by real Ansible (`ansible localhost -m ...`) against real processes.

Proves the module_utils package is shipped by Ansible's module finder and that the module's
JSON is what playbooks will see. The simulated engine has its own integration tests.
"""
import json
import os
import subprocess
import sys
import time

import pytest

from tests.helpers import ANSIBLE, ROOT, poll

# A stand-in server: answers like a ready OpenAI-compatible server, or only /health 404 with
# mode "listen-only"; prints its port once listening.
SERVER = r"""
import http.server, json, sys
mode = sys.argv[1]
class H(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass
    def _send(self, code, payload):
        data = json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
    def do_GET(self):
        if mode == "ready" and self.path == "/health":
            return self._send(200, {})
        if mode == "ready" and self.path == "/v1/models":
            return self._send(200, {"data": [{"id": "tiny"}]})
        self._send(404, {"error": "not found"})
    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length))
        if mode == "ready" and self.path == "/v1/completions" and body.get("model") == "tiny":
            return self._send(200, {"choices": [{"text": " 4"}]})
        self._send(404, {"error": "not found"})
srv = http.server.HTTPServer(("127.0.0.1", 0), H)
print(srv.server_address[1], flush=True)
srv.serve_forever()
"""


@pytest.fixture
def processes():
    """Start helper processes; each is killed and reaped at the end, also after failures."""
    started = []

    def start(argv, port=False):
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, universal_newlines=True)
        started.append(proc)
        return proc, (int(proc.stdout.readline()) if port else None)

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def ansible(args, check=False, module="wait_for_model_ready"):
    """Run the module on localhost; return (rc, the module's result dict).

    By its short name (library/) the module runs alone; by its FQCN, as the roles call it, through
    its action plugin.
    """
    argv = [ANSIBLE, "localhost", "-c", "local", "-m", module, "-a", args]
    if check:
        argv.append("--check")
    proc = subprocess.run(argv, cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True, timeout=120)
    return proc.returncode, parse(proc.stdout, proc.stderr)


# ansible-core's own callback, its results as JSON: `localhost | SUCCESS => {...}`.
ENV = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_STDOUT_CALLBACK="default",
           ANSIBLE_CALLBACK_RESULT_FORMAT="json", ANSIBLE_PYTHON_INTERPRETER=sys.executable, ANSIBLE_NOCOLOR="1")


def parse(stdout, stderr=""):
    start = stdout.find("=> {")
    if start < 0:
        raise AssertionError("ansible printed no result: %s %s" % (stdout, stderr))
    return json.JSONDecoder().raw_decode(stdout[start + 3:])[0]


def test_look_once_returns_the_current_phase_of_a_listening_server(processes):
    proc, port = processes([sys.executable, "-c", SERVER, "listen-only"], port=True)
    rc, result = ansible("url=http://127.0.0.1:%d pid=%d timeout=0" % (port, proc.pid))
    assert rc == 0, result
    assert result["phase"] == "initializing" and result["elapsed"] == 0
    assert result["pid"] == proc.pid and result["changed"] is False
    assert "HTTP /health 404" in result["msg"]


def test_waits_until_a_completion_answers_and_hides_the_api_key(processes):
    proc, port = processes([sys.executable, "-c", SERVER, "ready"], port=True)
    rc, result = ansible("url=http://127.0.0.1:%d pid=%d timeout=60 api_key=sk-integration-secret" % (port, proc.pid))
    assert rc == 0, result
    assert result["phase"] == "ready"
    assert "a completion for model 'tiny' answered 200 with choices" in result["msg"]
    assert "sk-integration-secret" not in json.dumps(result)


def test_check_mode_observes_once_and_never_waits(processes):
    proc, port = processes([sys.executable, "-c", SERVER, "ready"], port=True)
    rc, result = ansible("url=http://127.0.0.1:%d pid=%d timeout=0" % (port, proc.pid), check=True)
    assert rc == 0 and result["phase"] == "ready"
    # Never ready (no completion endpoint), an hour's timeout: check mode looks once and returns.
    proc, port = processes([sys.executable, "-c", SERVER, "listen-only"], port=True)
    started = time.monotonic()
    rc, result = ansible("url=http://127.0.0.1:%d pid=%d timeout=3600" % (port, proc.pid), check=True)
    assert rc == 0 and result["phase"] == "initializing" and result["elapsed"] == 0, result
    assert time.monotonic() - started < 60


def test_idle_process_that_never_listens_is_stalled_after_stall_timeout(processes):
    proc, _ = processes([sys.executable, "-c", "import sys; sys.stdin.read()"])
    rc, result = ansible("url=http://127.0.0.1:9 pid=%d timeout=60 stall_timeout=3 poll_interval=0.5" % proc.pid)
    assert rc != 0
    assert result["phase"] == "stalled"
    assert result["msg"].startswith("stalled: no progress for 3 s in phase starting")
    assert 3 <= result["elapsed"] < 20


def test_process_that_exits_is_failed_within_a_poll(processes, tmp_path):
    # The stand-in exits once its stdin closes; the test closes it after the first look.
    proc, _ = processes([sys.executable, "-c", "import sys; sys.stdin.read()"])
    progress = tmp_path / "progress.jsonl"
    waiter = subprocess.Popen([ANSIBLE, "localhost", "-c", "local", "-m", "wait_for_model_ready", "-a",
                               "url=http://127.0.0.1:9 pid=%d timeout=60 poll_interval=0.5 progress_path=%s"
                               % (proc.pid, progress)],
                              cwd=ROOT, env=ENV, stdout=subprocess.PIPE, universal_newlines=True)
    try:
        # Until Ansible has started the module (it writes progress_path), unless Ansible ended first.
        poll(progress.exists, 60, 0.1, stop=lambda: waiter.poll() is not None)
        proc.stdin.close()  # the "server" crashes now
        crashed_at = time.monotonic()
        out, _ = waiter.communicate(timeout=120)
    finally:
        if waiter.poll() is None:
            waiter.kill()
            waiter.wait()
    result = parse(out)
    assert waiter.returncode != 0
    assert result["phase"] == "failed"
    assert "process %d exited" % proc.pid in result["msg"]
    assert time.monotonic() - crashed_at < 10
    looks = [json.loads(line) for line in progress.read_text().splitlines()]
    assert looks[0]["verdict"]["phase"] == "starting" and looks[-1]["verdict"]["phase"] == "failed"


TRACEBACK = ("[2026-05-25 19:06:14 TP0] Load weight begin. avail mem=85 GB\n"
             "Traceback (most recent call last):\n"
             '  File "/opt/sglang/model_runner.py", line 412, in load_model\n'
             "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n")


def dead_pid(log, text):
    """The pid of a real process that wrote `text` to `log` and exited before any wait began."""
    proc = subprocess.Popen([sys.executable, "-c", "import sys; open(sys.argv[1], 'a').write(sys.argv[2])", str(log), text])
    proc.wait()
    return proc.pid


def test_a_wait_begun_after_its_server_died_fails_at_once_quoting_the_log(tmp_path):
    log = tmp_path / "server.log"
    pid = dead_pid(log, TRACEBACK)
    rc, result = ansible("url=http://127.0.0.1:9 pid=%d log_path=%s timeout=60 poll_interval=0.5" % (pid, log))
    assert rc != 0 and result["phase"] == "failed", result
    assert result["msg"].startswith("failed: process %d had exited before the wait began: torch.OutOfMemoryError: "
                                    "CUDA out of memory" % pid), result["msg"]
    assert any("Traceback" in line for line in result["evidence"]), result
    assert result["elapsed"] < 10
    # No exception in the log: the process's last line is what it said.
    quiet = tmp_path / "quiet.log"
    pid = dead_pid(quiet, "[2026-05-25 19:06:14 TP0] Load weight begin. avail mem=85 GB\n")
    rc, result = ansible("url=http://127.0.0.1:9 pid=%d log_path=%s timeout=60 poll_interval=0.5" % (pid, quiet))
    assert rc != 0 and result["phase"] == "failed", result
    assert result["msg"].startswith("failed: process %d had exited before the wait began; its log ends: "
                                    "[2026-05-25 19:06:14 TP0] Load weight begin" % pid), result["msg"]


def test_a_stale_pid_of_a_server_that_serves_again_is_refused_never_failed(processes, tmp_path):
    """The negative control of the wait begun after its server died: the same evidence (the pid gone, a
    traceback in the appended log), but the server was restarted as another process and serves its port."""
    log = tmp_path / "server.log"
    stale = dead_pid(log, TRACEBACK)
    live, port = processes([sys.executable, "-c", SERVER, "ready"], port=True)
    rc, result = ansible("url=http://127.0.0.1:%d pid=%d log_path=%s model=tiny timeout=60 poll_interval=0.5"
                         % (port, stale, log))
    assert rc != 0 and result["phase"] == "failed" and result["elapsed"] == 0, result
    assert result["msg"].startswith("pid: no process with pid %d is running on this host, and pid %d (python"
                                    % (stale, live.pid)), result["msg"]
    assert "listens on port %d: give the server's current pid, or use unit" % port in result["msg"]
    rc, result = ansible("url=http://127.0.0.1:%d pid=%d log_path=%s model=tiny timeout=60 poll_interval=0.5"
                         % (port, live.pid, log))
    assert rc == 0 and result["phase"] == "ready", result


def test_bad_input_fails_at_once_with_elapsed_0():
    rc, result = ansible("url=http://127.0.0.1:30001 pid=4194300 timeout=0")
    assert rc != 0 and result["elapsed"] == 0
    assert result["msg"].startswith("pid: no process with pid 4194300")
    rc, result = ansible("url=127.0.0.1:30001 unit=x.service")
    assert rc != 0 and result["msg"].startswith("url: must be an http:// or https:// base URL")
    # Refused by AnsibleModule itself (before the module's code; the action plugin adds them), or
    # by the unit/pid check: the result still has the phase and elapsed every failure promises.
    for args, words in (("url=http://127.0.0.1:30001 pid=1 timeout=soon", "timeout"),
                        ("url=http://127.0.0.1:30001 pid=1 unit=x.service", "exactly one of unit and pid")):
        rc, result = ansible(args, module="modelwake.serving.wait_for_model_ready")
        assert rc != 0 and words in result["msg"], result
        assert (result["phase"], result["elapsed"]) == ("failed", 0), result
