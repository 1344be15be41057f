"""The launcher's STATUS= grammar (readiness/status.py): what the launcher writes, what the classifier reads.

One module defines both sides; the round trip below proves the reader takes back from the writer
exactly the phases it should (starting, loading, initializing) and nothing else.
"""
import pytest

from ansible_collections.modelwake.serving.plugins.module_utils.readiness import bottleneck, phases, status
from ansible_collections.modelwake.serving.plugins.module_utils.readiness.verdict import Verdict
from ansible_collections.modelwake.serving.plugins.module_utils.readiness.status import (STATUS_CHARS, format_status,
                                                                                        marker_summary, status_phase)

MIB = 1024.0 * 1024.0
# What the classifier puts in a verdict's `bottleneck` on a slow mmap load of 8 ranks (bottleneck.diagnose).
SLOW_LINE = bottleneck.diagnose(575 * MIB, 7.0e9, "vllm", read_bytes_rate=575 * MIB, rchar_rate=0, slow_for=60,
                                tensor_parallel=8)


@pytest.mark.parametrize("fields, elapsed, text", [
    (dict(phase="loading", fraction=0.4531, shards=[29, 64], read_rate=412 * MIB, eta=372.4), 100,
     "loading 45% (29/64 shards, 412 MiB/s, ETA 6m12s)"),
    (dict(phase="loading", fraction=0.25, bytes_read=3 * 1024 * MIB, read_rate=575 * MIB, eta=30), 40,
     "loading 25% (3.0 GiB read, 575 MiB/s, ETA 30s)"),
    (dict(phase="loading", since=12), 20, "loading (since 12s)"),
    (dict(phase="initializing", since=250,
          evidence=["[2026-05-25 19:06:14 TP0] Capture cuda graph begin. This can take up to several minutes."]),
     300, "initializing: Capture cuda graph begin (since 4m10s)"),
    (dict(phase="initializing", since=5), 9, "initializing (since 5s)"),
    (dict(phase="starting", evidence=["[2026-05-25 19:06:14 TP0] Init torch distributed begin."]), 3,
     "starting: Init torch distributed begin (since 0s)"),
    (dict(phase="ready"), 843.2, "ready in 14m03s"),
    (dict(phase="stalled", msg="stalled: no progress for 600 s\nin phase loading"), 900,
     "stalled: no progress for 600 s in phase loading"),
    (dict(phase="not_started"), 0, "starting the engine"),
])
def test_status_text(fields, elapsed, text):
    verdict = Verdict(msg=fields.pop("msg", ""), **fields)
    assert format_status(verdict, elapsed) == text


@pytest.mark.parametrize("line, summary", [
    ("(EngineCore pid=7) INFO 11-30 12:00:01 [gpu_model_runner.py:1234] Loading weights took 1.20 seconds",
     "Loading weights took 1.20 seconds"),
    ("[2026-11-30 05:08:43] INFO:     Uvicorn running on http://127.0.0.1:30551 (Press CTRL+C to quit)",
     "Uvicorn running on http://127.0.0.1:30551"),
    ("[2026-05-25 19:06:14 TP3] Entering DeepGEMM JIT Pre-Compile session.", "Entering DeepGEMM JIT Pre-Compile session"),
])
def test_marker_summary_drops_prefixes_and_keeps_the_gist(line, summary):
    assert marker_summary(line) == summary


@pytest.mark.parametrize("text, phase", [
    ("loading 45% (29/64 shards, 412 MiB/s, ETA 6m12s)", "loading"),
    ("initializing: Capture cuda graph begin (since 4m10s)", "initializing"),
    ("starting the engine", "starting"),
    ("ready in 14m03s", None),  # the ready check decides, never a status text
    ("stalled: no progress for 600 s in phase loading", None),
    ("Processing requests...", None),  # another service's words
    ("", None),
    (None, None),
])
def test_status_phase(text, phase):
    assert status_phase(text) == phase


# What a look can produce for each phase, as the classifier fills a verdict, and the phase a unit's
# StatusText then gives back to the classifier (None: the reader must not take it from the text).
ROUND_TRIP = [
    (dict(phase="not_started"), phases.STARTING),
    (dict(phase="starting"), phases.STARTING),
    (dict(phase="starting", evidence=["[2026-05-25 19:06:14 TP0] Init torch distributed begin."]), phases.STARTING),
    (dict(phase="loading"), phases.LOADING),
    (dict(phase="loading", fraction=0.5, shards=[32, 64], read_rate=400 * MIB, eta=10), phases.LOADING),
    (dict(phase="loading", bytes_read=5 * 1024 * MIB), phases.LOADING),
    (dict(phase="loading", fraction=0.45, shards=[29, 64], read_rate=575 * MIB, eta=372, bottleneck=SLOW_LINE),
     phases.LOADING),
    (dict(phase="initializing", evidence=["Capture cuda graph begin."]), phases.INITIALIZING),
    (dict(phase="initializing"), phases.INITIALIZING),
    (dict(phase="ready"), None),
    (dict(phase="failed", msg="failed: the process 4242 is gone (exit status 1)"), None),
    (dict(phase="stalled", msg="stalled: no progress on any signal for 600 s; last progress: read_bytes"), None),
    (dict(phase="timeout", msg="timeout: not ready after 3600 s, still loading"), None),
]


@pytest.mark.parametrize("fields, phase", ROUND_TRIP)
def test_the_classifier_reads_back_what_the_launcher_wrote(fields, phase):
    verdict = Verdict(msg=fields.pop("msg", ""), **fields)
    text = format_status(verdict, 100)
    assert "\n" not in text and len(text) <= STATUS_CHARS
    assert status_phase(text) == phase


def test_every_phase_has_a_round_trip_case():
    assert {fields["phase"] for fields, _ in ROUND_TRIP} == set(phases.PHASES + phases.TERMINAL)


def test_a_long_terminal_message_is_cut_to_one_short_line():
    text = format_status(Verdict(phase="failed", msg="failed: " + "x\n" * 400), 1)
    assert len(text) == STATUS_CHARS and "\n" not in text


@pytest.mark.parametrize("text, news", [
    ("initializing: Load weight end (since 12s) | TP0-7 in repack_marlin_weights (marlin.py:211) for 40s",
     "initializing: Load weight end"),
    ("initializing: Load weight end (since 12s) | TP0-6 in all_reduce (p.py:5) for 1m40s; TP7 state T (stopped) in "
     "load_weights (l.py:9) for 1m40s - the odd one out", "initializing: Load weight end"),
    ("starting the engine | no stacks: py-spy may not read process 42: Permission denied", "starting the engine"),
    ("loading 12% (8/64 shards) | TP0-7 in load_weights (modelwake_sim/ranks.py:272)", "loading 12% (8/64 shards)"),
    ("initializing: Loading safetensors checkpoint shards: 100% Completed | 8/8 (since 3s)",
     "initializing: Loading safetensors checkpoint shards: 100% Completed | 8/8"),
    # A hung load's rate falls and its ETA grows at every look: only the shards and the percent are news.
    ("loading 45% (29/64 shards, 575 MiB/s, ETA 6m02s)", "loading 45% (29/64 shards)"),
    ("loading 12% (1/8 shards, 2 MiB/s, ETA 27s) | usual: starting 1s, loading 4s", "loading 12% (1/8 shards)"),
    ("loading 12% (1/8 shards, 0 MiB/s, ETA 1m36s) | 1413x below this disk's 3.1 GB/s: page faults through mmap",
     "loading 12% (1/8 shards)"),
    ("starting: prefetching 12.0 GiB of 548.0 GiB (2%), 6.8 GB/s, ETA 1m18s",
     "starting: prefetching 12.0 GiB of 548.0 GiB (2%)"),
    ("loading 3% (downloading org/k26 model-00003.safetensors: 1.2 GiB / 5.0 GiB at 30 MiB/s, ETA 2m10s)",
     "loading 3% (downloading org/k26 model-00003.safetensors: 1.2 GiB / 5.0 GiB)"),
    (None, None),
])
def test_the_stacks_age_and_the_figures_derived_from_the_time_are_not_news(text, news):
    """The classifier counts a changed StatusText as progress: the stacks' `for 40s` must not be, nor a
    rate, an ETA or a slow-load line that move with the clock alone."""
    assert status.status_news(text) == news


def test_a_slow_load_says_what_holds_it_back_in_the_status_line():
    """The writer: the line beside the rate, without repeating it and without the notes in parentheses,
    within the one-line limit; the reader: still a loading status, and the line is news like the rate."""
    verdict = Verdict(phase="loading", msg="", fraction=0.45, shards=[29, 64], read_rate=575 * MIB, eta=372,
                      bottleneck=SLOW_LINE)
    text = format_status(verdict, 100)
    assert text == ("loading 45% (29/64 shards, 575 MiB/s, ETA 6m12s) | 12x below this disk's 7.0 GB/s: page faults "
                    "through mmap; vLLM: --safetensors-load-strategy eager; or model_service_prefetch: on")
    assert len(text) <= STATUS_CHARS
    assert status_phase(text) == phases.LOADING
    assert status.status_news(text) == "loading 45% (29/64 shards)"  # the line moves with the rate, not the work
    # With the usual figures and the ranks' stacks after it, still cut to one short line.
    verdict.usual = {"loading": 960.0, "initializing": 660.0}
    verdict.where = "TP0-7 in load_weights (loader.py:449) for 40s"
    text = format_status(verdict, 100)
    assert len(text) <= STATUS_CHARS and status_phase(text) == phases.LOADING
    assert text.startswith("loading 45% (29/64 shards, 575 MiB/s, ETA 6m12s) | 12x below this disk's")


def test_no_slow_load_no_word_of_it():
    text = format_status(Verdict(phase="loading", msg="", read_rate=3000 * MIB, bytes_read=6 * 1024 * MIB), 10)
    assert text == "loading (6.0 GiB read, 2.9 GiB/s)"
