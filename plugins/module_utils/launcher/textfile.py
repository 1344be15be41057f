"""The launcher's Prometheus metrics, written for node_exporter's textfile collector.

In Prometheus' own conventions (promtool check metrics): counters end in _total, a 0..1 value in
_ratio, a point in time is _timestamp_seconds since the epoch; the unit is the label `name`, its
full name, as node_exporter's systemd collector labels it, so the two join on(name).
"""

from ..common.atomic import replace_file
from ..readiness.phases import PHASES, TERMINAL


def _label(value):
    return str(value).replace("\\", "\\\\").replace("\"", "\\\"").replace("\n", "\\n")


def prometheus_text(name, verdict, phase_started, expected_load=None, failed_starts=None, starts=None):
    """node_exporter textfile-collector metrics for one verdict of the unit `name` (its full name,
    e.g. sglang-k26.service). phase_started: when the current phase began, wall-clock seconds since
    the epoch; expected_load: the expected load time in seconds, or None. A value still unknown
    (no bytes read yet, no ETA) is left out rather than written as 0. failed_starts: (failed starts
    ever, 1 when the launcher stopped a crash loop else 0) from launcher/crash_loop.py, None when the
    unit keeps no record. starts: the start history's metrics (readiness/start_memory.py
    StartMemory.metrics: the last start's phases, the totals)."""
    labels = 'name="%s"' % _label(name)
    lines = ["# HELP modelwake_phase Start-up phase of the model server: 1 for the current one, 0 for the others.",
             "# TYPE modelwake_phase gauge"]
    for phase in PHASES + TERMINAL:
        lines.append('modelwake_phase{%s,phase="%s"} %d' % (labels, phase, 1 if phase == verdict.phase else 0))
    families = [
        ("modelwake_phase_start_timestamp_seconds", "gauge",
         "When the current phase began, seconds since the epoch.", phase_started),
        ("modelwake_read_bytes_total", "counter",
         "Bytes the server's processes read from disk since the launcher started them.", verdict.bytes_read),
        ("modelwake_load_ratio", "gauge", "Share of the model's weights loaded, 0 to 1.", verdict.fraction),
        ("modelwake_load_eta_seconds", "gauge", "Estimated seconds until loading ends.", verdict.eta),
        ("modelwake_load_expected_seconds", "gauge",
         "Expected load time in seconds (the GPU preflight's estimate or the operator's).", expected_load),
        ("modelwake_start_eta_seconds", "gauge",
         "Estimated seconds until the whole start is ready, from the host's earlier starts.",
         getattr(verdict, "start_eta", None)),
    ]
    if failed_starts is not None:
        families += [
            ("modelwake_failed_starts_total", "counter",
             "Starts that failed before ready (the launcher's record, kept across restarts).", failed_starts[0]),
            ("modelwake_crash_loop", "gauge",
             "1 when the launcher stopped a crash loop (the same root cause in a row), else 0.", failed_starts[1]),
        ]
    for metric, kind, text, value in families:
        if value is not None:
            lines += ["# HELP %s %s" % (metric, text), "# TYPE %s %s" % (metric, kind),
                      "%s{%s} %s" % (metric, labels, value)]
    return "\n".join(lines + start_lines(labels, starts)) + "\n"


def start_lines(labels, starts):
    """The start history's families: each phase's duration in the last recorded start (a gauge: a
    panel of it over time shows the phases of the last starts), and a summary of every recorded
    start's phases, cumulative (kept in the record, so it never drops)."""
    if not starts:
        return []
    lines = []
    if starts.get("last"):
        lines += ["# HELP modelwake_last_start_phase_seconds Duration of each phase of the unit's last recorded start.",
                  "# TYPE modelwake_last_start_phase_seconds gauge"]
        lines += ['modelwake_last_start_phase_seconds{%s,phase="%s"} %s' % (labels, phase, value)
                  for phase, value in sorted(starts["last"].items())]
    if starts.get("totals"):
        lines += ["# HELP modelwake_start_phase_duration_seconds Durations of the start-up phases of the unit's starts.",
                  "# TYPE modelwake_start_phase_duration_seconds summary"]
        for phase, total in sorted(starts["totals"].items()):
            lines += ['modelwake_start_phase_duration_seconds_sum{%s,phase="%s"} %s' % (labels, phase, total["sum"]),
                      'modelwake_start_phase_duration_seconds_count{%s,phase="%s"} %d' % (labels, phase, total["count"])]
    return lines


def write_textfile(path, text):
    """Atomically: the collector must never read a half-written file. Returns an error or None."""
    try:
        replace_file(path, text)
    except OSError as exc:
        return "textfile %s could not be written: %s" % (path, exc)
    return None
