"""The failure notification's script (roles/model_service/files/modelwake-notify-failure) on the
controller: the payload from the launcher's real verdict lines, the POST to a real loopback receiver,
and its failures, with the URL in no output. systemctl and journalctl answers are scripted (no
systemd here); the guest test (tests/integration/test_failure_notify_guest.py) runs it under systemd.
"""
import importlib.machinery
import importlib.util
import io
import json
import os
import subprocess
import sys

import pytest

from ansible_collections.modelwake.serving.plugins.module_utils.launcher import exit_codes, supervisor
from ansible_collections.modelwake.serving.plugins.module_utils.readiness.phases import FAILED, STALLED, TIMEOUT
from tests.helpers import ROOT, launcher_package
from tests.helpers.http_server import Server

SCRIPT = os.path.join(ROOT, "roles", "model_service", "files", "modelwake-notify-failure")
TOKEN = "whk-3c1d9e-secret"


def load_script():
    loader = importlib.machinery.SourceFileLoader("modelwake_notify_failure", SCRIPT)
    spec = importlib.util.spec_from_loader(loader.name, loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


notify = load_script()


def test_the_script_reads_the_launchers_contract():
    assert notify.LOG_PREFIX == supervisor.LOG_PREFIX
    assert set(notify.VERDICT_PHASES) == {FAILED, STALLED, TIMEOUT}


@pytest.fixture(scope="module")
def crash_log(tmp_path_factory):
    """What the real launcher writes to the journal when its engine crashes before it is ready."""
    pythonpath = launcher_package.install(str(tmp_path_factory.mktemp("launcher")))
    engine = ("import sys, time; time.sleep(0.5); print('Loading safetensors checkpoint shards:   3% Completed'); "
              "print('Traceback (most recent call last):'); print('  File \"loader.py\", line 9, in load'); "
              "print('torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB'); sys.exit(1)")
    proc = subprocess.run([sys.executable, "-m", "modelwake", "launch", "--url", "http://127.0.0.1:9",
                           "--poll-interval", "0.2", "--stall-timeout", "30", "--", sys.executable, "-c", engine],
                          env=dict(os.environ, PYTHONPATH=pythonpath), stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, universal_newlines=True, timeout=60)
    assert proc.returncode == exit_codes.EXIT_FAILED, proc.stderr
    # journalctl -o cat: the engine's teed output and the launcher's own lines, one journal entry each.
    return proc.stdout.splitlines() + proc.stderr.splitlines()


def test_the_verdict_and_its_evidence_come_from_the_launchers_lines(crash_log):
    verdict, evidence = notify.verdict_and_evidence(crash_log)
    assert verdict.startswith("failed: ") and "CUDA out of memory" in verdict, crash_log
    assert any("torch.OutOfMemoryError: CUDA out of memory" in line for line in evidence), evidence
    assert not any(line.startswith("modelwake:") for line in evidence)


def test_without_a_verdict_the_journals_tail_is_the_evidence():
    lines = ["line %d" % n for n in range(50)] + ["modelwake: engine started as pid 7: python -m x"]
    verdict, evidence = notify.verdict_and_evidence(lines)
    assert verdict is None and evidence == lines[-notify.TAIL_LINES:]


def test_the_payload_holds_the_units_end():
    state = {"Result": "start-limit-hit", "ExecMainCode": "1", "ExecMainStatus": "3", "NRestarts": "4",
             "ActiveState": "failed", "StatusText": ""}
    lines = ["modelwake: stalled: no progress for 600 s in phase loading", "modelwake:   | Loading 45%",
             "modelwake: engine exit status 143; exiting 4 so that Restart= applies"]
    payload = notify.build_payload("sglang-k26.service", "k26-1", state, lines, 1796000000)
    assert payload == {
        "unit": "sglang-k26.service", "host": "k26-1", "result": "start-limit-hit", "exit_code": "exited",
        "exit_status": 3, "restarts": 4, "active_state": "failed", "status_text": None,
        "verdict": "stalled: no progress for 600 s in phase loading", "evidence": ["Loading 45%"],
        "time": "2026-11-30T00:53:20Z"}


class Scripted(object):
    """systemctl show and journalctl as a systemd host answers them."""

    def __init__(self, journal):
        self.journal = journal
        self.calls = []

    def __call__(self, argv, timeout=30):
        self.calls.append(argv)
        if argv[0] == "systemctl":
            return 0, "Result=exit-code\nExecMainCode=1\nExecMainStatus=3\nNRestarts=1\nActiveState=failed\nStatusText=\n"
        return 0, "\n".join(self.journal) + "\n"


@pytest.fixture
def receiver():
    srv = Server()
    yield srv
    srv.close()


def run_main(tmp_path, url, journal, timeout=5):
    url_file = tmp_path / "failure-webhook.url"
    url_file.write_text(url + "\n")
    out, err = io.StringIO(), io.StringIO()
    run = Scripted(journal)
    code = notify.main(["--url-file", str(url_file), "--timeout", str(timeout), "sglang-k26.service"],
                       run=run, now=lambda: 1796000000, out=out, err=err)
    return code, out.getvalue(), err.getvalue(), run


def test_one_post_to_the_webhook_with_the_verdict(tmp_path, receiver, crash_log):
    path = "/hooks/" + TOKEN
    receiver.routes[("POST", path)] = (204, b"")
    code, out, err, run = run_main(tmp_path, receiver.url + path, crash_log)
    assert code == 0, err
    assert len(receiver.seen) == 1
    posted = receiver.seen[0]
    assert posted["headers"]["Content-Type"] == "application/json"
    body = posted["body"]
    assert body["unit"] == "sglang-k26.service" and body["result"] == "exit-code" and body["exit_status"] == 3
    assert body["verdict"].startswith("failed: ") and body["evidence"]
    assert ["journalctl", "-u", "sglang-k26.service", "-n", "400", "-o", "cat", "--no-pager"] in run.calls
    assert out.startswith("modelwake-notify-failure: posted the failure of sglang-k26.service (failed: ")
    assert TOKEN not in out + err + json.dumps(body)


def test_a_webhook_that_refuses_or_hangs_is_said_once_without_its_url(tmp_path, receiver):
    path = "/hooks/" + TOKEN
    receiver.routes[("POST", path)] = (500, {"error": "down"})
    code, _out, err, _run = run_main(tmp_path, receiver.url + path, [])
    assert code == 1 and "answered HTTP 500" in err and TOKEN not in err
    receiver.routes[("POST", path)] = "hang"
    code, _out, err, _run = run_main(tmp_path, receiver.url + path, [], timeout=0.3)
    assert code == 1 and "could not be reached" in err and TOKEN not in err and receiver.url not in err
    assert len(receiver.seen) == 2  # one try each, no retry


def test_an_unreadable_or_bad_url_file_is_a_clear_error(tmp_path):
    err = io.StringIO()
    assert notify.main(["--url-file", str(tmp_path / "missing.url"), "x.service"], run=Scripted([]), err=err) == 2
    assert "url-file: cannot read" in err.getvalue()
    code, _out, err, _run = run_main(tmp_path, "ftp://example.test/" + TOKEN, [])
    assert code == 2 and "does not hold one http:// or https:// URL" in err and TOKEN not in err
