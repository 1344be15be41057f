"""The start history: usual durations, the whole-start ETA, "slower than usual", auto budgets, the
record file and the observer that sums a start up from its verdicts."""
import json
import os

import pytest

from plugins.module_utils.host import start_history
from plugins.module_utils.readiness import history
from plugins.module_utils.readiness.verdict import Verdict
from tests.helpers.traces import SGLANG_PREFIX, Trace, config, http, replay


def record(loading, initializing, starting=20.0, silences=(5.0, 30.0, 400.0), unit="sglang-k26",
           version="0.5.4", model="/models/k26", verdict="ready"):
    durations = (starting, loading, initializing)
    return {"v": 1, "unit": unit, "engine": "sglang", "engine_version": version, "model": model,
            "model_bytes": 548 * 10 ** 9, "started_at": 1.7e9, "verdict": verdict,
            "phases": [{"phase": p, "duration": d, "longest_silence": s}
                       for p, d, s in zip(history.TIMED_PHASES, durations, silences)]}


K26 = [record(960, 660), record(1000, 640), record(940, 700)]


def test_comparable_keeps_the_same_unit_version_and_model_that_became_ready():
    records = K26 + [record(10, 10, version="0.5.5"), record(10, 10, model="/models/other"),
                     record(10, 10, unit="vllm-x"), record(10, 10, verdict="stalled"), {"v": 99}]
    assert history.comparable(records, "sglang-k26", "0.5.4", "/models/k26") == K26


def test_comparable_speaks_for_the_latest_starts_only():
    records = [record(100 + i, 10) for i in range(history.USUAL_FROM + 5)]
    kept = history.comparable(records, "sglang-k26", "0.5.4", "/models/k26")
    assert len(kept) == history.USUAL_FROM and kept[-1] is records[-1]


def test_usual_durations_are_medians_so_one_outlier_moves_them_little():
    usual = history.usual_durations(K26 + [record(5000, 660)])
    assert usual["loading"] == pytest.approx(980.0)  # median of 940, 960, 1000, 5000
    assert usual["initializing"] == pytest.approx(660.0)
    assert usual["starting"] == pytest.approx(20.0)


def test_the_eta_adds_the_rest_of_the_phase_to_the_usual_later_ones():
    usual = history.usual_durations(K26)  # loading 960, initializing 660
    # Ten minutes into initialising: about 60 s left.
    assert history.whole_start_eta(usual, "initializing", 600) == pytest.approx(60.0)
    # Loading with a byte-based ETA: this start's own rate, then the usual initialisation.
    assert history.whole_start_eta(usual, "loading", 100, load_eta=300) == pytest.approx(960.0)
    assert history.whole_start_eta(usual, "loading", 100) == pytest.approx(860 + 660)
    # Starting: everything still to come.
    assert history.whole_start_eta(usual, "starting", 5) == pytest.approx(15 + 960 + 660)
    # Past its usual length, the phase counts as ending now.
    assert history.whole_start_eta(usual, "initializing", 900) == 0.0


def test_no_eta_without_history_or_outside_the_start():
    assert history.whole_start_eta({}, "loading", 10) is None
    assert history.whole_start_eta({"loading": 100.0}, "loading", 10) is None  # initialising unknown
    assert history.whole_start_eta(history.usual_durations(K26), "ready", 10) is None


def test_slower_than_usual_past_one_and_a_half_times_and_never_for_short_phases():
    usual = history.usual_durations(K26)
    assert not history.slower_than_usual(usual, "loading", 1400)
    assert history.slower_than_usual(usual, "loading", 1500)
    assert not history.slower_than_usual({"starting": 4.0}, "starting", 20)  # 5x, but seconds
    assert not history.slower_than_usual({}, "loading", 10 ** 6)


def test_the_usual_line_reads_as_the_issue_writes_it():
    usual = history.usual_durations(K26)
    line = history.usual_line(usual, "initializing", 540)
    assert line == "usual: starting 20s, loading 16m00s, initializing 11m00s | ~2m00s left"
    late = history.usual_line(usual, "initializing", 1200)
    assert late.endswith("~0s left | slower than usual (x1.8)")
    assert history.usual_line({}, "loading", 10) == ""


def test_auto_budgets_without_history_are_the_defaults_and_say_so():
    budgets = history.auto_budgets([], 600, 3600)
    assert (budgets.stall_timeout, budgets.ready_timeout) == (600, 3600)
    assert "no earlier start" in budgets.derivation and "defaults" in budgets.derivation


def test_auto_budgets_cover_the_usual_silence_with_a_margin():
    budgets = history.auto_budgets(K26, 600, 3600)
    # The longest silence seen is initialising's 400 s: 400 x 1.5 + 60.
    assert budgets.stall_timeout == pytest.approx(660.0)
    longest = max(20 + 1000 + 640, 20 + 960 + 660, 20 + 940 + 700)
    assert budgets.ready_timeout == pytest.approx(longest * 2)
    assert "3 earlier start(s)" in budgets.derivation and "longest silence 6m40s" in budgets.derivation


def test_auto_budgets_leave_an_outlier_out():
    hung_once = record(960, 3000, silences=(5.0, 30.0, 2900.0))
    budgets = history.auto_budgets(K26 + [hung_once], 600, 3600)
    assert budgets.stall_timeout == pytest.approx(660.0)
    assert "1 outlier(s) left out" in budgets.derivation


def test_auto_budgets_never_go_below_their_floors():
    quick = [record(5, 5, starting=2, silences=(1.0, 2.0, 3.0))] * 3
    budgets = history.auto_budgets(quick, 600, 3600)
    assert budgets.stall_timeout == history.STALL_FLOOR
    assert budgets.ready_timeout == history.READY_FLOOR


def test_the_observer_sums_up_phases_silences_and_the_load_rate():
    observer = history.StartObserver()
    looks = [
        (5, Verdict("starting", "", since=0.0, last_progress={"t": 5, "what": "log"})),
        (60, Verdict("loading", "", since=10.0, last_progress={"t": 60, "what": "read"}, bytes_read=10 ** 9)),
        (100, Verdict("initializing", "", since=70.0, last_progress={"t": 70, "what": "log"}, bytes_read=2 * 10 ** 9)),
        (130, Verdict("ready", "", since=130.0, last_progress={"t": 130, "what": "ready"}, bytes_read=2 * 10 ** 9,
                      phases=[{"phase": "not_started", "start": 0, "duration": 0},
                              {"phase": "starting", "start": 0, "duration": 10},
                              {"phase": "loading", "start": 10, "duration": 60},
                              {"phase": "initializing", "start": 70, "duration": 60},
                              {"phase": "ready", "start": 130, "duration": 0}])),
    ]
    for t, verdict in looks:
        observer.observe(t, verdict)
    made = observer.record("u", "sglang", "0.5.4", "/m", 2 * 10 ** 9, 1.7e9, {"gpus": [0], "page_cache": "cold"})
    assert [p["phase"] for p in made["phases"]] == ["starting", "loading", "initializing"]
    assert [p["longest_silence"] for p in made["phases"]] == [0.0, 0.0, 30.0]
    assert made["load_rate"] == pytest.approx(2 * 10 ** 9 / 60)
    assert made["verdict"] == "ready" and made["verdict_after"] == 130
    json.dumps(made)  # a record is plain JSON


def test_the_record_file_is_bounded_and_skips_what_is_not_a_record(tmp_path):
    path = start_history.history_path(str(tmp_path))
    assert start_history.read_records(path) == []
    for i in range(5):
        assert start_history.append_record(path, {"n": i}, limit=3) is None
    assert [r["n"] for r in start_history.read_records(path)] == [2, 3, 4]
    with open(path, "a") as handle:
        handle.write("not json\n[1, 2]\n")
    assert [r["n"] for r in start_history.read_records(path)] == [2, 3, 4]
    assert oct(os.stat(path).st_mode & 0o777) == "0o644"
    assert start_history.forget(path) and not start_history.forget(path)
    assert start_history.read_records(path) == []


def test_an_unwritable_record_is_an_error_text_not_an_exception(tmp_path):
    error = start_history.append_record(str(tmp_path / "missing" / "starts.jsonl"), {"n": 1})
    assert error.startswith("start history ") and "could not be written" in error


@pytest.mark.parametrize("reached,steps", [
    ("starting", [dict(lines=["server_args=ServerArgs(model_path='/m')"]), dict(cpu=1), dict(alive=False)]),
    ("loading", [dict(lines=["server_args=ServerArgs(model_path='/m')"]),
                 dict(cpu=1, lines=[SGLANG_PREFIX + "Load weight begin. avail mem=85 GB"]), dict(alive=False)]),
    ("initializing", [dict(lines=["server_args=ServerArgs(model_path='/m')"]),
                      dict(cpu=1, lines=[SGLANG_PREFIX + "Load weight begin. avail mem=85 GB"]),
                      dict(cpu=2, lines=[SGLANG_PREFIX + "Load weight end. type=DeepseekV3ForCausalLM, avail mem=20 GB"]),
                      dict(alive=False)]),
])
def test_a_failed_start_is_recorded_with_its_real_duration_and_the_phase_it_reached(reached, steps):
    # Looks every 5 s; the start fails at the last one. Each phase lasts until the next began (not until its
    # own last look), so the record's verdict_after is the failure's time, whatever phase it ended in.
    trace = Trace()
    verdicts = replay(config(engine="sglang"), [trace.step(5 * i, **step) for i, step in enumerate(steps)])
    observer = history.StartObserver()
    for t, verdict in verdicts:
        observer.observe(t, verdict)
    made = observer.record("u", "sglang", "0.5.4", "/m", None, 1.7e9, {"gpus": [0], "page_cache": "cold"})
    failed_at = verdicts[-1][0]
    assert made["verdict"] == "failed" and failed_at == 5 * (len(steps) - 1), verdicts[-1][1]
    assert made["phases"][-1]["phase"] == reached, made["phases"]
    assert made["verdict_after"] == failed_at, made["phases"]


@pytest.mark.parametrize("reached,last", [
    # The crash line in the same look as the marker of the phase it crashed in (faster than one interval).
    ("loading", dict(alive=False, lines=[SGLANG_PREFIX + "Load weight begin. avail mem=85 GB",
                                         "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.50 GiB."])),
    ("initializing", dict(alive=False, lines=[
        SGLANG_PREFIX + "Load weight begin. avail mem=85 GB",
        SGLANG_PREFIX + "Load weight end. type=DeepseekV3ForCausalLM, avail mem=20 GB",
        "RuntimeError: CUDA error: an illegal memory access was encountered"])),
])
def test_a_start_that_fails_in_the_look_that_sees_its_phase_is_recorded_in_that_phase(reached, last):
    # Looks every 5 s: at 0 the run began, at 5 the log says the next phase began and the start failed. The
    # record says the phase it reached (from between the two looks), not the one the previous look saw.
    trace = Trace()
    verdicts = replay(config(engine="sglang"), [trace.step(0, lines=["server_args=ServerArgs(model_path='/m')"]),
                                                trace.step(5, **last)])
    observer = history.StartObserver()
    for t, verdict in verdicts:
        observer.observe(t, verdict)
    made = observer.record("u", "sglang", "0.5.4", "/m", None, 1.7e9, {"gpus": [0], "page_cache": "cold"})
    assert made["verdict"] == "failed", verdicts[-1][1]
    assert [(entry["phase"], entry["duration"]) for entry in made["phases"]] == [("starting", 2.5), (reached, 2.5)]
    assert made["verdict_after"] == 5


def test_a_ready_check_that_passes_at_the_first_look_in_initializing_records_that_phase():
    trace = Trace()
    steps = [trace.step(0, lines=["server_args=ServerArgs(model_path='/m')"]),
             trace.step(5, cpu=1, lines=[SGLANG_PREFIX + "Load weight begin. avail mem=85 GB",
                                         SGLANG_PREFIX + "Load weight end. type=DeepseekV3ForCausalLM, avail mem=20 GB",
                                         "The server is fired up and ready to roll!"],
                        http_result=http(200, models=200, completion=200, ready=True))]
    verdicts = replay(config(engine="sglang"), steps)
    observer = history.StartObserver()
    for t, verdict in verdicts:
        observer.observe(t, verdict)
    made = observer.record("u", "sglang", "0.5.4", "/m", None, 1.7e9, {"gpus": [0], "page_cache": "cold"})
    assert made["verdict"] == "ready", verdicts[-1][1]
    assert [(entry["phase"], entry["duration"]) for entry in made["phases"]] == [("starting", 2.5), ("initializing", 2.5)]
