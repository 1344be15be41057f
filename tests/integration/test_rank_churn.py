"""The rule "a rank that died fails the start", run by real Ansible against the simulated engine: its
negative controls, healthy starts whose process churn looks like a rank's death (`--churn`,
modelwake_sim/churn.py) and that must end ready with no look failed or stalled, and its positive
control, a rank SIGKILLed and reaped at once by its parent while its siblings park, which must end
failed within the quiet bound.

Each start is the engine's own process group, held stopped until the module's first look
(test_module_sim.attached), and writes what it did on purpose to `--churn-record` (every churn child
and how it ended; a fault's kill and its time), so each test also proves the churn really happened.
"""
import os

from tests.integration.test_arrivals import looks, model_dir, sims  # noqa: F401 (fixtures)
from tests.integration.test_module_sim import POLL, SLACK, attached, wait_args

CHURN_SECONDS = 4
# A rank that vanished with no exit status to read fails the start once nothing has moved for
# min(QUIET_BOUND, stall_timeout) after the last progress.
QUIET_BOUND = 20


def json_lines(path):
    """The lines of a JSON-lines file (the churn record, the progress looks); none if it was never written."""
    return looks(path) if os.path.exists(path) else []


def churn_start(tmp_path, sims, model_dir, kind, *extra):
    """A TP-2 SGLang start with `--churn kind`, watched from its first instant to the end: the run,
    the verdict of every look, and the churn record."""
    record, progress = str(tmp_path / "churn.jsonl"), str(tmp_path / "progress.jsonl")
    sim = sims.start("sglang", model_dir, "--tp", "2", "--churn", kind, "--churn-seconds", str(CHURN_SECONDS),
                     "--churn-record", record, *extra)
    run = attached(sim, **wait_args(sim, "sglang", progress_path=progress))
    verdicts = [look["verdict"] for look in json_lines(progress)]
    churned = [line for line in json_lines(record) if line.get("churn") == kind]
    return sim, run, verdicts, churned


def assert_ready_without_a_death(run, verdicts):
    assert run.rc == 0 and run.result["phase"] == "ready", (run.rc, run.result.get("msg"), run)
    assert verdicts, "no look recorded"
    wrong = [v["msg"] for v in verdicts if v["phase"] in ("failed", "stalled") or "died" in v["msg"]]
    assert not wrong, wrong


def test_compile_worker_churn_ends_ready(tmp_path, sims, model_dir):
    _, run, verdicts, churned = churn_start(tmp_path, sims, model_dir, "compile-workers")
    assert_ready_without_a_death(run, verdicts)
    # Two ranks, three waves of three: two forked with the rank's own title, one fork+exec'd; all exit 0.
    assert len(churned) == 18 and {c["ended"] for c in churned} == {"exit 0"}, churned
    forked = [c for c in churned if c["made"] == "fork"]
    assert len(forked) == 12 and {c["title"] for c in forked} == {"sglang::scheduler_TP0", "sglang::scheduler_TP1"}
    assert len({c["parent"] for c in churned}) == 2  # each reaped by its rank


def test_a_loader_chain_that_exits_0_before_the_server_comes_up_ends_ready(tmp_path, sims, model_dir):
    sim, run, verdicts, churned = churn_start(tmp_path, sims, model_dir, "loader-chain")
    assert_ready_without_a_death(run, verdicts)
    # The loader ended first, reaped by the pseudo-scheduler, which the API process reaped: both exit 0.
    loader, scheduler = churned
    assert (loader["title"], scheduler["title"]) == ("loader_TP0", "sglang::scheduler_TP0"), churned
    assert loader["parent"] == scheduler["pid"] and scheduler["parent"] == sim.pid
    assert loader["ended"] == scheduler["ended"] == "exit 0"


def test_a_helper_its_parent_sigterms_on_purpose_ends_ready(tmp_path, sims, model_dir):
    _, run, verdicts, churned = churn_start(tmp_path, sims, model_dir, "helper-sigterm")
    assert_ready_without_a_death(run, verdicts)
    # Each rank ended a hung nvidia-smi probe (exec'd) and a check forked with its title by SIGTERM.
    assert len(churned) == 4 and {c["ended"] for c in churned} == {"signal 15 (SIGTERM)"}, churned
    assert sorted(c["title"].split()[0] for c in churned) == [
        "nvidia-smi", "nvidia-smi", "sglang::scheduler_TP0", "sglang::scheduler_TP1"]


def test_a_helper_forked_by_a_server_started_with_node_rank_0_ends_ready(tmp_path, sims, model_dir):
    sim, run, verdicts, churned = churn_start(tmp_path, sims, model_dir, "node-rank", "--node-rank", "0")
    assert_ready_without_a_death(run, verdicts)
    # One helper, forked by the API process with its command line, exited 1.
    assert len(churned) == 1, churned
    helper = churned[0]
    assert helper["parent"] == sim.pid and helper["ended"] == "exit 1" and "--node-rank 0" in helper["title"]


def test_a_rank_killed_and_reaped_at_once_with_its_siblings_parked_fails_within_the_quiet_bound(tmp_path, sims,
                                                                                              model_dir):
    record, progress = str(tmp_path / "churn.jsonl"), str(tmp_path / "progress.jsonl")
    sim = sims.start("sglang", model_dir, "--tp", "2", "--fault", "rankreap:initializing", "--fault-after", "0.5",
                     "--churn-record", record)
    stall = 60  # far beyond the quiet bound: the verdict must not wait for it
    run = attached(sim, **wait_args(sim, "sglang", timeout=90, stall_timeout=stall, progress_path=progress))
    result = run.result
    assert run.rc != 0 and result["phase"] == "failed", (run.rc, result.get("msg"), run)
    lines = json_lines(record)
    killed = [line for line in lines if line.get("fault") == "rankreap"]
    assert len(killed) == 1 and killed[0]["rank"] == 1, lines
    # Its parent reaped it at once: no zombie, no exit status left to read.
    reaped = [line for line in lines if line.get("reaped") == "rank" and line["pid"] == killed[0]["pid"]]
    assert reaped and reaped[0]["ended"] == "signal 9 (SIGKILL)" and reaped[0]["parent"] == sim.pid, lines
    assert "rank TP1 (pid %d" % killed[0]["pid"] in result["msg"], result["msg"]
    # The verdict (its look's line in progress_path, the same wall clock as the record) within the bound.
    lag = os.stat(progress).st_mtime - killed[0]["t"]
    assert lag <= min(QUIET_BOUND, stall) + POLL + SLACK, (lag, result["msg"])
