"""The module itself: input validation through AnsibleModule, check mode, and docs = argument spec."""
import importlib
import json
import os
import subprocess
import sys

import pytest
import yaml

from ansible_collections.modelwake.serving.plugins.modules import wait_for_model_ready as module
from ansible_collections.modelwake.serving.plugins.module_utils.readiness.config import WaitConfig, build_config
from tests.helpers.modules import AnsibleExitJson, AnsibleFailJson, call_main, patch_exits


@pytest.fixture(autouse=True)
def patched_module(monkeypatch):
    patch_exits(monkeypatch)


def run(args, expect=AnsibleExitJson):
    return call_main(module.main, args, expect)


SERVER = r"""
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()
srv = http.server.HTTPServer(("127.0.0.1", 0), H)
print(srv.server_address[1], flush=True)
srv.serve_forever()
"""


@pytest.fixture(scope="module")
def server():
    proc = subprocess.Popen([sys.executable, "-c", SERVER], stdout=subprocess.PIPE, universal_newlines=True)
    port = int(proc.stdout.readline())
    yield proc.pid, "http://127.0.0.1:%d" % port
    proc.kill()
    proc.wait()


SECRET = "sk-module-test-7d1e"


@pytest.mark.parametrize("args,field", [
    ({"url": "not a url"}, "url"),
    ({"url": "ftp://127.0.0.1/"}, "url"),
    ({"url": "http://127.0.0.1:99999"}, "url"),
    ({"url": "http://"}, "url"),
    ({"timeout": -1}, "timeout"),
    ({"stall_timeout": 0}, "stall_timeout"),
    ({"stall_timeout": -5}, "stall_timeout"),
    ({"poll_interval": 0}, "poll_interval"),
    ({"poll_interval": -1.5}, "poll_interval"),
    ({"completion_timeout": 0}, "completion_timeout"),
    ({"completion_timeout": -30}, "completion_timeout"),
    ({"pid": 0}, "pid"),
    ({"pid": 2 ** 22 + 11}, "pid"),
    ({"expected_bytes": -1}, "expected_bytes"),
    ({"gpus": [0, -1]}, "gpus"),
    ({"model_path": "/nonexistent/Kimi-K2.6"}, "model_path"),
    ({"progress_path": "/nonexistent-dir/progress.jsonl"}, "progress_path"),
    ({"unit": "bad unit name"}, "unit"),
])
def test_bad_input_fails_at_once_naming_the_field(server, args, field):
    pid, url = server
    full = {"url": url, "pid": pid, "timeout": 0, "api_key": SECRET}
    full.update(args)
    if "unit" in args:
        del full["pid"]
    result = run(full, AnsibleFailJson)
    assert result["msg"].startswith(field + ":"), result["msg"]
    assert result["elapsed"] == 0 and result["phase"] == "failed"
    assert SECRET not in json.dumps(result)


@pytest.mark.parametrize("url,local", [
    ("http://127.0.0.1:30001", True), ("http://127.0.0.2:8000", True), ("http://[::1]:8000", True),
    ("http://localhost:8000", True), ("http://0.0.0.0:8000", True), ("http://10.0.0.5:8000", False),
    ("https://k26.example.org", False),
])
def test_which_urls_let_the_port_owner_be_checked(url, local):
    assert WaitConfig(url=url, pid=1).url_is_local() is local


@pytest.mark.parametrize("given,used", [({}, 30), ({"completion_timeout": 7}, 7)])
def test_completion_timeout_reaches_the_wait(server, given, used):
    pid, url = server
    assert build_config(dict({"url": url, "pid": pid}, **given)).completion_timeout == used


def test_model_path_without_weights(server, tmp_path):
    pid, url = server
    result = run({"url": url, "pid": pid, "model_path": str(tmp_path)}, AnsibleFailJson)
    assert result["msg"].startswith("model_path:") and "holds no weight files" in result["msg"]


@pytest.mark.parametrize("args,words", [
    ({"unit": "x.service"}, "exactly one of unit and pid is required (got both)"),
    ({"pid": None}, "exactly one of unit and pid is required (got neither)"),
    ({"engine": "tgi"}, "value of engine must be one of: sglang, vllm, auto"),
    ({"ready_check": "ping"}, "value of ready_check must be one of: completion, health, models"),
    ({"timeout": "soon"}, "timeout"),
])
def test_argument_spec_rules(server, args, words):
    pid, url = server
    full = {"url": url, "pid": pid, "timeout": 0}
    full.update(args)
    full = dict((k, v) for k, v in full.items() if v is not None)
    result = run(full, AnsibleFailJson)
    assert words in result["msg"]
    if "unit and pid" in words:
        # Our own check, so that it returns what every failure returns (AnsibleModule's type and
        # choices errors get them from the action plugin: test_action_plugin.py).
        assert (result["phase"], result["elapsed"]) == ("failed", 0)


def test_look_once_at_a_real_server_returns_its_phase(server, tmp_path):
    pid, url = server
    weights = tmp_path / "model-00001-of-00001.safetensors"
    weights.write_bytes(b"\0" * 4096)
    result = run({"url": url, "pid": pid, "timeout": 0, "ready_check": "health", "model_path": str(tmp_path),
                  "api_key": SECRET})
    assert result["phase"] == "ready" and result["changed"] is False and result["elapsed"] == 0
    assert result["pid"] == pid and result["restarts"] == 0
    assert [p["phase"] for p in result["phases"]] == ["ready"]
    assert SECRET not in json.dumps(result)
    # Not ready by the default check (no completion endpoint): the current phase, still no failure.
    result = run({"url": url, "pid": pid, "timeout": 0})
    assert result["phase"] == "initializing" and "HTTP /health 200" in result["msg"]


def test_check_mode_looks_once_and_never_waits(server):
    pid, url = server
    result = run({"url": url, "pid": pid, "timeout": 0, "ready_check": "health", "_ansible_check_mode": True})
    assert result["phase"] == "ready" and result["changed"] is False
    # Not ready (no completion endpoint) with an hour's timeout: one look, the phase, no failure.
    result = run({"url": url, "pid": pid, "timeout": 3600, "_ansible_check_mode": True})
    assert result["phase"] == "initializing" and result["elapsed"] == 0 and not result.get("failed")


# -- Secrets and the agreed result ----------------------------------------------------------------
# That DOCUMENTATION, RETURN and the argument spec agree is ansible-test sanity's (validate-modules).

FRAGMENTS = "ansible_collections.modelwake.serving.plugins.doc_fragments."


def documented_options(doc):
    """The module's options with those of its doc fragments (the module's own win, as in ansible-doc)."""
    options = {}
    for name in doc.get("extends_documentation_fragment", []):
        fragment = importlib.import_module(FRAGMENTS + name.rsplit(".", 1)[-1])
        options.update(yaml.safe_load(fragment.ModuleDocFragment.DOCUMENTATION)["options"])
    options.update(doc.get("options") or {})
    return options


DOC_OPTIONS = documented_options(yaml.safe_load(module.DOCUMENTATION))


def test_secrets_are_no_log_and_documented_as_never_logged():
    secret_like = [n for n in module.ARGUMENT_SPEC if "key" in n or "token" in n or "password" in n]
    assert secret_like == ["api_key"]
    assert module.ARGUMENT_SPEC["api_key"].get("no_log") is True
    assert "Never logged" in " ".join(DOC_OPTIONS["api_key"]["description"])


def test_return_documents_every_agreed_key():
    returned = yaml.safe_load(module.RETURN)
    agreed = {"phase", "elapsed", "phases", "msg", "evidence", "bytes_read", "read_rate", "eta", "gpu", "restarts", "pid"}
    assert agreed <= set(returned)

