"""bench/report.py: which verdicts are wrong, how late, which targets are met, and the report it writes."""
import os

import pytest

from bench import report
from tests.helpers.paths import ROOT
from tests.unit.test_bench_containers import measured as containers_measured
from tests.unit.test_bench_disk import _measured as disk_measured


@pytest.mark.parametrize("scenario, approach, said, t, truth, wrong, why", [
    ("normal", "module", "ready", 12.0, 11.2, False, ""),
    ("normal", "wait_for", "ready", 9.4, 11.2, True, "said ready 1.8 s before the engine could answer a completion"),
    ("normal", "uri", "ready", 11.0, 11.2, False, ""),  # within the pipe-stamping tolerance
    ("normal", "uri", "gave up", 20.0, 11.2, True, "said gave up on a healthy start"),
    ("normal", "module", "stalled", 30.0, 11.2, True, "said stalled on a healthy start"),
    ("crash-loading", "uri", "gave up", 20.0, 3.1, False, ""),
    ("crash-loading", "module", "failed", 3.5, 3.1, False, ""),
    ("crash-loading", "module", "timeout", 120.0, 3.1, True, "said timeout, not failed"),
    ("hang-ready", "uri", "ready", 11.5, 11.0, True, "said ready on a hung engine"),
    ("hang-loading", "wait_for", "gave up", 20.0, 3.0, False, ""),
    ("hang-loading", "module", "stalled", 14.0, 3.0, False, ""),
    ("crash-loading", "wait_for", "ready", 1.0, 3.0, True, "said ready on a crashed engine"),
])
def test_judge(scenario, approach, said, t, truth, wrong, why):
    verdict = report.judge(scenario, approach, said, t, truth)
    assert verdict["wrong"] is wrong and verdict["why"] == why
    assert verdict["delay"] == pytest.approx(t - truth)


def test_judge_without_a_true_event_has_no_delay():
    assert report.judge("normal", "module", "ready", 5.0, None)["delay"] is None


def _scenario(engine, name, module, uri, wait_for):
    return {"engine": engine, "scenario": name, "truth": 10.0, "fault": None, "progress": "",
            "approaches": {"module": module, "uri": uri, "wait_for": wait_for}}


def results():
    j = report.judge
    return {
        "settings": {"poll_interval": 1.0, "stall_timeout": 10, "scale": 30, "deadline": 20, "retries": 20,
                     "module_timeout": 120, "fault_after": 1.0, "sim_args": ["--tp", "2"], "model_mib": 128,
                     "model_shards": 16},
        "scenarios": [
            _scenario("sglang", "normal", dict(j("normal", "module", "ready", 11.2, 10.0), verdict_delay=0.8),
                      j("normal", "uri", "ready", 10.5, 10.0), j("normal", "wait_for", "ready", 8.0, 10.0)),
            _scenario("vllm", "crash-loading", dict(j("crash-loading", "module", "failed", 12.5, 10.0), verdict_delay=2.3),
                      j("crash-loading", "uri", "gave up", 20.0, 10.0), j("crash-loading", "wait_for", "gave up", 20.0, 10.0)),
            _scenario("vllm", "hang-ready", dict(j("hang-ready", "module", "stalled", 21.0, 10.0), verdict_delay=10.9),
                      j("hang-ready", "uri", "ready", 10.4, 10.0), j("hang-ready", "wait_for", "ready", 10.2, 10.0)),
        ],
        "cost": {
            "load": {"phase": "load", "poll_interval": 5.0, "seconds": 300, "watched_s": 300.0, "polls": 60,
                     "cpu_s": 1.2, "children_cpu_s": 0.3, "peak_rss_mib": 30.0, "reads": 13, "read_cpu_s": 0.01,
                     "split": {"startup_cpu_s": 0.7, "looks": 60, "looks_cpu_s": 0.4, "gpu_read_cpu_s": 0.02,
                               "programs_cpu_s": 0.3}},
            "init": {"phase": "init", "poll_interval": 5.0, "seconds": 300, "watched_s": 300.0, "polls": 60,
                     "cpu_s": 1.2, "children_cpu_s": 1.4, "peak_rss_mib": 30.0, "reads": 13, "read_cpu_s": 0.01,
                     "split": None}},
        "rerun": {"status": "not measured", "why": "tools/testhosts up failed:\nno bridge"},
    }


def test_targets_say_met_or_missed_with_the_number():
    rows = dict((label.split(" (")[0].split(" within")[0], (met, number)) for label, met, number in report.targets(results()))
    assert rows["ready"] == (True, "worst 0.80 s")
    assert rows["crash"] == (False, "worst 2.30 s")  # the module's own time, not ansible-playbook's exit
    assert rows["hang after ready, /health still 200"] == (True, "worst 10.90 s")  # within stall_timeout + two polls
    assert rows["hang after ready, /health hung too"] == (None, "worst – s")  # no SGLang hang-ready in this run
    assert rows["hang while loading"] == (None, "worst – s")  # no such scenario in this run
    assert rows["zero false stalls"] == (True, "0 of 1 healthy starts")
    assert rows["the module's wrong verdicts: 0"] == (True, "0 of 3 scenarios")
    # The worst phase decides, each with the controller's reads on the host counted in.
    assert rows["under 1 % of one core at a 5.0 s poll, a whole wait"] == (
        True, "init 0.91 %; load 0.54 % (worst: 2.730 s of CPU in 300 s)")
    assert rows["re-run on a ready host under 15 s with changed=0, no restart"] == (None, "not measured: no bridge")


def test_a_core_share_of_one_percent_is_missed():
    data = results()
    data["cost"]["init"]["children_cpu_s"] = 1.67
    rows = [row for row in report.targets(data) if row[0].startswith("under 1 %")]
    assert rows == [("under 1 % of one core at a 5.0 s poll, a whole wait", False,
                     "init 1.00 %; load 0.54 % (worst: 3.000 s of CPU in 300 s)")]


def test_the_cost_section_splits_the_wait():
    text = report.render(results(), {})
    assert ("| a silent load (shards read, no log line) | 60 | 0.700 s | 0.400 s (0.020 s) | 0.300 s | 13 × 10.0 ms "
            "| 1.630 s | 0.54 % | 0.31 % | 30.0 MiB |") in text
    assert "| 60 | – s | – s (– s) | – s | 13 × 10.0 ms | 2.730 s | 0.91 % | – | 30.0 MiB |" in text


def test_fan_out_and_a_measured_rerun():
    data = results()
    data["fanout"] = {"status": "measured", "levels": [{"hosts": 1, "wall_s": 20.0, "rc": 0, "failed": 0},
                                                       {"hosts": 4, "wall_s": 30.0, "rc": 0, "failed": 0}]}
    data["rerun"] = {"status": "measured", "guest": "bench-rerun", "wall_s": 15.5, "walls_s": [16.9, 15.5, 14.8],
                     "changed": 0, "restarts": 0,
                     "recap": {"ok": 40, "changed": 0}, "same_invocation": True, "tasks": 136, "tasks_run": 88,
                     "task_seconds": 14.2,
                     "slowest_tasks": [{"seconds": 0.79, "task": "Wait until the model answers, sglang-k26",
                                        "action": "modelwake.serving.wait_for_model_ready", "skipped": False}]}
    text = report.render(data, {})
    assert "| 1 | 20.0 | 1.00× | 0 |" in text and "| 4 | 30.0 | 1.50× | 0 |" in text
    assert "| re-run on a ready host under 15 s with changed=0, no restart | **missed** | 15.5 s, changed=0, restarts 0 |" in text
    assert "deployed once, then again 3 times through ansible-runner: 15.5 s (the median of 16.9, 15.5, 14.8 s)" in text
    data["rerun"].update(cli_wall_s=13.9, cli_walls_s=[14.2, 13.9, 13.1])
    text = report.render(data, {})
    assert ("| re-run on a ready host under 15 s with changed=0, no restart | met | 13.9 s by ansible-playbook "
            "(15.5 s through ansible-runner), changed=0, restarts 0 |") in text, text
    assert "Then 3 times by `ansible-playbook deploy-k26.yml` itself, as the README runs it: 13.9 s (the median of 14.2, 13.9, 13.1 s)." in text
    assert "136 tasks (88 run, the rest skipped), 14.2 s in tasks; the slowest:" in text
    assert "| 0.79 | Wait until the model answers, sglang-k26 | modelwake.serving.wait_for_model_ready |" in text


def test_report_tables_ratios_and_wrong_verdicts(tmp_path):
    text = report.render(results(), {})
    assert "| sglang | normal | 10.0 | ready +1.2 s | ready +0.5 s | ready -2.0 s **wrong** | 0.4× | wrong verdict |" in text
    assert "| vllm | crash-loading | 10.0 | failed +2.5 s | gave up +10.0 s | gave up +10.0 s | 4.0× | 4.0× |" in text
    assert "| uri | 1 of 3 | vllm hang-ready: said ready on a hung engine |" in text
    assert "| wait_for | 2 of 3 |" in text and "| module | 0 of 3 | none |" in text
    assert "| crash within one poll interval (1.0 s) of the process exit | **missed** | worst 2.30 s |" in text
    report.write(results(), str(tmp_path))
    assert (tmp_path / "report.md").read_text() == text  # no scenario has a progress file: no pictures


def test_the_header_says_which_steps_the_last_run_measured():
    data = results()
    assert "The last run measured every step in " in report.render(data, {})
    data["steps"] = ["scenarios", "cost"]
    assert "The last run measured only scenarios, cost in " in report.render(data, {})


def every_section():
    """results() with every step measured: render() writes each of its sections."""
    data = results()
    data["realvllm"] = {"status": "measured", "msg": "ready after 35 s",
                        "phases": [{"phase": "starting", "duration": 23.0}, {"phase": "ready", "duration": 0.0}]}
    data["stacks"] = {"cost": {"reads": 20, "processes": 9, "cpu_s_per_read": 0.2, "cpu_ms_per_process": 24.0,
                               "wall_s_per_read": 0.3, "wall_s_max": 0.4},
                      "verdicts": {"with stacks": {"phase": "stalled", "after_hang_s": 12.0, "msg": "stalled: ..."}},
                      "stall_timeout": 10, "poll_interval": 1.0}
    data["throughput"] = {"max_tokens": 64, "token_seconds": 0.025, "levels": [
        {"concurrency": 1, "tokens_per_s": 39.1, "requests_per_s": 0.61, "latency_p50": 1.6, "latency_p90": 1.6,
         "latency_p99": 1.6, "errors": 0}]}
    data["fanout"] = {"status": "measured", "levels": [{"hosts": 1, "wall_s": 12.7, "rc": 0, "failed": 0}]}
    data["arrivals"] = {"stall_timeout": 10, "poll_interval": 1.0, "rate_mib": 4.0, "weights_bytes": 192 * 1048576,
                        "cases": [{"arrival": "download", "engine": "vllm", "phase": "ready", "msg": "ready after 60 s",
                                   "elapsed": 60.0, "looks_with_source": 48, "stalled_after_last_byte_s": None,
                                   "source": {"kind": "download", "bytes": 192 * 1048576, "rate": 4194304.0},
                                   "statuses": ["+20 s: loading (downloading org/k26-sim x: 80 MiB at 4 MiB/s)"]}]}
    data["history"] = {"poll_interval": 1.0, "load_seconds": 12.0, "init_seconds": 15.0, "jitter": 0.15, "starts": [
        {"start": number, "load_s": 12.0, "init_s": 15.0, "whole_s": 30.0, "usual": None if number == 1 else {},
         "points": [{"share": share, "phase": "loading", "truth_s": truth, "eta_s": None if number == 1 else eta,
                     "error": None if number == 1 else round(abs(eta - truth) / truth, 3)}
                    for share, truth, eta in ((0.0, 30.0, 27.0), (0.25, 22.0, 20.0), (0.5, 15.0, 13.0),
                                              (0.75, 7.0, 5.0))]}
        for number in (1, 2, 3)]}
    data["disk"] = disk_measured()
    data["churn"] = churn_measured()
    data["containers"] = containers_measured()
    data["containerdemo"] = container_demo_measured()
    return data


def container_demo_measured():
    run = {"runtime": "podman", "rc": 0, "recap": {"ok": 107, "changed": 18}, "phases": "loading -> ready", "log": "x"}
    return {"status": "measured", "date": "2026-12-06", "load_average": ["1.93", "1.58", "2.08"], "runs": [
        dict(run, label="from no host and no image", seconds=132.0, ready_after_s=40),
        dict(run, label="again", seconds=31.0, recap={"changed": 0}, ready_after_s=0, phases="ready"),
        dict(run, label="venv again", runtime="venv", seconds=75.0, ready_after_s=None)]}


def test_the_container_demo_section_gives_each_commands_time_recap_and_verdict():
    text = "\n".join(report.container_demo_section(container_demo_measured()))
    assert "| `make demo RUNTIME=podman` (from no host and no image) | 132 s | changed=18 | 40 s (loading -> ready) |" in text
    assert "| `make demo RUNTIME=podman` (again) | 31 s | changed=0 | 0 s (ready) |" in text
    assert "| `make demo` (venv again) | 75 s | changed=18 | - |" in text
    failed = report.container_demo_section({"status": "not measured", "why": "podman, from no host failed (rc 2)"})
    assert failed[-2] == "Not measured: podman, from no host failed (rc 2)"
    assert report.container_demo_section(None) == []


def headings(text):
    return [line for line in text.splitlines() if line.startswith("#")]


def test_the_committed_report_has_the_benchs_sections_in_its_order():
    # bench/REPORT.md is bench/out/report.md's sections, then the ones measured outside the bench: a new
    # run's report.md is copied over the first part and must fit it.
    with open(os.path.join(ROOT, "bench", "REPORT.md")) as handle:
        committed = handle.read()
    bench_part = committed.split("\n# Measured outside `make bench`\n")[0]
    assert headings(bench_part) == headings(report.render(every_section(), {}))
    assert bench_part.split("\n")[2].startswith("Written by `make bench` (`bench/run.py`; `--only STEP,...` ")


def test_the_arrivals_section_gives_each_verdict_and_the_status_lines():
    text = "\n".join(report._arrivals_section(every_section()["arrivals"]))
    assert "| download | vllm | ready | 60.0 s | 48 | download 192.0 MiB at 4.0 MiB/s |" in text
    assert "    +20 s: loading (downloading org/k26-sim x: 80 MiB at 4 MiB/s)" in text
    assert report._arrivals_section(None) == []


def test_the_history_section_gives_the_eta_against_the_truth_and_the_target_row():
    data = every_section()
    text = "\n".join(report._history_section(data["history"]))
    assert "| 1 | 12.0 / 15.0 | 30.0 | no ETA (loading) |" in text
    assert "| 3 | 12.0 / 15.0 | 30.0 | 27.0 s for 30.0 s (loading, 10 %) |" in text
    # From the third start on: the points' errors 10, 9, 13 and 29 %; the first look's 10 %.
    assert "mean error 15 %, largest 29 %; at the first look, worst 10 %" in text
    rows = dict((row[0], row[1:]) for row in report.targets(data))
    assert rows["a re-start's whole-start ETA within 20 % of the truth from its first look (third start on)"] == (
        True, "worst 10 % over 1 starts")
    assert report._history_section(None) == []


def churn_measured():
    def case(name, tp, expects, phase, failed, looks, lag=None, msg="ready after 12 s"):
        return {"case": name, "tp": tp, "expects": expects, "phase": phase, "msg": msg, "looks": looks,
                "failed_looks": failed, "churn_children": 4, "lag_s": lag}
    return {"stall_timeout": 10, "death_stall_timeout": 60, "poll_interval": 1.0, "churn_seconds": 4.0, "cases": [
        case("compile-workers", 2, "ready", "ready", 0, 14),
        case("node-rank", 2, "ready", "failed", 1, 6, msg="failed: rank TP0 (pid 42) died (exit status 1)"),
        case("rankreap:initializing", 2, "failed", "failed", 1, 25, 21.2,
             "failed: rank TP1 (pid 7) is gone (exit status unknown: reaped) | nothing has moved for 20 s")]}


def test_the_churn_section_gives_each_case_its_verdict_failed_looks_and_lag():
    text = "\n".join(report._churn_section(churn_measured()))
    assert text.startswith("## Rank churn and rank death\n")
    assert "| compile-workers (compile workers: " in text and "| 2 | ready | 0 of 14 | – |" in text
    assert "| 2 | failed **wrong** | 1 of 6 | – |" in text  # a healthy start called failed
    assert "| 2 | failed | 1 of 25 | 21.2 s |" in text  # a death: failed, as it must be
    # Every verdict other than ready is quoted, the table's separator escaped.
    assert "- node-rank: `failed: rank TP0 (pid 42) died (exit status 1)`" in text
    assert "- rankreap:initializing: `failed: rank TP1 (pid 7) is gone (exit status unknown: reaped) \\| nothing" in text
    assert report._churn_section(None) == []


def test_a_false_failed_look_on_a_churn_start_misses_its_target():
    data = results()
    assert not [row for row in report.targets(data) if row[0].startswith("zero failed looks")]  # not measured
    data["churn"] = churn_measured()
    rows = dict((row[0], row[1:]) for row in report.targets(data))
    assert rows["zero failed looks on healthy starts with rank churn"] == (False, "1 failed looks; 1 of 2 starts ready")
    data["churn"]["cases"][1].update(phase="ready", failed_looks=0)
    rows = dict((row[0], row[1:]) for row in report.targets(data))
    assert rows["zero failed looks on healthy starts with rank churn"] == (True, "0 failed looks; 2 of 2 starts ready")


def test_task_times_come_from_the_runs_own_task_results():
    from bench import run
    events = [
        {"event": "playbook_on_task_start", "event_data": {"task": "Read the GPUs"}},
        {"event": "runner_on_ok", "event_data": {"task": "Read the GPUs", "task_action": "gpu_holders", "duration": 0.41}},
        {"event": "runner_on_skipped", "event_data": {"task": "Pull the image", "task_action": "command",
                                                      "duration": 0.02}},
        {"event": "runner_item_on_ok", "event_data": {"task": "Copy", "duration": 0.3}},  # an item, not the task's end
    ]
    assert run.task_times(events) == [
        {"seconds": 0.41, "task": "Read the GPUs", "action": "gpu_holders", "skipped": False},
        {"seconds": 0.02, "task": "Pull the image", "action": "command", "skipped": True}]


def _fleet_level(hosts, crash_host, healthy_max, crash_lag, cores, one_task=False):
    return {"hosts": hosts, "crash_host": crash_host, "one_task": one_task, "rc": 2 if crash_host else 0, "wall_to_all_ready_s": 20.0,
            "healthy_lag_max_s": healthy_max, "healthy_lag_median_s": healthy_max, "healthy_not_ready": {},
            "crash": {"verdict": "fatal", "lag_s": crash_lag} if crash_host else None, "controller_cpu_s": 10.0,
            "controller_cores": cores, "controller_peak_mib": 700.0, "controller_mib_per_host": 700.0 / hosts,
            "output_lines_per_min": 300.0, "play_s": 30.0}


def _fleet(big_crash_lag, big_cores):
    return {"status": "measured", "poll_s": 5.0, "progress_interval_s": 10, "target_lag_s": 10.0,
            "sim_args": ["--tp", "1"],
            "levels": [_fleet_level(1, False, 1.8, None, 0.09), _fleet_level(1, True, None, 1.9, 0.23),
                       _fleet_level(8, True, 3.6, 3.3, 0.23), _fleet_level(128, True, 5.9, big_crash_lag, big_cores)]}


def test_the_fleet_targets_take_the_worst_lag_of_each_size_against_one_host_alone():
    met = dict((label, (ok, number)) for label, ok, number in report.fleet_targets(_fleet(6.5, 0.8)))
    assert met["fleet: a verdict in the play within 10 s of its event, at every fleet size"] == (
        True, "8 hosts 3.6 s; 128 hosts 6.5 s")
    # The worst lag at 128 hosts (the crash's 6.5 s) against one healthy host alone (1.8 s): 4.7 s, within a poll.
    assert met["fleet: at 128 hosts within one poll (5 s) of one host's lag"] == (True, "6.5 s at 128 hosts against 1.8 s alone")
    assert met["fleet: the controller under one core on average"][0] is True
    missed = dict((label, (ok, number)) for label, ok, number in report.fleet_targets(_fleet(49.1, 1.0)))
    assert missed["fleet: a verdict in the play within 10 s of its event, at every fleet size"] == (
        False, "8 hosts 3.6 s; 128 hosts 49.1 s")
    assert missed["fleet: at 128 hosts within one poll (5 s) of one host's lag"][0] is False
    assert missed["fleet: the controller under one core on average"] == (
        False, "1 host 0.23; 8 hosts 0.23; 128 hosts 1.00")
    assert report.fleet_targets(None)[0][1] is None  # not measured


def test_the_fleet_targets_judge_one_task_following_every_wait_where_it_was_measured():
    fleet = _fleet(49.1, 1.0)
    fleet["levels"] += [_fleet_level(8, True, 3.0, 2.9, 0.2, one_task=True), _fleet_level(128, True, 6.0, 5.5, 0.7, one_task=True)]
    met = dict((label, (ok, number)) for label, ok, number in report.fleet_targets(fleet))
    assert met["fleet: a verdict in the play within 10 s of its event, at every fleet size (one task following every "
               "wait)"] == (True, "8 hosts 3.0 s; 128 hosts 6.0 s")
    assert met["fleet: at 128 hosts within one poll (5 s) of one host's lag"] == (True, "6.0 s at 128 hosts against 1.8 s alone")
    assert met["fleet: the controller under one core on average"] == (True, "1 host 0.23; 8 hosts 0.20; 128 hosts 0.70")


def test_the_fleet_section_has_a_row_per_run_and_says_what_a_host_leaves_out():
    lines = report.fleet_section(_fleet(49.1, 1.0))
    rows = [line for line in lines if line.startswith("| 1") or line.startswith("| 8")]
    assert rows[0].startswith("| 1, none crashing | a task per host | 20.0 | 1.8 (1.8) | – |"), rows
    assert rows[1].startswith("| 1 | a task per host | 20.0 | – | 1.9 |"), rows
    assert rows[3].startswith("| 128 | a task per host | 20.0 | 5.9 (5.9) | 49.1 |"), rows
    text = " ".join(lines)
    assert "leaves out its own CPU, disk and network" in text and "`fleet_hosts` follows every host's wait" in text
    assert report.fleet_section(None)[-2] == "Not measured: step not run"
