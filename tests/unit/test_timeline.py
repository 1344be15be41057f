"""tools/timeline.py: data preparation on a recorded progress file (the real module watching the
real simulated engine), and the PNG/HTML it renders from it."""
import json
import os

import pytest

from tests.helpers import FIXTURES
from tools import timeline

FIXTURE = os.path.join(FIXTURES, "timeline", "sglang-start.jsonl")
MIB = 1024.0 * 1024.0


def records():
    with open(FIXTURE) as handle:
        return [json.loads(line) for line in handle]


@pytest.fixture(scope="module")
def tl():
    return timeline.prepare(timeline.load_runs(FIXTURE)[-1])


def test_one_run_with_every_look(tl):
    assert len(timeline.load_runs(FIXTURE)) == 1
    assert len(tl.t) == len(records()) == 29
    assert tl.t == sorted(tl.t)


def test_phase_spans_follow_the_verdicts_and_touch_each_other(tl):
    assert [s.phase for s in tl.spans] == ["starting", "loading", "initializing", "ready"]
    for before, after in zip(tl.spans, tl.spans[1:]):
        assert before.end == after.start
    loading = tl.spans[1]
    # The module moved to loading at its second look (0.9 s) and left it at 8.5 s ("since").
    assert loading.start == pytest.approx(0.9, abs=0.05)
    assert loading.end == pytest.approx(records()[-1]["verdict"]["phases"][2]["start"], abs=0.05)
    assert tl.spans[-1].end == tl.t[-1]


def test_markers_are_the_phase_changing_lines_and_the_verdict(tl):
    texts = [(m.phase, m.label) for m in tl.markers]
    assert texts[0][0] == "loading" and texts[0][1].startswith("Load weight begin.")
    assert texts[1][0] == "initializing" and texts[1][1].startswith("Load weight end.")
    assert texts[2] == ("ready line", "The server is fired up and ready to roll!")
    assert texts[3][0] == "ready" and "completion for model 'k26'" in tl.markers[3].line
    assert len(texts) == 4  # one per phase change: not one per tensor-parallel rank
    assert all(len(m.label) <= timeline.LABEL_CHARS for m in tl.markers)


def test_read_rate_integrates_to_the_bytes_read(tl):
    recs = records()
    read = sum(rate * (t1 - t0) for rate, t0, t1 in zip(tl.read_rate_mib[1:], tl.t, tl.t[1:]) if rate)
    assert read * MIB == pytest.approx(recs[-1]["snapshot"]["process"]["read_bytes"], rel=1e-6)
    loading = [r for r, p in zip(tl.read_rate_mib, tl.phases) if p == "loading" and r is not None]
    after = [r for r, p in zip(tl.read_rate_mib, tl.phases) if p in ("initializing", "ready")]
    # The first look after loading still covers the last reads; from then on nothing is read.
    assert min(loading) > 5 and after[0] > 0 and max(after[1:]) == 0.0
    assert tl.read_rate_mib[0] is None  # no rate before a second look


def test_gpu_memory_per_gpu_and_cpu_cores(tl):
    assert sorted(tl.gpu_mib) == [0, 1]
    for series in tl.gpu_mib.values():
        assert series[0] == 512 and series[-1] == 76000
    busy = [c for c, p in zip(tl.cpu_cores, tl.phases) if p == "initializing" and c is not None]
    quiet = [c for c, p in zip(tl.cpu_cores, tl.phases) if p == "loading" and c is not None]
    assert sum(busy) / len(busy) > 0.5 > max(quiet)


def test_a_file_with_several_waits_splits_at_the_clock_restart(tmp_path):
    path = tmp_path / "two.jsonl"
    text = open(FIXTURE).read()
    path.write_text(text + text[:text.index("\n", text.index("\n") + 1) + 1])  # + the next wait's first 2 looks
    runs = timeline.load_runs(str(path))
    assert [len(r) for r in runs] == [29, 2]


def _record(t, phase, lines=(), msg="", cpu=None):
    return {"snapshot": {"t": t, "log_lines": list(lines), "process": {"cpu_seconds": cpu}, "gpus": []},
            "verdict": {"phase": phase, "since": t, "msg": msg, "engine": "vllm"}}


def test_a_crash_marks_the_root_cause_line_and_the_failed_verdict():
    recs = [_record(0.0, "loading", ["(Worker pid=3) INFO 05-25 19:06:14 [default_loader.py:1] Starting to load model x"]),
            _record(2.0, "failed", ["(Worker pid=3) ERROR 05-25 19:06:16 [x.py:1] torch.OutOfMemoryError: CUDA out of memory."],
                    msg="failed: CUDA out of memory")]
    tl = timeline.prepare(recs)
    assert [(m.phase, m.t) for m in tl.markers] == [("loading", 0.0), ("failed", 2.0), ("failed", 2.0)]
    assert tl.markers[0].label == "Starting to load model x"  # process, level, time and source stripped
    assert tl.markers[1].label == "torch.OutOfMemoryError: CUDA out of memory."
    assert tl.markers[2].line == "failed: CUDA out of memory"  # the verdict's message, its phase not repeated
    assert tl.spans[-1].phase == "failed" and tl.spans[-1].start == tl.spans[-1].end == 2.0
    assert tl.gpu_mib == {} and tl.cpu_cores == [None, None]


@pytest.mark.parametrize("text, why", [
    ("", "holds no records"),
    ('{"snapshot": {"t": 0}}\n', "line 1 is not a progress record"),
    ('not json\n', "line 1 is not a progress record"),
])
def test_bad_files_name_the_file_and_the_fix(tmp_path, text, why):
    path = tmp_path / "bad.jsonl"
    path.write_text(text)
    with pytest.raises(timeline.TimelineError, match=why):
        timeline.load_runs(str(path))
    assert timeline.main([str(path), "--png", str(tmp_path / "x.png")]) == 1
    assert not (tmp_path / "x.png").exists()


def test_cli_writes_a_png_and_a_self_contained_html(tmp_path):
    png, page = tmp_path / "t.png", tmp_path / "t.html"
    assert timeline.main([FIXTURE, "--png", str(png), "--html", str(page), "--title", "sim <sglang> start"]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20000
    text = page.read_text()
    assert "data:image/png;base64," in text and "sim &lt;sglang&gt; start" in text
    # Self-contained: nothing fetched from elsewhere.
    for outside in ("<script", "<link", "src=\"http", "@import", "url("):
        assert outside not in text
    assert "Load weight end. elapsed=" in text and text.count("<tr>") == 1 + 4 + 1 + 4 + 1 + 29


def test_run_selection_is_checked(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        timeline.main([FIXTURE, "--png", str(tmp_path / "x.png"), "--run", "2"])
    assert exit_info.value.code == 2
    assert "--run must be 1..1 or -1..-1: the file holds 1 run(s)" in capsys.readouterr().err
    assert not (tmp_path / "x.png").exists()


def test_throughput_plot(tmp_path):
    result = tmp_path / "levels.json"
    levels = [{"concurrency": c, "tokens_per_s": 40.0 * c, "latency_p50": 0.4, "latency_p90": 0.5,
               "latency_p99": 0.6 + c / 100.0} for c in (1, 2, 4, 8)]
    result.write_text(json.dumps({"levels": levels}))
    out = tmp_path / "tp.png"
    assert timeline.main(["--throughput", str(result), "--png", str(out)]) == 0
    assert out.read_bytes()[:4] == b"\x89PNG"
