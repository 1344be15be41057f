"""playbooks/benchmark.yml (completion_load) run by real Ansible against the real simulated engine on loopback."""
import json
import os
import subprocess
import sys
import urllib.request

import pytest

from ansible_collections.modelwake.serving.plugins.modules import completion_load
from bench import simrun
from tests.helpers import ANSIBLE_PLAYBOOK as PLAYBOOK, ROOT
from tests.helpers.simharness import make_model

ENV = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_NOCOLOR="1")
FAST = ["--start-seconds", "0.2", "--init-seconds", "0.3", "--warmup-seconds", "0.2", "--load-rate-mib", "200",
        "--token-seconds", "0.01", "--no-access-log", "--served-model-name", "k26-sim"]


@pytest.fixture(scope="module")
def ready_sim(tmp_path_factory):
    base = tmp_path_factory.mktemp("bench")
    model = make_model(str(base / "model"), 8, 4)
    run = simrun.SimRun("vllm", model, str(base / "sim.log"), FAST).start()
    try:
        assert run.wait_for("Application startup complete.", 60), "the sim never became ready: %s" % run.lines[-5:]
        yield run
    finally:
        run.stop()


def test_playbook_reports_every_level_and_writes_json_and_plot(ready_sim, tmp_path):
    inventory = tmp_path / "hosts"
    inventory.write_text("bench-local ansible_connection=local ansible_python_interpreter=%s\n" % sys.executable)
    extra = {"modelwake_deploy_hosts": "bench-local", "modelwake_benchmark_url": ready_sim.url,
             "modelwake_benchmark_levels": [1, 4, 16], "modelwake_benchmark_requests_per_level": 16,
             "modelwake_benchmark_max_tokens": 8, "modelwake_benchmark_out": str(tmp_path / "out")}
    proc = subprocess.run([PLAYBOOK, "-i", str(inventory), os.path.join(ROOT, "playbooks", "benchmark.yml"),
                           "-e", json.dumps(extra)], cwd=ROOT, env=ENV, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, universal_newlines=True, timeout=300)
    assert proc.returncode == 0, proc.stdout
    assert "concurrency  tokens/s" in proc.stdout
    result = json.loads((tmp_path / "out" / "throughput-bench-local.json").read_text())
    assert result["model"] == "k26-sim"  # asked of /v1/models
    levels = result["levels"]
    assert [level["concurrency"] for level in levels] == [1, 4, 16]
    for level in levels:
        assert level["errors"] == 0 and level["ok"] == level["requests"] == 16
        assert level["completion_tokens"] == 16 * 8
        assert 0 < level["latency_p50"] <= level["latency_p90"] <= level["latency_p99"]
    # The sim decodes one token for every running request per step: more in flight, more tokens/s.
    assert levels[1]["tokens_per_s"] > 2 * levels[0]["tokens_per_s"]
    assert levels[2]["tokens_per_s"] > 2 * levels[1]["tokens_per_s"]
    assert (tmp_path / "out" / "throughput-bench-local.png").read_bytes()[:4] == b"\x89PNG"


def test_a_level_is_bounded_in_time(ready_sim):
    level = completion_load.run_level(ready_sim.url, "k26-sim", None, concurrency=2, requests=10000, max_tokens=4,
                                      prompt="hello", level_timeout=1.0, request_timeout=10)
    assert 0 < level["requests"] < 10000 and level["errors"] == 0
    assert level["seconds"] < 1.0 + 2.0  # the last requests sent before the deadline finish


def test_errors_are_counted_not_raised(ready_sim):
    level = completion_load.run_level(ready_sim.url, "no-such-model", None, concurrency=2, requests=4, max_tokens=4,
                                      prompt="hello", level_timeout=10, request_timeout=10)
    assert level["ok"] == 0 and level["errors"] == 4 and level["latency_p50"] is None
    assert "HTTP Error 404" in level["error_samples"][0]
    with urllib.request.urlopen(ready_sim.url + "/health", timeout=5) as answer:
        assert answer.status == 200  # the server is unharmed
