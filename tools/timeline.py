#!/usr/bin/env python3
"""Turn a wait_for_model_ready progress file into a timeline picture (PNG) and a self-contained HTML page.

    tools/timeline.py PROGRESS.jsonl --png out.png --html out.html [--run N] [--title TEXT]
    tools/timeline.py --throughput RESULT.json --png out.png      # benchmark.yml's levels as a plot

The progress file has one JSON line per look of the module: {"snapshot": ..., "verdict": ...}.
A file that several waits appended to holds several runs (the snapshot clock restarts at 0);
the last one is drawn unless --run says otherwise.

Controller-side only (matplotlib). Data preparation (`load_runs`, `prepare`) is pure and tested on
its own; the drawing only reads the prepared Timeline.
"""
import argparse
import base64
import dataclasses
import html
import io
import json
import os
import re
import sys
from typing import Dict, List, Optional, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # the checkout is the modelwake.serving collection

from ansible_collections.modelwake.serving.plugins.module_utils.common.units import MIB  # noqa: E402
from ansible_collections.modelwake.serving.plugins.module_utils.readiness import engines, phases  # noqa: E402  (the module's own phase names and log markers)
PHASE_COLOURS = {
    phases.NOT_STARTED: "#bdbdbd",
    phases.STARTING: "#9ecae1",
    phases.LOADING: "#fdd49e",
    phases.INITIALIZING: "#c7e9c0",
    phases.READY: "#74c476",
    phases.FAILED: "#de2d26",
    phases.STALLED: "#756bb1",
    phases.TIMEOUT: "#636363",
}
LABEL_CHARS = 58
# vLLM's record head, `INFO 05-25 19:06:14 [default_loader.py:291] `: the x axis already says when.
VLLM_RECORD = re.compile(r"^(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? \[[^\]]*\] ")


class TimelineError(Exception):
    """A progress file that cannot be drawn; the message says which file and why."""


@dataclasses.dataclass
class Span(object):
    phase: str
    start: float
    end: float


@dataclasses.dataclass
class Marker(object):
    t: float
    phase: str  # the phase the line moved to, or failed / the terminal verdict
    line: str

    @property
    def label(self):
        text = self.line.strip()
        # Drop the engines' timestamp/process prefixes: the x axis already says when.
        if text.startswith("[") and "]" in text[:40]:
            text = text.split("]", 1)[1].strip()
        if text.startswith("(") and ")" in text[:40]:
            text = text.split(")", 1)[1].strip()
        text = VLLM_RECORD.sub("", text)
        return text if len(text) <= LABEL_CHARS else text[:LABEL_CHARS - 1] + "…"


@dataclasses.dataclass
class Timeline(object):
    t: List[float]
    phases: List[str]  # the verdict's phase at each look
    spans: List[Span]
    read_rate_mib: List[Optional[float]]  # MiB/s of read_bytes since the previous look
    read_gib: List[Optional[float]]  # read_bytes of the tree so far
    cpu_cores: List[Optional[float]]  # tree CPU seconds per second since the previous look
    gpu_mib: Dict[int, List[Optional[float]]]  # GPU index -> memory used per look
    markers: List[Marker]
    last_lines: List[str]  # the newest log line seen at each look
    final: Dict  # the last verdict


def load_runs(path):
    """The runs in a progress file: lists of {"snapshot", "verdict"} records, in order."""
    runs = []
    previous_t = None
    try:
        handle = open(path)
    except OSError as exc:
        raise TimelineError("cannot read the progress file %s: %s" % (path, exc))
    with handle:
        for number, text in enumerate(handle, 1):
            if not text.strip():
                continue
            try:
                record = json.loads(text)
                t = float(record["snapshot"]["t"])
                record["verdict"]["phase"]
            except (ValueError, KeyError, TypeError):
                raise TimelineError("%s line %d is not a progress record ({\"snapshot\": {\"t\": ...}, "
                                    "\"verdict\": {\"phase\": ...}}): %.80s" % (path, number, text.strip()))
            if previous_t is None or t < previous_t:
                runs.append([])  # the clock restarted: a new wait appended to the same file
            runs[-1].append(record)
            previous_t = t
    if not runs:
        raise TimelineError("the progress file %s holds no records: run wait_for_model_ready with "
                            "progress_path set to it first" % path)
    return runs


def _rank(phase):
    return engines.PHASE_ORDER.index(phase) if phase in engines.PHASE_ORDER else -1


def _markers(records, engine):
    """Log lines that moved the engine to a later phase, and the first crash line, at the look
    that first saw them."""
    markers = []
    reached = None
    fatal_seen = False
    for record in records:
        snap = record["snapshot"]
        for line in snap.get("log_lines") or []:
            kind, hint = engines.classify_line(engine, line)
            if kind == "fatal" and not fatal_seen:
                fatal_seen = True
                markers.append(Marker(snap["t"], phases.FAILED, line))
            elif kind == "run_start" and reached is None:
                reached = phases.STARTING
                markers.append(Marker(snap["t"], phases.STARTING, line))
            elif kind == "marker" and _rank(hint) > _rank(reached):
                reached = hint
                phase = phases.INITIALIZING if hint == engines.READY_HINT else hint
                markers.append(Marker(snap["t"], "ready line" if hint == engines.READY_HINT else phase, line))
    final = records[-1]["verdict"]
    if final["phase"] in phases.TERMINAL or final["phase"] == phases.READY:
        # The verdict itself: what the module returned, and when.
        msg = final.get("msg") or final["phase"]
        markers.append(Marker(records[-1]["snapshot"]["t"], final["phase"],
                              msg if msg.startswith(final["phase"]) else "%s: %s" % (final["phase"], msg)))
    return markers


def _spans(records):
    """Phase spans from the verdict at each look; a new phase starts at the verdict's `since`."""
    spans = []
    for record in records:
        verdict, t = record["verdict"], record["snapshot"]["t"]
        if not spans or spans[-1].phase != verdict["phase"]:
            start = verdict.get("since")
            start = t if start is None else max(min(float(start), t), spans[-1].start if spans else 0.0)
            if spans:
                spans[-1].end = start
            spans.append(Span(verdict["phase"], start, t))
        spans[-1].end = t
    return spans


def _per_second(t, totals):
    """Growth per second of a counter since the previous look that had it (None where unknown)."""
    rates, previous = [], None
    for time_s, total in zip(t, totals):
        rate = None
        if total is not None and previous is not None and time_s > previous[0]:
            rate = max(0.0, (total - previous[1]) / (time_s - previous[0]))
        if total is not None:
            previous = (time_s, total)
        rates.append(rate)
    return rates


def prepare(records):
    """One run's records -> a Timeline (pure: no drawing, no files)."""
    if not records:
        raise TimelineError("no records to draw")
    t = [float(r["snapshot"]["t"]) for r in records]
    cpu = _per_second(t, [(r["snapshot"].get("process") or {}).get("cpu_seconds") for r in records])
    gpu = {}
    for i, record in enumerate(records):
        for g in record["snapshot"].get("gpus") or []:
            series = gpu.setdefault(int(g["index"]), [None] * len(records))
            series[i] = g.get("memory_used_mib")
    read = [(r["snapshot"].get("process") or {}).get("read_bytes") for r in records]
    # The rate between looks, not the module's 60 s window (which decays long after reading stops).
    rate = _per_second(t, read)
    last_lines, newest = [], ""
    for record in records:
        lines = record["snapshot"].get("log_lines") or []
        if lines:
            newest = lines[-1]
        last_lines.append(newest)
    engine = records[-1]["verdict"].get("engine") or "auto"
    return Timeline(
        t=t, phases=[r["verdict"]["phase"] for r in records], spans=_spans(records),
        read_rate_mib=[None if v is None else v / MIB for v in rate],
        read_gib=[None if v is None else v / MIB / 1024.0 for v in read],
        cpu_cores=cpu, gpu_mib=dict(sorted(gpu.items())), markers=_markers(records, engine),
        last_lines=last_lines, final=records[-1]["verdict"])


# -- drawing ------------------------------------------------------------------------------------

def _pyplot():
    import matplotlib
    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt
    return plt


def _marker_colour(phase, default):
    """Verdicts in their phase's colour (darkened for ready), log lines in grey."""
    if phase == phases.READY:
        return "#238b45"
    return PHASE_COLOURS[phase] if phase in phases.TERMINAL else default


def _points(xs, ys):
    pairs = [(x, y) for x, y in zip(xs, ys) if y is not None]
    return [p[0] for p in pairs], [p[1] for p in pairs]


def render_png(timeline, path, title=None):
    """Four stacked panels on one time axis: phases + log markers, read rate, GPU memory, CPU."""
    plt = _pyplot()
    fig, axes = plt.subplots(4, 1, sharex=True, figsize=(12, 9),
                             gridspec_kw={"height_ratios": [1.2, 1, 1, 1]})
    top, ax_read, ax_gpu, ax_cpu = axes
    end = max(timeline.t[-1], 1.0)
    for ax in axes:
        for span in timeline.spans:
            ax.axvspan(span.start, max(span.end, span.start + end / 400.0),
                       color=PHASE_COLOURS.get(span.phase, "#eeeeee"), alpha=0.35, lw=0)
        for marker in timeline.markers:
            ax.axvline(marker.t, color=_marker_colour(marker.phase, "#555555"), lw=0.8, ls="--")
        ax.grid(True, axis="y", alpha=0.3)
    # Phase names inside their bands, markers as numbered labels down the top panel.
    top.set_ylim(0, 1)
    top.set_yticks([])
    for span in timeline.spans:
        if span.end - span.start > end / 25.0:
            top.text((span.start + span.end) / 2, 0.93, span.phase, ha="center", va="top", fontsize=10,
                     fontweight="bold")
    rows = max(1, len(timeline.markers))
    for i, marker in enumerate(timeline.markers):
        y = 0.8 - 0.7 * (i % 8) / max(1, min(rows, 8) - 1 or 1)
        right = marker.t > end * 0.6
        top.annotate("%.0f s  %s" % (marker.t, marker.label), xy=(marker.t, y), xytext=(-4 if right else 4, 0),
                     textcoords="offset points", ha="right" if right else "left", va="center", fontsize=7.5,
                     color="#b30000" if marker.phase in phases.TERMINAL else _marker_colour(marker.phase, "#222222"),
                     bbox=dict(boxstyle="round,pad=0.15", fc="white", ec="none", alpha=0.8))
    final = timeline.final
    top.set_title(title or "wait_for_model_ready: %s after %.0f s (engine %s)"
                  % (final["phase"], timeline.t[-1], final.get("engine", "?")), fontsize=11)

    xs, ys = _points(timeline.t, timeline.read_rate_mib)
    ax_read.step(xs, ys, where="pre", color="#e6550d", lw=1.5, label="read rate")
    ax_read.set_ylabel("read MiB/s")
    xs, ys = _points(timeline.t, timeline.read_gib)
    if xs:
        twin = ax_read.twinx()
        twin.plot(xs, ys, color="#8c2d04", lw=1, ls=":", label="read so far")
        twin.set_ylabel("read GiB", fontsize=8)
        twin.tick_params(labelsize=7)
        twin.set_ylim(bottom=0)
    ax_read.set_ylim(bottom=0)
    ax_read.legend(loc="upper left", fontsize=7)

    for index, series in timeline.gpu_mib.items():
        xs, ys = _points(timeline.t, series)
        ax_gpu.plot(xs, [y / 1024.0 for y in ys], lw=1.2, label="GPU %d" % index)
    ax_gpu.set_ylabel("GPU memory GiB")
    ax_gpu.set_ylim(bottom=0)
    if timeline.gpu_mib:
        ax_gpu.legend(loc="upper left", fontsize=7, ncol=min(8, len(timeline.gpu_mib)))
    else:
        ax_gpu.text(0.5, 0.5, "no GPU readings", transform=ax_gpu.transAxes, ha="center", color="#777777")

    xs, ys = _points(timeline.t, timeline.cpu_cores)
    ax_cpu.step(xs, ys, where="post", color="#3182bd", lw=1.2)
    ax_cpu.set_ylabel("CPU cores (tree)")
    ax_cpu.set_ylim(bottom=0)
    ax_cpu.set_xlabel("seconds since the wait began")
    ax_cpu.set_xlim(0, end)
    fig.tight_layout()
    _save(fig, path)
    plt.close(fig)


def _save(fig, path):
    """PNG with a 256-colour palette: a third of the bytes for flat plot colours (pictures get committed)."""
    from PIL import Image  # matplotlib's own dependency
    buffer = io.BytesIO()
    fig.savefig(buffer, dpi=90, format="png")
    buffer.seek(0)
    image = Image.open(buffer).convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT)
    image.save(path, format="PNG", optimize=True)


def _png_bytes(timeline, title):
    buffer = io.BytesIO()
    render_png(timeline, buffer, title)
    return buffer.getvalue()


def _fmt(value, pattern="%.1f"):
    return "" if value is None else pattern % value


def render_html(timeline, path, title=None, png=None):
    """One file, no external JS/CSS: the picture inlined as base64, the phases, markers and looks as tables."""
    png = png if png is not None else _png_bytes(timeline, title)
    final = timeline.final
    e = html.escape
    rows = []
    for i, t in enumerate(timeline.t):
        gpu = "/".join(_fmt(series[i], "%.0f") for series in timeline.gpu_mib.values())
        rows.append("<tr><td>%.1f</td><td class='p-%s'>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td></tr>"
                    % (t, e(timeline.phases[i]), e(timeline.phases[i]), _fmt(timeline.read_rate_mib[i]),
                       e(gpu), _fmt(timeline.cpu_cores[i], "%.2f"), e(timeline.last_lines[i][:160])))
    spans = "".join("<tr><td class='p-%s'>%s</td><td>%.1f</td><td>%.1f</td></tr>"
                    % (e(s.phase), e(s.phase), s.start, s.end - s.start) for s in timeline.spans)
    markers = "".join("<tr><td>%.1f</td><td>%s</td><td><code>%s</code></td></tr>" % (m.t, e(m.phase), e(m.line))
                      for m in timeline.markers)
    colours = "".join(".p-%s{background:%s}" % (k, v) for k, v in PHASE_COLOURS.items())
    heading = title or "wait_for_model_ready timeline"
    page = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>%(title)s</title>
<style>body{font-family:sans-serif;margin:1.5em;max-width:1200px}table{border-collapse:collapse;font-size:12px}
td,th{border:1px solid #ccc;padding:2px 6px;text-align:left}img{max-width:100%%}%(colours)s</style></head>
<body><h1>%(title)s</h1>
<p><b>%(phase)s</b> after %(elapsed).0f s (engine %(engine)s): %(msg)s</p>
<img alt="timeline: phases, read rate, GPU memory, CPU" src="data:image/png;base64,%(png)s">
<h2>Phases</h2><table><tr><th>phase</th><th>start s</th><th>duration s</th></tr>%(spans)s</table>
<h2>Log markers</h2><table><tr><th>t s</th><th>phase</th><th>line</th></tr>%(markers)s</table>
<h2>Every look</h2><table><tr><th>t s</th><th>phase</th><th>read MiB/s</th><th>GPU MiB</th><th>CPU cores</th>
<th>newest log line</th></tr>%(rows)s</table>
</body></html>
""" % {"title": e(heading), "colours": colours, "phase": e(final["phase"]), "elapsed": timeline.t[-1],
       "engine": e(str(final.get("engine"))), "msg": e(final.get("msg") or ""),
       "png": base64.b64encode(png).decode("ascii"), "spans": spans, "markers": markers, "rows": "".join(rows)}
    with open(path, "w") as handle:
        handle.write(page)


def render_throughput(levels, path, title=None):
    """benchmark.yml's levels ([{concurrency, tokens_per_s, latency_p50, latency_p90, latency_p99}])
    as tokens/s and latency percentiles against concurrency."""
    plt = _pyplot()
    levels = sorted(levels, key=lambda level: level["concurrency"])
    xs = [level["concurrency"] for level in levels]
    fig, (ax_tps, ax_lat) = plt.subplots(1, 2, figsize=(11, 4))
    ax_tps.plot(xs, [level["tokens_per_s"] for level in levels], marker="o", color="#31a354")
    for x, level in zip(xs, levels):
        ax_tps.annotate("%.0f" % level["tokens_per_s"], (x, level["tokens_per_s"]), textcoords="offset points",
                        xytext=(0, 6), ha="center", fontsize=8)
    ax_tps.set_ylabel("output tokens/s")
    for key, style in (("latency_p50", "-"), ("latency_p90", "--"), ("latency_p99", ":")):
        ax_lat.plot(xs, [level[key] for level in levels], marker="o", ls=style, label=key.split("_")[1])
    ax_lat.set_ylabel("request latency s")
    ax_lat.legend(fontsize=8)
    for ax in (ax_tps, ax_lat):
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs)
        ax.set_xticklabels([str(x) for x in xs])
        ax.set_xlabel("concurrent requests")
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
    fig.suptitle(title or "completions throughput", fontsize=11)
    fig.tight_layout()
    _save(fig, path)
    plt.close(fig)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("progress", nargs="?", help="progress file written by wait_for_model_ready (progress_path)")
    parser.add_argument("--png", help="write the picture here")
    parser.add_argument("--html", help="write a self-contained HTML page here")
    parser.add_argument("--run", type=int, default=-1, help="which wait of the file: 1 = first, -1 = last (default)")
    parser.add_argument("--title", help="title of the picture and page")
    parser.add_argument("--throughput", metavar="RESULT.json",
                        help="draw benchmark.yml's result ({\"levels\": [...]}) instead of a progress file")
    args = parser.parse_args(argv)
    try:
        if args.throughput:
            if not args.png:
                parser.error("--throughput needs --png OUT.png")
            with open(args.throughput) as handle:
                render_throughput(json.load(handle)["levels"], args.png, args.title)
            print("wrote %s" % args.png)
            return 0
        if not args.progress or not (args.png or args.html):
            parser.error("give a progress file and at least one of --png OUT.png / --html OUT.html")
        runs = load_runs(args.progress)
        if args.run == 0 or abs(args.run) > len(runs):
            parser.error("--run must be 1..%d or -1..-%d: the file holds %d run(s)" % (len(runs), len(runs), len(runs)))
        timeline = prepare(runs[args.run - 1 if args.run > 0 else args.run])
        png = _png_bytes(timeline, args.title)
        for out, writer in ((args.png, None), (args.html, render_html)):
            if out and writer is None:
                with open(out, "wb") as handle:
                    handle.write(png)
            elif out:
                writer(timeline, out, args.title, png)
        print("wrote %s" % " ".join(p for p in (args.png, args.html) if p))
    except (TimelineError, OSError, KeyError, ValueError) as exc:
        print("timeline: %s" % exc, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
