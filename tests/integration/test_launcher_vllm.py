"""The launcher with the REAL vLLM CPU build as its child (one start: ~20-70 s on 2 cores), with
NOTIFY_SOCKET pointing at the test's own socket: READY=1 only once a real completion works."""
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

from ansible_collections.modelwake.serving.plugins.module_utils.host import procfs

import launcher_package
from notify_listener import NotifyListener
from realengine import ROOT, tiny_model, vllm_cpu, vllm_python  # noqa: F401 (pytest fixtures)

pytestmark = pytest.mark.slow


def test_real_vllm_under_the_launcher_is_ready_only_after_a_completion(vllm_python, tiny_model, tmp_path):  # noqa: F811
    listener = NotifyListener()
    port = vllm_cpu.free_port()
    url = "http://127.0.0.1:%d" % port
    argv = ([sys.executable, "-m", "modelwake", "launch", "--url", url, "--engine", "vllm", "--model", vllm_cpu.SERVED_NAME,
             "--model-path", tiny_model, "--poll-interval", "1", "--stall-timeout", "180", "--stop-timeout", "15", "--"]
            + vllm_cpu.serve_command(tiny_model, port, enforce_eager=True))
    assert "--dtype" in argv and "float32" in argv  # required on this machine (AMX), see docs/testing.md
    env = vllm_cpu.engine_env()
    env.update(PYTHONPATH=launcher_package.install(str(tmp_path / "launcher")), NOTIFY_SOCKET=listener.address)
    out_path, err_path = str(tmp_path / "stdout.log"), str(tmp_path / "stderr.log")
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        launcher = subprocess.Popen(argv, stdout=out, stderr=err, env=env, start_new_session=True)
    seen = {}
    engine_pid = None
    try:
        ready = None
        deadline = time.monotonic() + 400
        while ready is None and time.monotonic() < deadline and launcher.poll() is None:
            for pid, info in procfs.tree([launcher.pid]).items():
                seen[pid] = info["starttime"]
            ready = listener.wait_for("READY", 1.0)
        stderr = open(err_path, encoding="utf-8", errors="replace").read()
        assert ready is not None, stderr[-3000:]
        engine_pid = int(re.search(r"engine started as pid (\d+)", stderr).group(1))
        request = urllib.request.Request(url + "/v1/completions", data=json.dumps(
            {"model": vllm_cpu.SERVED_NAME, "prompt": "2+2=", "max_tokens": 4, "temperature": 0}).encode(),
            headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as answer:
            assert answer.status == 200 and "choices" in json.loads(answer.read().decode())
        statuses = [value for _t, value in listener.fields("STATUS")]
        assert statuses[0].startswith("starting") and re.match(r"ready in \d+", statuses[-1]), statuses
        assert listener.fields("EXTEND_TIMEOUT_USEC")
        out = open(out_path, encoding="utf-8", errors="replace").read()
        # vLLM's own lines went through the launcher's stdout (the journal under systemd).
        assert "Application startup complete." in out and "Loading weights took" in out
        # A start of a minute or more reads "ready in 1m23s" (a loaded machine): any duration.
        assert re.search(r"modelwake: ready in [\dhms]+ \(ready after \d+ s: a completion for model 'tiny-llama'",
                         stderr), stderr[-3000:]
        launcher.send_signal(signal.SIGTERM)
        assert launcher.wait(60) == 0
        survivors = [pid for pid, start in seen.items()
                     if (procfs.read_process(pid) or {}).get("starttime") == start
                     and not procfs.is_gone(procfs.read_process(pid))]
        assert survivors == []
    finally:
        for pgid in (launcher.pid, engine_pid):
            if pgid:
                try:
                    os.killpg(pgid, signal.SIGKILL)
                except OSError:
                    pass
        launcher.wait(30)
        listener.close()
