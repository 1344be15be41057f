"""The ranks' stacks as evidence: real py-spy on the real simulated engine, through real Ansible.

The simulator's `spin` fault is a busy-waiting collective: every rank but the last spins forever
inside one native call (one core each, no memory touched, no output), the last parks elsewhere.
Without its stacks such a tree looks busy and was only ever caught by the overall timeout; with
them it is `stalled` within stall_timeout + 2 polls + a read, the message naming where each rank
is. The opposite shape, `--repack-seconds`, is legitimate silent work: layer after layer a long
native call from one line on a fresh buffer; it must stay progress for far longer than
stall_timeout. py-spy is the controller venv's (requirements.txt), found next to the engine's
interpreter as on a deployed host.
"""
import json
import time

import pytest

from tests.helpers.simharness import SimRunner, make_model
from tests.integration.test_module_sim import REACHED, attached, module

pytestmark = pytest.mark.slow

POLL = 1
STALL = 8
# The verdict's bound: stall_timeout after the last other progress, plus the silent look that
# asks for a read, the read, and the look that sees it unchanged.
BOUND = STALL + 3 * POLL + 2
FAST = ["--start-seconds", "1", "--load-rate-mib", "32", "--init-seconds", "1", "--warmup-seconds", "1"]


@pytest.fixture()
def sims(tmp_path):
    runner = SimRunner(tmp_path, FAST)
    yield runner
    runner.stop_all()


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return make_model(tmp_path_factory.mktemp("model") / "m", size_mib=32, shards=8)


def wait(sim, engine, **extra):
    options = dict(engine=engine, log_path=sim.log_path, timeout=120, stall_timeout=STALL, poll_interval=POLL)
    options.update(extra)
    return options


def stalled_ranks(run, extra=0):
    """The stalled result, declared within BOUND (+ the start before the fault fired, + `extra`)."""
    assert run.rc != 0 and run.result["phase"] == "stalled", run
    assert run.result["elapsed"] <= BOUND + 10 + extra, run
    return run.result


# vLLM's shape and the initializing phase: the real vLLM's stopped worker (test_vllm_deploy.py) and
# the spin under the launcher (test_launcher.py); each spinning rank costs a core, so one case here.
@pytest.mark.parametrize("engine, phase, tp", [("sglang", "loading", 3)])
def test_ranks_spinning_in_a_collective_are_stalled_and_the_odd_one_named(sims, model, engine, phase, tp):
    sim = sims.start(engine, model, "--tp", str(tp), "--disable-cuda-graph", "--fault", "spin:%s" % phase,
                     "--fault-after", "0.5")
    run = attached(sim, **wait(sim, engine))
    result = stalled_ranks(run)
    msg = result["msg"]
    assert "in phase %s" % phase in msg, msg
    assert "goes to frames that have not moved, nor touched new memory" in msg, msg
    spinners = "TP0-%d" % (tp - 2) if tp > 2 else "TP0"
    assert ("the ranks' stacks: %s in all_reduce (modelwake_sim/ranks.py:" % spinners) in msg, msg
    assert ("TP%d in hang (modelwake_sim/ranks.py:" % (tp - 1)) in msg, msg
    if tp >= 3:
        assert "- the odd one out" in msg, msg
    ranks = dict((s["rank"], s) for s in result["stacks"] if s["rank"] is not None)
    assert sorted(ranks) == list(range(tp))
    assert ranks[0]["frames"][0]["function"] == "all_reduce" and ranks[0]["state"] == "R"
    assert ranks[0]["same_for"] >= STALL - 2
    assert result["where"].startswith(spinners + " in all_reduce")


def test_a_rank_spinning_after_ready_is_stalled_not_timed_out(sims, model):
    sim = sims.start("sglang", model, "--fault", "spin:ready", "--fault-after", "1")
    sim.wait_log(REACHED["sglang"]["ready"], timeout=60)
    time.sleep(2.0)  # --fault-after plus one turn of the serving loop: TP0 spins, requests hang
    # The completion hangs (the first try costs its timeout, later ones a poll each).
    run = module(sim.url, sim.pid, **wait(sim, "sglang", timeout=90, completion_timeout=5))
    result = stalled_ranks(run, extra=5)
    assert "TP0 in all_reduce (modelwake_sim/ranks.py:" in result["msg"], result["msg"]
    assert "POST /v1/completions" in result["evidence"][0]


def test_silent_repack_from_one_call_site_on_fresh_memory_is_progress(sims, model, tmp_path):
    progress = str(tmp_path / "progress.jsonl")
    # 24 s of repack, layers of ~2 s (calibrated at the start: on a machine that gets busier, a
    # layer can take several times that), stall_timeout 12: twice stall_timeout of frames that do
    # not change, and still a margin for a layer's new memory to show within it.
    sim = sims.start("sglang", model, "--repack-seconds", "24", "--repack-layer-seconds", "2",
                     "--disable-cuda-graph")
    run = attached(sim, **wait(sim, "sglang", progress_path=progress, stall_timeout=12))
    assert run.rc == 0 and run.result["phase"] == "ready", run
    phases = dict((p["phase"], p["duration"]) for p in run.result["phases"])
    assert phases["initializing"] >= 20, run.result["phases"]
    with open(progress) as handle:
        looks = [json.loads(line) for line in handle]
    read = [look for look in looks if look["snapshot"]["stacks"]]
    assert len(read) >= 6  # read at the silent looks of the repack
    during = [look["verdict"]["where"] for look in looks if "repack_marlin_weights" in look["verdict"]["where"]]
    assert any(w.startswith("TP0 in repack_marlin_weights (modelwake_sim/ranks.py:") for w in during), during[-3:]
    # The frames stood still for more than stall_timeout: their page faults kept it progress.
    longest = max(s["in_function_for"] for look in read for s in look["verdict"]["stacks"] if s["rank"] == 0)
    assert longest > 12, longest


def test_without_py_spy_everything_works_and_the_result_says_why_once(sims, model):
    sim = sims.start("sglang", model, "--init-seconds", "4", "--disable-cuda-graph")
    run = attached(sim, **wait(sim, "sglang", py_spy="/nonexistent/py-spy"))
    assert run.rc == 0 and run.result["phase"] == "ready", run
    warnings = [line for line in run.output.splitlines() if "stacks unavailable" in line]
    assert len(warnings) == 1 and "/nonexistent/py-spy is not an executable file" in warnings[0], run.output[-3000:]
    assert run.result["stacks"] == [] and run.result["where"] == ""

