"""The start history wired into a wait (readiness/start_memory.py): each verdict annotated with the
usual durations, the whole start's ETA and "slower than usual"; one record per start, by the writer
that saw it; the auto budgets resolved through the config, the module and the launcher's options."""
import json
import os

import pytest

from ansible_collections.modelwake.serving.plugins.module_utils.common.errors import InputError, ModelWakeError
from ansible_collections.modelwake.serving.plugins.module_utils.host import start_history
from ansible_collections.modelwake.serving.plugins.module_utils.launcher.cli import build_launch_config, parse_args
from ansible_collections.modelwake.serving.plugins.module_utils.launcher.start_record import said_at_start
from ansible_collections.modelwake.serving.plugins.module_utils.launcher.textfile import prometheus_text
from ansible_collections.modelwake.serving.plugins.module_utils.readiness import history
from ansible_collections.modelwake.serving.plugins.module_utils.readiness.config import build_config
from ansible_collections.modelwake.serving.plugins.module_utils.readiness.start_memory import (
    StartMemory, module_memory, page_cache, resolve_budgets)
from ansible_collections.modelwake.serving.plugins.module_utils.readiness.status import format_status, status_news
from ansible_collections.modelwake.serving.plugins.module_utils.readiness.waiter import wait_for_ready

from tests.helpers.traces import MIB, FakeClock, ReplayProbe, config, http

UNIT = "sglang-k26.service"
MODEL = "/models/k26"
VERSION = "0.5.4"
WALL = 1764892800.0


# systemd's monotonic clock at the replay's t = 0 (the unit's start, unless a test says otherwise).
BOOT_CLOCK = 5000.0


def a_start(init_seconds=300, invocation="run-3", unit_type="simple", unit_started=BOOT_CLOCK):
    """A start in looks of 5 s: 60 s starting, 840 s loading (reads), init_seconds silent
    initialising (CPU only), then ready."""
    unit = {"ActiveState": "activating", "Type": unit_type, "InvocationID": invocation, "NRestarts": 0,
            "InactiveExitTimestampMonotonic": str(int(unit_started * 1e6))}
    ready_at = 900 + init_seconds

    def story(trace, t):
        if t < 60:
            return trace.step(t, cpu=1.0, unit=unit, lines=["starting the server"] if t == 0 else [])
        if t < 900:
            return trace.step(t, cpu=0.9, read=500 * MIB, unit=unit, lines=["Load weight begin"] if t == 60 else [])
        if t < ready_at:
            return trace.step(t, cpu=1.5, unit=unit, lines=["Load weight end"] if t == 900 else [])
        return trace.step(t, cpu=0.3, unit=dict(unit, ActiveState="active"),
                          lines=["The server is fired up and ready to roll!"],
                          http_result=http(200, models=200, completion=200, ready=True, model="m"))
    return story


def recorded(tmp_path, starts=((60, 840, 300),), version=VERSION):
    """A record file holding earlier ready starts with these phase durations."""
    path = str(tmp_path / "starts.jsonl")
    for index, (starting, loading, initializing) in enumerate(starts):
        record = {"v": 1, "unit": "sglang-k26", "engine": "sglang", "engine_version": version, "model": MODEL,
                  "model_bytes": None, "started_at": WALL - 10000 * (index + 1), "verdict": "ready",
                  "invocation": "run-%d" % index,
                  "phases": [{"phase": p, "duration": d, "longest_silence": s} for p, d, s in
                             zip(history.TIMED_PHASES, (starting, loading, initializing), (5.0, 10.0, initializing))]}
        start_history.append_record(path, record)
    return path


def replay(story, memory, **overrides):
    clock = FakeClock()
    memory.monotonic = lambda: BOOT_CLOCK + clock() - 1000.0  # FakeClock starts at 1000
    probe = ReplayProbe(clock, story)
    seen = []
    cfg = config(engine="sglang", unit=UNIT, model_path=None, **overrides)
    result = wait_for_ready(cfg, probe, clock=clock, sleep=clock.sleep, memory=memory,
                            on_snapshot=lambda snap, verdict: seen.append((snap.t, verdict)))
    return result, seen


def memory_of(path, writes="wait", version=VERSION):
    return StartMemory(path, UNIT, MODEL, engine="sglang", engine_version=version, writes=writes,
                       wall_clock=lambda: WALL)


def test_a_known_start_has_a_whole_start_eta_from_its_first_look(tmp_path):
    path = recorded(tmp_path, [(60, 840, 300), (60, 860, 290), (55, 830, 310)])
    result, seen = replay(a_start(), memory_of(path))
    first_t, first = seen[0]
    truth = 1200 - first_t
    assert first.usual == {"starting": 60.0, "loading": 840.0, "initializing": 300.0}
    assert abs(first.start_eta - truth) <= 0.2 * truth
    # Every look until ready: the ETA stays within 20 % of the time really left (or 60 s near the end).
    for t, verdict in seen[:-1]:
        assert abs(verdict.start_eta - (1200 - t)) <= max(60.0, 0.2 * (1200 - t)), (t, verdict.phase, verdict.start_eta)
        assert verdict.slower_than_usual is False
    assert result["phase"] == "ready" and result["slower_than_usual"] is False
    # Said in STATUS= as the issue writes it; the countdown is no news of the server (never progress).
    text = format_status(seen[-2][1], seen[-2][0])
    assert " | usual: starting 1m00s, loading 14m00s, initializing 5m00s | ~" in text and text.endswith(" left")
    assert status_news(text) == text.split(" | usual: ")[0].split(" (since ")[0]  # nor is the phase's age


def test_without_history_only_the_byte_based_eta_remains(tmp_path):
    result, seen = replay(a_start(), memory_of(str(tmp_path / "starts.jsonl")), expected_bytes=420000 * MIB)
    assert all(v.usual is None and v.start_eta is None and v.slower_than_usual is False for _t, v in seen)
    assert any(v.eta is not None for _t, v in seen if v.phase == "loading")
    assert " | usual: " not in format_status(seen[30][1], seen[30][0])
    assert "modelwake_start_eta_seconds" not in prometheus_text(UNIT, seen[30][1], WALL)


def test_another_engine_version_starts_a_new_comparable_set(tmp_path):
    path = recorded(tmp_path, [(60, 840, 300)], version="0.5.3")
    _result, seen = replay(a_start(), memory_of(path))
    assert seen[0][1].usual is None and seen[0][1].start_eta is None


def test_a_slower_phase_is_flagged_while_it_happens_and_in_the_result(tmp_path):
    path = recorded(tmp_path, [(60, 840, 300)] * 3)
    result, seen = replay(a_start(init_seconds=600), memory_of(path))
    flagged = [t for t, v in seen if v.slower_than_usual]
    # Initialising past 1.5 x its usual 300 s: from 450 s into it (it began near 900 s).
    assert flagged and 1340 <= flagged[0] <= 1420 and all(v.phase in ("initializing", "ready")
                                                          for t, v in seen if v.slower_than_usual)
    assert result["phase"] == "ready" and result["slower_than_usual"] is True
    line = history.usual_line(seen[-2][1].usual, "initializing", seen[-2][0] - seen[-2][1].since)
    assert "slower than usual (x" in line


def test_the_wait_records_a_start_it_saw_from_its_beginning_once(tmp_path):
    path = recorded(tmp_path, [(60, 840, 300)])
    result, _seen = replay(a_start(invocation="run-7"), memory_of(path))
    records = start_history.read_records(path)
    assert len(records) == 2
    mine = records[-1]
    assert mine["invocation"] == "run-7" and mine["verdict"] == "ready" and mine["engine_version"] == VERSION
    assert [p["phase"] for p in mine["phases"]] == ["starting", "loading", "initializing"]
    assert mine["totals"]["loading"]["count"] == 1  # the earlier record had no totals: counted from here
    assert result["last_start"]["verdict"] == "ready" and result["last_start"]["phases"]["loading"] > 0
    # A second wait on the same start (the same InvocationID) adds nothing.
    replay(a_start(invocation="run-7"), memory_of(path))
    assert len(start_history.read_records(path)) == 2
    json.dumps(mine)


def test_the_wait_leaves_launcher_units_and_joined_starts_to_others(tmp_path):
    path = str(tmp_path / "starts.jsonl")
    # A notify unit: its launcher records its own starts.
    replay(a_start(unit_type="notify"), memory_of(path))
    assert start_history.read_records(path) == []

    # A wait that joined the start in the middle (the unit started 300 s before it) does not know its beginning.
    replay(a_start(unit_started=BOOT_CLOCK - 300), memory_of(path))
    assert start_history.read_records(path) == []
    # The launcher always records: it started the engine.
    replay(a_start(unit_type="notify"), memory_of(path, writes="launcher"))
    assert len(start_history.read_records(path)) == 1


def test_a_look_once_never_records(tmp_path):
    path = str(tmp_path / "starts.jsonl")
    result, _seen = replay(a_start(), memory_of(path), timeout=0)
    assert start_history.read_records(path) == [] and result["last_start"] is None


def test_the_page_cache_is_told_from_the_share_of_the_model_read_from_disk():
    assert page_cache(10 * MIB, 1000 * MIB) == "warm"
    assert page_cache(950 * MIB, 1000 * MIB) == "cold"
    assert page_cache(700 * MIB, 1000 * MIB) is None and page_cache(None, 1000) is None


def test_auto_budgets_through_the_config(tmp_path):
    params = {"url": "http://127.0.0.1:30001", "pid": os.getpid(), "stall_timeout": "auto", "timeout": "auto"}
    cfg = build_config(params)
    assert cfg.stall_timeout_auto and cfg.timeout_auto and (cfg.stall_timeout, cfg.timeout) == (600, 3600)
    # With earlier starts: the longest silence (initialising, 300 s) x 1.5 + 60, the longest start x 2.
    memory = memory_of(recorded(tmp_path, [(60, 840, 300), (60, 860, 290), (55, 830, 310)]))
    resolved, said = resolve_budgets(cfg, memory)
    assert resolved.stall_timeout == pytest.approx(310 * 1.5 + 60) and not resolved.stall_timeout_auto
    assert resolved.timeout == pytest.approx((60 + 860 + 290) * 2)
    assert said.startswith("auto budgets from 3 earlier start(s): stall_timeout ")
    # Without them: the defaults, said so; with the history off, said too.
    empty, said = resolve_budgets(cfg, memory_of(str(tmp_path / "none.jsonl")))
    assert (empty.stall_timeout, empty.timeout) == (600, 3600) and "no earlier start" in said
    _off, said = resolve_budgets(cfg, None)
    assert said.endswith("(the start history is off)")
    # Only the budget given as auto is derived; a fixed one stays as given, and nothing is said without auto.
    fixed = build_config(dict(params, timeout=900))
    resolved, said = resolve_budgets(fixed, memory)
    assert resolved.timeout == 900 and "ready_timeout" not in said
    assert resolve_budgets(build_config(dict(params, stall_timeout="300", timeout=900)), memory)[1] is None
    assert build_config(dict(params, stall_timeout="300")).stall_timeout == 300
    with pytest.raises(InputError, match="^stall_timeout: must be a number of seconds or auto"):
        build_config(dict(params, stall_timeout="soon"))


def test_the_module_reads_its_units_record_in_the_state_directory(tmp_path):
    cfg = build_config({"url": "http://127.0.0.1:30001", "unit": UNIT, "model": MODEL})
    (tmp_path / "sglang-k26").mkdir()
    memory = module_memory(cfg, "auto", None, root=str(tmp_path))
    assert memory.path == str(tmp_path / "sglang-k26" / "starts.jsonl") and memory.writes == "wait"
    assert module_memory(cfg, "off", None, root=str(tmp_path)) is None
    # Without the unit's state directory (a unit the role did not make): read, never written.
    assert module_memory(build_config({"url": "http://127.0.0.1:30001", "unit": "other.service"}), "auto", None,
                         root=str(tmp_path)).writes is None
    with pytest.raises(InputError, match="^history: the directory of "):
        module_memory(cfg, str(tmp_path / "no" / "starts.jsonl"), None)


def test_the_status_look_compares_with_the_newest_records_version(tmp_path):
    path = recorded(tmp_path, [(60, 840, 300)], version="0.5.4")
    memory = StartMemory(path, UNIT, MODEL, newest_version=True)
    assert memory.engine_version == "0.5.4" and memory.usual["loading"] == 840.0


def test_the_launcher_resolves_auto_budgets_before_the_engine_starts(tmp_path):
    recorded(tmp_path, [(60, 840, 300)] * 3)
    options = parse_args(["--url", "http://127.0.0.1:30001", "--name", UNIT, "--model-path", str(tmp_path),
                          "--state-dir", str(tmp_path), "--engine-version", VERSION, "--stall-timeout", "auto",
                          "--timeout", "auto", "--", "true"])
    options.model_path = None  # the records name /models/k26 as the model; no weights needed here
    options.model = MODEL
    cfg = build_launch_config(options, {"INVOCATION_ID": "4f1c"})
    assert options.start_memory.invocation == "4f1c"  # systemd's id of this start: its record's key
    assert cfg.stall_timeout == pytest.approx(300 * 1.5 + 60) and cfg.timeout == pytest.approx(1200 * 2)
    # systemd's budget follows the derived stall (it is not given: the role leaves it to the launcher).
    assert options.extend_timeout == pytest.approx(cfg.stall_timeout + 2 * 5 + 30)
    assert options.budgets.startswith("auto budgets from 3 earlier start(s)")
    assert options.start_memory.writes == "launcher" and options.start_memory.usual["initializing"] == 300.0
    # Said once in the journal: the budgets, and the whole start the earlier ones let it expect.
    assert said_at_start(options) == [options.budgets, "earlier starts of this model (3): usual: starting 1m00s, "
                                                       "loading 14m00s, initializing 5m00s | ~20m00s left"]
    off = parse_args(["--url", "http://127.0.0.1:30001", "--state-dir", str(tmp_path), "--no-start-history",
                      "--stall-timeout", "auto", "--", "true"])
    cfg = build_launch_config(off, {})
    assert off.start_memory is None and cfg.stall_timeout == 600 and "history is off" in off.budgets
    with pytest.raises(ModelWakeError, match="^state-dir: "):
        build_launch_config(parse_args(["--url", "http://127.0.0.1:1", "--state-dir", str(tmp_path / "x"),
                                        "--", "true"]), {})
