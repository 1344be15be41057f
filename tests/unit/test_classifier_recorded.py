"""The classifier replaying REAL vLLM CPU starts recorded in tests/fixtures/traces/.

Each recording holds the server's exact log bytes and 1-second samples of its process tree
(ticks, reaped-children ticks, read_bytes, states) and of /health. The replay feeds them through
the same pieces the module uses (logs.split_records, procfs.TreeCounter, the Classifier).
"""
import json
import os

import pytest

from ansible_collections.modelwake.serving.plugins.module_utils.host import logs, procfs
from ansible_collections.modelwake.serving.plugins.module_utils.readiness.classifier import Classifier
from ansible_collections.modelwake.serving.plugins.module_utils.readiness.snapshot import Snapshot

from tests.helpers import FIXTURES
from tests.helpers.traces import config, http, phases_seen

TRACES = os.path.join(FIXTURES, "traces")


def recorded(case):
    """Snapshots of a recording: one per sample, plus the `ready` event as a passing completion."""
    with open(os.path.join(TRACES, "vllm-%s.log" % case), "rb") as handle:
        log = handle.read()
    with open(os.path.join(TRACES, "vllm-%s.jsonl" % case)) as handle:
        rows = [json.loads(line) for line in handle]
    root = rows[0]["pid"]
    counter = procfs.TreeCounter()
    offset, partial = 0, b""
    http_now = http("refused")
    for row in rows:
        if row.get("event") == "ready":
            yield Snapshot(t=row["t"], process=last_process, http=http(200, models=200, completion=200, ready=True, model="tiny-llama"))
            continue
        if "procs" not in row:
            continue
        # The log up to the row's newline count: the bytes a tailer would have read by then.
        end = offset
        for _ in range(row["log_lines"] - log.count(b"\n", 0, offset)):
            end = log.index(b"\n", end) + 1
        lines, partial = logs.split_records(partial + log[offset:end])
        offset = end
        procs = dict((p["pid"], {"pid": p["pid"], "starttime": 0, "own_ticks": p["cpu"], "child_ticks": p["ccpu"],
                                 "read_bytes": p.get("read_bytes"), "state": p["state"]}) for p in row["procs"])
        alive = "exit" not in row
        cpu, read_bytes = counter.update(procs if alive else {})
        last_process = {"root_pid": root, "alive": alive, "pids": sorted(procs) if alive else [],
                        "cpu_seconds": cpu, "read_bytes": read_bytes,
                        "states": dict((str(p), i["state"]) for p, i in procs.items()) if alive else {}}
        if "health" in row:
            http_now = http(row["health"])
        elif row.get("health_error") == "TimeoutError":
            http_now = http("timeout")
        else:
            http_now = http("refused")
        yield Snapshot(t=row["t"], process=last_process, log_lines=lines, http=http_now)


def module_recorded(name):
    """Snapshots the module itself took on a real host (its progress_path file, verdicts dropped)."""
    with open(os.path.join(TRACES, name)) as handle:
        for line in handle:
            yield Snapshot.from_dict(json.loads(line))


def run(case, snapshots=None, **overrides):
    cfg = config(**dict({"engine": "auto"}, **overrides))
    classifier = Classifier(cfg)
    verdicts = []
    for snap in snapshots if snapshots is not None else recorded(case):
        verdict = classifier.observe(snap)
        verdicts.append((snap.t, verdict))
        if verdict.terminal or verdict.phase == "ready":
            break
    return verdicts


def test_real_start_with_19_s_of_silent_compilation_is_never_stalled():
    # stall_timeout 10 s: shorter than the silence; the g++ time in cutime is the progress.
    verdicts = run("start", stall_timeout=10)
    t_end, final = verdicts[-1]
    assert final.phase == "ready" and t_end == pytest.approx(46.08)
    assert final.engine == "vllm"
    seen = [p["phase"] for p in final.phases]
    assert seen[0] == "starting" and seen[-1] == "ready" and "loading" in seen and "initializing" in seen
    silent = [v for t, v in verdicts if 26 <= t <= 44]
    assert silent and all(v.phase == "initializing" for v in silent)
    assert any("CPU" in v.last_progress["what"] for v in silent)


# The tiny model's weights (tools/vllm_cpu.py make-model --tiny): what model_path gives expected_bytes.
TINY_WEIGHTS = 1520272


@pytest.mark.parametrize("followed_log", [False, True])
def test_real_start_phases_follow_its_log_exactly(followed_log):
    # The log shows `Starting to load model` (24 s), the shard bar and `Loading weights took` (25 s)
    # and reads of 144 MiB then: loading is justified; before it only imports, after it compilation.
    extra = {"log_path": "/var/log/vllm.log"} if followed_log else {}
    verdicts = run("start", stall_timeout=10, expected_bytes=TINY_WEIGHTS, **extra)
    assert phases_seen(verdicts) == ["starting", "loading", "initializing", "ready"]
    starts = dict((p["phase"], p["start"]) for p in verdicts[-1][1].phases)
    assert starts == {"starting": 0.0, "loading": 24.0, "initializing": 25.0, "ready": 46.1}


def test_real_cold_start_imports_are_starting_and_phases_never_go_backwards():
    # The module's own looks (poll 1 s, pid, log file, model_path of the 1.5 MB tiny model) at a
    # real start on a loaded machine with a cold page cache: 12 s of imports reading 400 MB before
    # the first engine line, the EngineCore's and Worker's imports later, `Starting to load model`
    # at +46 s, the shard bar at +47 s. It once said starting, initializing, starting, initializing.
    verdicts = run(None, module_recorded("vllm-start-module.jsonl"), engine="vllm", pid=8847,
                   log_path="/var/log/vllm.log", expected_bytes=TINY_WEIGHTS, poll_interval=1,
                   stall_timeout=120, timeout=600)
    final = verdicts[-1][1]
    assert final.phase == "ready"
    assert [(p["phase"], p["start"]) for p in final.phases] == [
        ("starting", 0.0), ("loading", 46.3), ("initializing", 47.4), ("ready", 73.7)]
    busy_imports = [v for t, v in verdicts if t < 12]
    assert all(v.phase == "starting" for v in busy_imports)
    assert any("read_bytes" in v.last_progress["what"] for v in busy_imports)


def test_real_start_with_its_ranks_stacks_shows_what_each_process_does():
    # Recorded by the module (py-spy 0.4.1 from the vLLM venv, poll 2 s) watching a real vLLM CPU
    # start with empty compile caches: during the long silent compilation the Worker's stack stands
    # in subprocess.communicate, waiting for inductor's g++ children. That is work (the children's
    # CPU and the changing process tree), so a stall_timeout far below the silence never fires.
    verdicts = run(None, module_recorded("vllm-start-stacks.jsonl"), engine="vllm", pid=6054,
                   log_path="/var/log/vllm.log", poll_interval=2, stall_timeout=15, timeout=600)
    final = verdicts[-1][1]
    assert final.phase == "ready"
    starting = [v for _t, v in verdicts if v.phase == "starting" and v.stacks]
    initializing = [v for _t, v in verdicts if v.phase == "initializing" and v.stacks]
    assert starting and initializing
    # The API server, the engine core and the worker, each with its frames.
    names = set(s["name"] for v in initializing for s in v.stacks)
    assert {"python", "VLLM::EngineCore", "VLLM::Worker"} <= names
    compiling = [v for v in initializing for s in v.stacks if s["name"] == "VLLM::Worker"
                 and [f["function"] for f in s["frames"]] == ["communicate", "run", "_run_compile_cmd"]]
    assert compiling, [v.where for v in initializing]
    assert "VLLM::Worker (pid 8685) in communicate (subprocess.py:1196)" in compiling[-1].where
    longest = max(s["in_function_for"] for v in initializing for s in v.stacks if s["name"] == "VLLM::Worker")
    assert longest > 15  # in one function longer than stall_timeout, and not stalled


def test_real_truncated_shard_fails_with_the_safetensor_error_first():
    t_end, final = run("truncated-shard")[-1]
    assert final.phase == "failed" and t_end <= 25
    assert "SafetensorError: Error while deserializing header: incomplete metadata" in final.evidence[0]
    assert "SafetensorError" in final.msg
    assert "Found ulimit" not in " ".join(final.evidence[:1])  # a WARNING that mentions OSError is not it


def test_real_missing_config_fails_with_the_validation_error():
    t_end, final = run("no-config")[-1]
    assert final.phase == "failed" and t_end <= 8.5
    assert "ValidationError: 1 validation error for ModelConfig" in final.evidence[0]


def test_real_port_in_use_fails_with_errno_98():
    t_end, final = run("port-in-use")[-1]
    assert final.phase == "failed" and t_end <= 8
    assert "OSError: [Errno 98] Address already in use" in final.evidence[0]
