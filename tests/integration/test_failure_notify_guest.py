"""Failure notifications and status as data, on a real systemd guest (systemd 252), without a deploy.

One guest gets, through the model_service role's own tasks file (tasks/failure_notify.yml), the
template unit modelwake-notify-failure@.service, its script, the root-only URL file and the
OnFailure= drop-in, for a small unit that fails the way the launcher does (its verdict line and
evidence, exit 3) under Restart=always with a start limit of 2. A receiver listens on the guest's
own loopback. Checked: systemd 252 starts the notification only when the unit enters the failed
state (its start limit hit), not at the auto-restart before; the POST holds the verdict and its
evidence; the URL is in a 0600 root file and in neither `systemctl cat`, the journal nor the play's
output; a re-run changes nothing. Then playbooks/status.yml writes its look at that unit as JSON
(-e modelwake_status_json), without the catalog's API key. Last, the journal's runs: a unit restarted
while journald is held back, so that the old run's last words are read after the new run began (and
tagged with its id, as a busy journald does): the wait's look at the new run is not failed by them.
And a wait begun while a restart's stop still drains (the old server answering HTTP) judges the new run.
The guest is destroyed afterwards.
"""
import json
import os
import shutil
import subprocess
import time

import pytest

from tests.helpers import ANSIBLE, ANSIBLE_PLAYBOOK as PLAYBOOK, ROOT, until
from tests.helpers.guesthost import guest_sh, host_tool
GUEST = "mwf-%d" % (os.getpid() % 100000)
UNIT = "mwf-dummy"
PORT = 18080
TOKEN = "whk-9e2f-guest-secret"
URL = "http://127.0.0.1:%d/hooks/%s" % (PORT, TOKEN)
API_KEY = "mwf-catalog-key-51c0"
RECEIVED = "/var/lib/mwf-received"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0 or shutil.which("systemd-nspawn") is None,
                       reason="test hosts need root and systemd-nspawn (make system-deps)"),
]

PLAY = """
- name: Install the failure notification of one unit
  hosts: model_hosts
  gather_facts: false
  tasks:
    - name: Run the role's failure notification tasks
      ansible.builtin.include_role:
        name: modelwake.serving.model_service
        tasks_from: failure_notify.yml
      vars:
        model_service_unit: %s
        model_service_failure_webhook_url: "%s"
""" % (UNIT, URL)

# The launcher's way to fail (plugins/module_utils/launcher/supervisor.py, _give_up): its verdict, the
# evidence, then exit 3 so that Restart= applies. Two starts within the limit: the second fails it.
DUMMY_UNIT = """[Unit]
Description=a model unit that fails as the launcher does
StartLimitIntervalSec=600
StartLimitBurst=2

[Service]
ExecStart=/bin/sh -c 'echo "modelwake: engine started as pid 7"; \\
echo "modelwake: failed: the engine crashed before it was ready (exit status 1): torch.OutOfMemoryError: CUDA out of memory"; \\
echo "modelwake:   | torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"; \\
echo "modelwake: engine exit status 1; exiting 3 so that Restart= applies"; exit 3'
Restart=always
RestartSec=1
RestartPreventExitStatus=2
SyslogIdentifier=%s
""" % UNIT

# The receiver: each POST's body to its own file, 204 to the sender. It logs nothing: its own request
# lines in the journal would show the URL the test looks for.
RECEIVER = r"""
import http.server, os, sys
class H(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get('Content-Length') or 0))
        n = len(os.listdir(sys.argv[1]))
        with open(os.path.join(sys.argv[1], '%d-%s.json' % (n, self.path.replace('/', '_'))), 'wb') as f:
            f.write(body)
        self.send_response(204)
        self.end_headers()
http.server.HTTPServer(('127.0.0.1', int(sys.argv[2])), H).serve_forever()
"""


def on_guest(command, check=True, stdin=None):
    return guest_sh(GUEST, command, check=check, stdin=stdin)


@pytest.fixture(scope="module")
def guest(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("mwf")
    try:
        host_tool("up", GUEST)
        inventory = {"all": {
            "children": {"model_hosts": {"hosts": {GUEST: {"ansible_host": host_tool("addr", GUEST)}}}},
            "vars": {
                "ansible_user": "root", "ansible_ssh_private_key_file": host_tool("key"),
                "ansible_ssh_common_args": "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR",
                "ansible_python_interpreter": "/usr/bin/python3",
                "modelwake_host_models": ["dummy"],
                "modelwake_models": {"dummy": {"engine": "sglang", "unit": UNIT, "port": 30009,
                                               "model_path": "/srv/models/dummy", "api_key": API_KEY}},
            }}}
        (tmp / "inventory.json").write_text(json.dumps(inventory))
        (tmp / "notify.yml").write_text(PLAY)
        yield tmp
    finally:
        host_tool("down", GUEST, check=False)


def play(tmp, playbook, *args):
    proc = subprocess.run([PLAYBOOK, "-i", str(tmp / "inventory.json"), playbook, "--diff", "-v"] + list(args),
                          cwd=ROOT, env=ansible_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          universal_newlines=True, timeout=600)
    return proc.returncode, proc.stdout


def ansible_env():
    return dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_NOCOLOR="1",
                ANSIBLE_FORCE_COLOR="0")


def test_a_unit_that_enters_the_failed_state_is_posted_once_with_its_verdict(guest):
    rc, out = play(guest, str(guest / "notify.yml"))
    assert rc == 0, out
    assert TOKEN not in out
    assert on_guest("stat -c '%a %U %G' /etc/modelwake/failure-webhook.url") == "600 root root"
    on_guest("mkdir -p %s && cat > /etc/systemd/system/%s.service && systemctl daemon-reload" % (RECEIVED, UNIT),
             stdin=DUMMY_UNIT)
    on_guest("systemd-run --unit=mwf-receiver python3 -c %s %s %d"
             % ("'" + RECEIVER.replace("'", "'\\''") + "'", RECEIVED, PORT))
    until("the receiver listening", lambda: on_guest("ss -ltn 'sport = :%d' | grep -c LISTEN" % PORT, check=False) == "1",
          timeout=30)
    on_guest("systemctl start %s" % UNIT, check=False)
    until("the failed state", lambda: on_guest("systemctl is-failed %s" % UNIT, check=False) == "failed", timeout=60)
    until("the POST", lambda: on_guest("ls %s" % RECEIVED), timeout=60)
    until("the notification's end", lambda: on_guest(
        "systemctl show modelwake-notify-failure@%s.service -p ActiveState --value" % UNIT) in ("inactive", "failed"),
        timeout=60)
    posts = on_guest("ls %s" % RECEIVED).split()
    # The first start failed and was restarted (no notification: systemd 252 skips OnFailure= while
    # Restart= applies); the restart after the second was refused by the start limit (2 starts): the
    # unit entered the failed state, with the result of its last run, and one POST went out.
    assert posts == ["0-_hooks_%s.json" % TOKEN], posts
    state = dict(line.split("=", 1) for line in on_guest(
        "systemctl show %s -p NRestarts -p Result" % UNIT).splitlines())
    assert state == {"NRestarts": "2", "Result": "exit-code"}, state
    body = json.loads(on_guest("cat %s/%s" % (RECEIVED, posts[0])))
    print(json.dumps(body, indent=1))
    assert body["unit"] == UNIT + ".service" and body["host"] == on_guest("hostname")
    assert body["result"] == "exit-code" and body["exit_status"] == 3 and body["restarts"] == 2
    assert body["exit_code"] == "exited" and body["active_state"] == "failed"
    assert body["verdict"].startswith("failed: the engine crashed before it was ready"), body
    assert body["evidence"] == ["torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"], body
    assert on_guest("systemctl show modelwake-notify-failure@%s.service -p Result --value" % UNIT) == "success"
    # The URL is in its root-only file only.
    shown = on_guest("systemctl cat %s modelwake-notify-failure@%s.service" % (UNIT, UNIT))
    assert "OnFailure=modelwake-notify-failure@%n.service" in shown and "--url-file /etc/modelwake/failure-webhook.url" in shown
    journal = on_guest("journalctl -o cat --no-pager")
    assert "posted the failure of %s.service (failed: the engine crashed" % UNIT in journal
    assert TOKEN not in shown and TOKEN not in journal
    # Nothing to change on a second run: no reload, no write.
    rc, out = play(guest, str(guest / "notify.yml"))
    assert rc == 0 and "changed=0" in out, out


def test_status_writes_its_looks_as_json_without_the_api_key(guest, tmp_path):
    # The failing unit of the test above (written again: this test may run alone), failed or never started.
    on_guest("test -e /etc/systemd/system/{0}.service || (cat > /etc/systemd/system/{0}.service && systemctl daemon-reload)"
             .format(UNIT), stdin=DUMMY_UNIT)
    on_guest("mkdir -p /srv/models/dummy && echo '{}' > /srv/models/dummy/config.json && "
             "head -c 4096 /dev/urandom > /srv/models/dummy/model-00001-of-00001.safetensors")
    path = tmp_path / "status.json"
    rc, out = play(guest, "playbooks/status.yml", "-e", "modelwake_status_json=%s" % path)
    assert rc == 0, out
    looks = json.loads(path.read_text())
    print(json.dumps(looks, indent=1)[:2000])
    assert [(look["host"], look["unit"], look["model"]) for look in looks] == [(GUEST, UNIT + ".service", "dummy")]
    look = looks[0]
    assert look["phase"] in ("failed", "not_started") and look["msg"], look
    assert {"elapsed", "evidence", "phases", "restarts", "bytes_read"} <= set(look), sorted(look)
    assert API_KEY not in path.read_text() and API_KEY not in out
    assert "invocation" not in look


# A server that dies the way vLLM does when systemd stops it during its start: a traceback ending in
# KeyboardInterrupt (vLLM's SIGTERM handler) and the engine's exception, then exit.
LAST_WORDS_SERVER = r"""
import signal, sys, time
print("INFO: modelwake test server starting", flush=True)
def stopped(*args):
    print("Traceback (most recent call last):")
    print("KeyboardInterrupt: terminated")
    print("Exception: WorkerProc initialization failed due to an exception in a background process.", flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, stopped)
while True:
    time.sleep(1)
"""
RUNS_UNIT = "mwf-runs"


def journal_entries(unit):
    return [json.loads(line) for line in on_guest("journalctl -u %s -o json --no-pager" % unit).splitlines()]


def test_a_restarted_runs_late_last_words_do_not_fail_the_new_runs_wait(guest):
    on_guest("cat > /usr/local/bin/mwf-runs.py", stdin=LAST_WORDS_SERVER)
    on_guest("cat > /etc/systemd/system/%s.service && systemctl daemon-reload && systemctl restart %s"
             % (RUNS_UNIT, RUNS_UNIT), stdin="[Service]\nExecStart=/usr/bin/python3 /usr/local/bin/mwf-runs.py\n")
    until("the first run's line", lambda: "starting" in on_guest("journalctl -u %s -o cat --no-pager" % RUNS_UNIT))
    old = on_guest("systemctl show %s -p InvocationID --value" % RUNS_UNIT)
    time.sleep(2)  # journald re-reads a writer's unit and run after 1 s: the old run's next lines get the current one
    # journald held back while systemd stops the old run (its last words wait in their socket) and
    # starts the new one; read once let go, they are tagged with the new run's id. Signalled by its pid:
    # systemctl kill signals the unit's whole cgroup, which fails inside a test host on some kernels (CI's).
    journald = on_guest("systemctl show -p MainPID --value systemd-journald")
    on_guest("kill -STOP %s" % journald)
    try:
        on_guest("systemctl restart %s" % RUNS_UNIT)
        new = on_guest("systemctl show %s -p InvocationID --value" % RUNS_UNIT)
    finally:
        on_guest("kill -CONT %s" % journald)
    until("the new run's line", lambda: [e for e in journal_entries(RUNS_UNIT)
                                         if e.get("_SYSTEMD_INVOCATION_ID") == new and "starting" in e["MESSAGE"]])
    entries = journal_entries(RUNS_UNIT)
    old_pid = [e["_PID"] for e in entries if e.get("_SYSTEMD_INVOCATION_ID") == old][0]
    last_words = [e for e in entries if e["MESSAGE"] == "KeyboardInterrupt: terminated"]
    # What the reader has to see through: the old run's process, its last words under another run's id.
    assert [(e["_PID"], e.get("_SYSTEMD_INVOCATION_ID")) for e in last_words] in ([(old_pid, new)], [(old_pid, None)]), \
        (old, new, [(e["_PID"], e.get("_SYSTEMD_INVOCATION_ID"), e["MESSAGE"]) for e in entries])
    proc = subprocess.run([ANSIBLE, "-i", str(guest / "inventory.json"), GUEST, "-o", "-m", "wait_for_model_ready",
                           "-a", json.dumps({"unit": RUNS_UNIT + ".service", "url": "http://127.0.0.1:30019",
                                             "engine": "vllm", "timeout": 0})],
                          cwd=ROOT, env=ansible_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          universal_newlines=True, timeout=300)
    look = json.loads(proc.stdout.split(" => ", 1)[1])
    assert look["phase"] == "starting" and "KeyboardInterrupt" not in json.dumps(look), look
    on_guest("systemctl stop %s" % RUNS_UNIT)


# A server that drains the way vLLM does on SIGTERM with --shutdown-timeout: its API server serves on,
# answering /health and /v1/models, while a new completion finds the engine shut down (vLLM prints
# "RuntimeError: cannot schedule new futures after shutdown"); it exits after the drain. A new run
# loads for 3 s, then answers.
DRAINING_SERVER = r"""
import http.server, json, os, signal, threading, time
draining = threading.Event()
print("INFO: modelwake test server starting, pid %d" % os.getpid(), flush=True)
class Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass
    def answer(self, code, body):
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
    def do_GET(self):
        self.answer(200, {"object": "list", "data": [{"id": "drainer"}]} if self.path == "/v1/models" else {})
    def do_POST(self):
        if draining.is_set():
            print("Traceback (most recent call last):", flush=True)
            print("RuntimeError: cannot schedule new futures after shutdown", flush=True)
            self.answer(500, {"error": "cannot schedule new futures after shutdown"})
        else:
            self.answer(200, {"choices": [{"text": " 4"}]})
def drain(*args):
    print("[shutdown] API server: stopping engine client mode=drain timeout=8s", flush=True)
    draining.set()
    threading.Timer(8, os._exit, (0,)).start()
signal.signal(signal.SIGTERM, drain)
time.sleep(3)
http.server.ThreadingHTTPServer(("127.0.0.1", 30021), Handler).serve_forever()
"""
DRAIN_UNIT = "mwf-drain"


def test_a_wait_begun_during_a_restarts_drain_judges_the_next_run(guest):
    """The restart handler does not block (a notify unit would hold it for the whole load): the wait
    can begin while the old run still drains and answers HTTP. Its story begins at the new run."""
    on_guest("cat > /usr/local/bin/mwf-drain.py", stdin=DRAINING_SERVER)
    on_guest("cat > /etc/systemd/system/%s.service && systemctl daemon-reload && systemctl restart %s"
             % (DRAIN_UNIT, DRAIN_UNIT),
             # The stop ends after its server (a launcher's own cleanup, a container's removal): a look then
             # finds no process while the old run's error is the journal's last word.
             stdin="[Service]\nExecStart=/usr/bin/python3 /usr/local/bin/mwf-drain.py\nTimeoutStopSec=30\n"
                   "ExecStopPost=/bin/sleep 3\n")
    url = "http://127.0.0.1:30021"
    answering = ("python3 -c \"import urllib.request\ntry: print(urllib.request.urlopen('%s/health', timeout=3).status)"
                 "\nexcept Exception: print('000')\"" % url)
    until("the first run answering", lambda: on_guest(answering) == "200")
    old_pid = on_guest("systemctl show %s -p MainPID --value" % DRAIN_UNIT)
    on_guest("systemctl restart --no-block %s" % DRAIN_UNIT)
    until("the old run draining", lambda: on_guest("systemctl show %s -p ActiveState --value" % DRAIN_UNIT)
          == "deactivating", timeout=10)
    progress = "/tmp/mwf-drain-progress.jsonl"
    proc = subprocess.run([ANSIBLE, "-i", str(guest / "inventory.json"), GUEST, "-o", "-m", "wait_for_model_ready",
                           "-a", json.dumps({"unit": DRAIN_UNIT + ".service", "url": url, "engine": "vllm",
                                             "timeout": 90, "poll_interval": 1, "progress_path": progress})],
                          cwd=ROOT, env=ansible_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          universal_newlines=True, timeout=300)
    result = json.loads(proc.stdout.split(" => ", 1)[1])
    new_pid = on_guest("systemctl show %s -p MainPID --value" % DRAIN_UNIT)
    looks = [json.loads(line) for line in on_guest("cat %s" % progress).splitlines()]
    on_guest("systemctl stop %s" % DRAIN_UNIT)
    assert result["phase"] == "ready" and str(result["pid"]) == new_pid != old_pid, result
    assert "cannot schedule" not in json.dumps(result), result
    first = looks[0]["verdict"]
    assert first["phase"] == "not_started" and ("the earlier run of %s.service (pid %s) is still stopping"
                                                % (DRAIN_UNIT, old_pid)) in first["msg"], first
    # The draining server was never asked: its answers are not this start's.
    stopping = [look for look in looks if look["snapshot"]["earlier_run"]]
    assert stopping and all(look["snapshot"]["http"] is None for look in stopping), stopping
