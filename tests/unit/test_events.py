"""modelwake_runner/events.py: ansible-runner's events of a real deploy, replayed, and the cases a deploy
rarely shows at once (a failed wait, a censored one, a status loop, a skipped wait)."""
import copy
import json
import os

from modelwake_runner.events import Events
from tests.helpers import FIXTURES

FIXTURE = os.path.join(FIXTURES, "runner", "deploy-events.jsonl")
WAIT = "modelwake.serving.wait_for_model_ready"


def recorded():
    with open(FIXTURE) as handle:
        return [json.loads(line) for line in handle]


def translate(runner_events):
    events = Events()
    objects = [obj for event in runner_events for obj in events.translate(event)]
    return events, objects


def kinds(objects, kind):
    return [obj for obj in objects if obj["event"] == kind]


def test_a_recorded_deploy_gives_tasks_looks_verdicts_and_the_recap():
    runner_events = recorded()
    events, objects = translate(runner_events)
    assert len(kinds(objects, "task_start")) == sum(1 for e in runner_events if e["event"] == "runner_on_start")
    looks = kinds(objects, "progress")
    assert len(looks) == sum(1 for e in runner_events if e["event"] == "runner_on_async_poll") > 0
    for look in looks:
        assert look["host"] == "k26-1" and look["unit"] == "sglang-k26.service" and look["line"].startswith(look["phase"])
        assert "cost" not in look and "ansible_job_id" not in look
    verdicts = kinds(objects, "verdict")
    assert [(v["task"], v["phase"]) for v in verdicts] == [
        ("Wait for the restarted model service to be ready", "ready"), ("Wait until the model answers, sglang-k26", "ready")]
    assert [p["phase"] for p in verdicts[-1]["phases"]][-1] == "ready"
    assert kinds(objects, "recap") == [{"event": "recap", "hosts": {"k26-1": {
        "ok": 80, "changed": 17, "failed": 0, "unreachable": 0, "skipped": 23, "rescued": 0, "ignored": 0}}}]
    ends = kinds(objects, "task_end")
    assert {e["status"] for e in ends} == {"ok", "changed", "skipped"}
    assert events.all_ready()


def test_a_failed_wait_is_the_last_verdict_and_the_run_not_ready():
    runner_events = recorded()
    last_wait = max(i for i, e in enumerate(runner_events)
                    if e["event"] == "runner_on_ok" and e["event_data"].get("resolved_action") == WAIT)
    failed = copy.deepcopy(runner_events[last_wait])
    failed["event"] = "runner_on_failed"
    failed["event_data"]["res"].update(phase="failed", msg="failed: process exited with status 3",
                                       evidence={"log_tail": ["torch.OutOfMemoryError: CUDA out of memory"]})
    runner_events[last_wait] = failed
    stats = runner_events[-1]
    stats["event_data"]["failures"] = {"k26-1": 1}
    events, objects = translate(runner_events)
    verdict = kinds(objects, "verdict")[-1]
    assert verdict["phase"] == "failed" and "CUDA out of memory" in json.dumps(verdict["evidence"])
    assert [e["status"] for e in kinds(objects, "task_end") if e["task"] == verdict["task"]][-1] == "failed"
    assert not events.all_ready()
    assert events.verdicts[("k26-1", "sglang-k26.service")] is verdict


def test_a_censored_wait_gives_a_verdict_without_its_details():
    censored = {"event": "runner_on_failed", "event_data": {
        "host": "k26-1", "task": "Wait", "resolved_action": WAIT,
        "res": {"censored": "the output has been hidden due to the fact that 'no_log: true' was specified for this result"}}}
    _events, objects = translate([censored])
    verdict = kinds(objects, "verdict")[0]
    assert verdict == {"event": "verdict", "host": "k26-1", "task": "Wait", "phase": "failed"}


def test_a_status_loop_gives_one_verdict_per_item_and_none_for_the_task():
    item = {"event": "runner_item_on_ok", "event_data": {
        "host": "k26-1", "task": "Look once at each model service", "resolved_action": WAIT,
        "res": {"phase": "not_started", "elapsed": 0, "unit": "sglang-k26.service", "msg": "not started"}}}
    task = {"event": "runner_on_ok", "event_data": {
        "host": "k26-1", "task": "Look once at each model service", "resolved_action": WAIT,
        "res": {"changed": False, "results": [item["event_data"]["res"]]}}}
    stats = {"event": "playbook_on_stats", "event_data": {"ok": {"k26-1": 2}}}
    events, objects = translate([item, task, stats])
    assert [(v["unit"], v["phase"]) for v in kinds(objects, "verdict")] == [("sglang-k26.service", "not_started")]
    assert not events.all_ready()


def test_a_skipped_wait_and_other_callbacks_give_no_verdict():
    skipped = {"event": "runner_on_skipped", "event_data": {"host": "k26-1", "task": "Wait", "resolved_action": WAIT}}
    poll = {"event": "runner_on_async_poll", "event_data": {"host": "k26-1", "res": {"started": 1, "finished": 0}}}
    events, objects = translate([skipped, poll, {"event": "verbose", "event_data": {}}])
    assert objects == [{"event": "task_end", "host": "k26-1", "task": "Wait", "status": "skipped"}]
    assert events.verdicts == {} and not events.all_ready()  # no recap: the run did not end


def test_a_slow_load_s_line_reaches_the_looks_and_the_verdict():
    """The wait's `bottleneck` passes through to a pipeline: in each look that has it and in the verdict."""
    slow = "loading at 575 MiB/s, 12x below this disk's 7.0 GB/s: page faults through mmap"
    runner_events = copy.deepcopy(recorded())
    for event in runner_events:
        res = (event.get("event_data") or {}).get("res") or {}
        if event["event"] == "runner_on_async_poll" and res.get("modelwake_look"):
            res["bottleneck"] = slow
        elif event["event"] in ("runner_on_ok", "runner_on_failed") and "phase" in res:
            res["bottleneck"] = ""
    _events, objects = translate(runner_events)
    looks = kinds(objects, "progress")
    assert looks and all(look["bottleneck"] == slow for look in looks)
    assert all(verdict["bottleneck"] == "" for verdict in kinds(objects, "verdict"))
