"""Monitoring: the launcher's textfile, the alert rules, the dashboard and the scrape targets, checked
with Prometheus' own promtool (Debian's prometheus package; `make test` installs it through
tools/system-packages.txt) and, for the targets, the real playbook on local hosts.

promtool is required, not optional: a missing one fails these tests, it does not skip them."""
import json
import os
import re
import subprocess

import yaml

from ansible_collections.modelwake.serving.plugins.module_utils.launcher.cli import parse_args
from ansible_collections.modelwake.serving.plugins.module_utils.launcher.reporter import Reporter
from ansible_collections.modelwake.serving.plugins.module_utils.launcher.supervisor import Launcher
from ansible_collections.modelwake.serving.plugins.module_utils.launcher.textfile import prometheus_text
from ansible_collections.modelwake.serving.plugins.module_utils.launcher.notify import Notifier
from ansible_collections.modelwake.serving.plugins.module_utils.readiness.verdict import Verdict
from ansible_collections.modelwake.serving.plugins.module_utils.readiness.phases import (FAILED, NOT_STARTED, PHASES,
                                                                                         TERMINAL)

from tests.helpers import ANSIBLE_PLAYBOOK as PLAYBOOK, ROOT

MONITORING = os.path.join(ROOT, "monitoring")
ALERTS = os.path.join(MONITORING, "alerts.yml")
ALERT_TESTS = os.path.join(MONITORING, "alerts.test.yml")
DASHBOARD = os.path.join(MONITORING, "modelwake-dashboard.json")
PROMTOOL = "/usr/bin/promtool"
WALL_START = 1764480000.0
UNIT = "sglang-k26.service"
# Metric names in PromQL: a word that starts with a letter and may hold colons (sglang:num_running_reqs).
METRIC = re.compile(r"\b(modelwake_[a-z_]+|node_[a-z_]+|sglang:[a-z_]+|vllm:[a-z_]+)\b")


def promtool(*args, stdin=None):
    assert os.access(PROMTOOL, os.X_OK), (
        "%s is missing: install Debian's prometheus package (tools/system-packages.txt; make test does)" % PROMTOOL)
    return subprocess.run([PROMTOOL] + list(args), input=stdin, cwd=ROOT, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, universal_newlines=True, timeout=120)


class Snap(object):
    errors = []


# What the start history gives the textfile (StartMemory.metrics): the last start's phases, the totals.
STARTS = {"last": {"starting": 20.0, "loading": 960.0, "initializing": 660.0},
          "totals": {"starting": {"sum": 60.0, "count": 3}, "loading": {"sum": 2900.0, "count": 3},
                     "initializing": {"sum": 2000.0, "count": 3}}}


def reported(tmp_path, verdict, starts=None, name=None):
    """What the launcher's Reporter writes to its textfile after a look that gave `verdict`."""
    path = tmp_path / ("%s.prom" % (name or verdict.phase))
    reporter = Reporter(Notifier({}), clock=lambda: 100.0, extend_seconds=640, name=UNIT, textfile=str(path),
                        wall_clock=lambda: WALL_START, expected_load=930.0, starts=lambda: starts)
    reporter.on_snapshot(Snap(), verdict)
    return path.read_text()


def stopped(tmp_path):
    """What the launcher writes last when it was stopped (no look follows)."""
    path = tmp_path / "stopped.prom"
    options = parse_args(["--url", "http://127.0.0.1:1", "--name", UNIT, "--textfile", str(path),
                          "--expected-load-seconds", "930", "--", "true"])
    Launcher(options, environ={}, wall_clock=lambda: WALL_START + 1500)._final_textfile(NOT_STARTED, "stopped")
    return path.read_text()


def families(text):
    """{metric family: type} of an exposition text."""
    return dict(line.split()[2:4] for line in text.splitlines() if line.startswith("# TYPE "))


def family_of(series, known):
    """The family a series name belongs to: a summary's _sum and _count are its own."""
    base = re.sub(r"_(sum|count)$", "", series)
    return base if known.get(base) == "summary" else series


def all_families():
    """Every family the launcher can write: a verdict with every number known, an expected load time, the
    record of failed starts and the start history."""
    verdict = Verdict(phase="loading", msg="", bytes_read=1, fraction=0.5, eta=1.0, since=1.0, start_eta=2.0)
    return families(prometheus_text(UNIT, verdict, WALL_START, expected_load=1.0, failed_starts=(1, 0), starts=STARTS))


def textfiles(tmp_path):
    progress = {"t": 40.0, "what": "read_bytes +1.2 GiB"}
    return {
        "loading": reported(tmp_path, Verdict(phase="loading", msg="loading", since=12.0, bytes_read=1288490188,
                                              read_rate=429496729.6, fraction=0.45, eta=372.0,
                                              last_progress=progress)),
        "initializing with history": reported(tmp_path, Verdict(
            phase="initializing", msg="initializing", since=980.0, start_eta=120.0, usual=STARTS["last"]),
            starts=STARTS, name="history"),
        "ready": reported(tmp_path, Verdict(phase="ready", msg="ready after 843 s", since=843.0,
                                            bytes_read=2863311530, fraction=1.0)),
        "failed": reported(tmp_path, Verdict(phase=FAILED, msg="failed: exit status 1", terminal=True, since=90.5,
                                             bytes_read=10)),
        "stopped": stopped(tmp_path),
        "crash loop": prometheus_text(UNIT, Verdict(phase=FAILED, msg="failed", terminal=True), WALL_START,
                                      failed_starts=(3, 1)),
    }


# -- the launcher's textfile --------------------------------------------------------------------
def test_every_textfile_the_launcher_writes_passes_promtool_without_a_warning(tmp_path):
    for phase, text in textfiles(tmp_path).items():
        proc = promtool("check", "metrics", stdin=text)
        assert (proc.returncode, proc.stdout) == (0, ""), "%s:\n%s\n%s" % (phase, text, proc.stdout)


def test_the_textfile_keeps_prometheus_conventions_and_dates_the_phase(tmp_path):
    texts = textfiles(tmp_path)
    assert all_families() == {
        "modelwake_phase": "gauge", "modelwake_phase_start_timestamp_seconds": "gauge",
        "modelwake_read_bytes_total": "counter", "modelwake_load_ratio": "gauge",
        "modelwake_load_eta_seconds": "gauge", "modelwake_load_expected_seconds": "gauge",
        "modelwake_failed_starts_total": "counter", "modelwake_crash_loop": "gauge",
        "modelwake_start_eta_seconds": "gauge", "modelwake_last_start_phase_seconds": "gauge",
        "modelwake_start_phase_duration_seconds": "summary"}
    loading = texts["loading"].splitlines()
    assert 'modelwake_phase{name="%s",phase="loading"} 1' % UNIT in loading
    assert sum(1 for line in loading if line.startswith("modelwake_phase{") and line.endswith(" 1")) == 1
    # The phase began 12 s after the launcher's start, in wall-clock seconds since the epoch.
    assert 'modelwake_phase_start_timestamp_seconds{name="%s"} %s' % (UNIT, WALL_START + 12.0) in loading
    assert 'modelwake_read_bytes_total{name="%s"} 1288490188' % UNIT in loading
    assert 'modelwake_load_expected_seconds{name="%s"} 930.0' % UNIT in loading
    # The stop is dated when it happened; the load's numbers are no longer known.
    assert 'modelwake_phase_start_timestamp_seconds{name="%s"} %s' % (UNIT, WALL_START + 1500) in texts["stopped"]
    assert 'modelwake_phase{name="%s",phase="not_started"} 1' % UNIT in texts["stopped"]
    assert "modelwake_read_bytes_total" not in texts["stopped"]
    assert 'modelwake_phase{name="%s",phase="failed"} 1' % UNIT in texts["failed"]
    # Without a record (no --state-dir) the failed starts are unknown, not 0.
    assert "modelwake_failed_starts_total" not in texts["failed"]
    assert 'modelwake_failed_starts_total{name="%s"} 3' % UNIT in texts["crash loop"].splitlines()
    assert 'modelwake_crash_loop{name="%s"} 1' % UNIT in texts["crash loop"].splitlines()
    # With the host's earlier starts: the whole start's ETA, the last start's phases, the cumulative summary.
    history = texts["initializing with history"].splitlines()
    assert 'modelwake_start_eta_seconds{name="%s"} 120.0' % UNIT in history
    assert 'modelwake_last_start_phase_seconds{name="%s",phase="loading"} 960.0' % UNIT in history
    assert 'modelwake_start_phase_duration_seconds_sum{name="%s",phase="initializing"} 2000.0' % UNIT in history
    assert 'modelwake_start_phase_duration_seconds_count{name="%s",phase="initializing"} 3' % UNIT in history
    assert "modelwake_start" not in texts["loading"] and "modelwake_last_start" not in texts["loading"]


# -- the alert rules ------------------------------------------------------------------------------
def alert_rules():
    with open(ALERTS) as handle:
        return [rule for group in yaml.safe_load(handle)["groups"] for rule in group["rules"]]


def test_the_alert_rules_pass_promtool_check_and_their_unit_tests():
    proc = promtool("check", "rules", ALERTS)
    assert proc.returncode == 0 and "SUCCESS: 6 rules found" in proc.stdout, proc.stdout
    proc = promtool("test", "rules", ALERT_TESTS)
    assert proc.returncode == 0 and "SUCCESS" in proc.stdout, proc.stdout


def test_every_alert_is_tested_firing_and_silent():
    with open(ALERT_TESTS) as handle:
        cases = [case for test in yaml.safe_load(handle)["tests"] for case in test["alert_rule_test"]]
    names = [rule["alert"] for rule in alert_rules()]
    assert names == ["ModelStartStalled", "ModelStartFailed", "ModelLoadSlowerThanExpected", "ModelServiceRestarting",
                     "ModelStartsFailingRepeatedly", "ModelCrashLoopStopped"]
    for name in names:
        outcomes = [bool(case["exp_alerts"]) for case in cases if case["alertname"] == name]
        assert True in outcomes and False in outcomes, "%s: needs a case that fires and one that does not" % name


def hold_families():
    """The families of the maintenance hold's textfile, which playbooks/hold.yml writes through the role."""
    with open(os.path.join(ROOT, "roles", "model_service", "tasks", "hold_change.yml")) as handle:
        return set(re.findall(r"# TYPE (modelwake_[a-z_]+) gauge", handle.read()))


def test_the_alerts_read_only_metrics_that_exist():
    written = set(all_families()) | hold_families()
    used = set(name for rule in alert_rules() for name in METRIC.findall(rule["expr"]))
    assert set(name for name in used if name.startswith("modelwake_")) <= written
    # node_exporter's systemd collector, with --collector.systemd.enable-restarts-metrics.
    assert set(name for name in used if not name.startswith("modelwake_")) == {"node_systemd_service_restart_total"}


# -- the dashboard --------------------------------------------------------------------------------
def dashboard():
    with open(DASHBOARD) as handle:
        return json.load(handle)


def expressions(board):
    return [(panel["title"], target["expr"]) for panel in board["panels"] for target in panel.get("targets", [])]


def test_every_dashboard_expression_parses(tmp_path):
    board = dashboard()
    exprs = expressions(board)
    assert len(exprs) >= 10
    # Grafana's variables as Prometheus would see them once Grafana has filled them in.
    concrete = [expr.replace("$__rate_interval", "1m").replace("$name", ".*") for _title, expr in exprs]
    assert not [expr for expr in concrete if "$" in expr]
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": "dashboard:expression_%d" % i, "expr": expr} for i, expr in enumerate(concrete)]}]}
    path = tmp_path / "dashboard-rules.yml"
    path.write_text(yaml.safe_dump(rules))
    proc = promtool("check", "rules", str(path))
    assert proc.returncode == 0 and "SUCCESS: %d rules found" % len(concrete) in proc.stdout, proc.stdout


def test_the_dashboard_shows_the_phases_next_to_the_engines_and_only_metrics_that_exist():
    board = dashboard()
    panels = [panel for panel in board["panels"] if panel["type"] != "row"]
    ids = [panel["id"] for panel in board["panels"]]
    assert len(ids) == len(set(ids))
    used = set(name for _title, expr in expressions(board) for name in METRIC.findall(expr))
    known = all_families()
    assert set(family_of(name, known) for name in used if name.startswith("modelwake_")) == set(known)
    assert {"sglang:num_running_reqs", "sglang:gen_throughput", "vllm:num_requests_running"} <= used
    # The phase over time: a state timeline whose values are mapped to every phase's name.
    timeline = [panel for panel in panels if panel["type"] == "state-timeline"]
    assert len(timeline) == 1
    mapped = timeline[0]["fieldConfig"]["defaults"]["mappings"][0]["options"]
    assert sorted((int(code), value["text"]) for code, value in mapped.items()) == list(enumerate(PHASES + TERMINAL))
    for code, phase in enumerate(PHASES + TERMINAL):
        assert '(modelwake_phase{name=~"$name",phase="%s"} == 1) * %d' % (phase, code) in timeline[0]["targets"][0]["expr"]
    # Every panel queries through the dashboard's data source variable and the unit variable.
    variables = dict((var["name"], var) for var in board["templating"]["list"])
    assert variables["name"]["definition"] == "label_values(modelwake_phase, name)"
    for panel in panels:
        assert panel["datasource"]["uid"] == "${datasource}"
        assert all('name=~"$name"' in target["expr"] for target in panel["targets"]), panel["title"]


# -- the scrape targets ---------------------------------------------------------------------------
TARGET_INVENTORY = {
    "all": {
        "children": {
            "model_hosts": {"hosts": {
                "gpu01": {"ansible_host": "192.0.2.10", "modelwake_host_models": ["pub", "local"]},
                "gpu02": {"ansible_host": "2001:db8::11", "modelwake_host_models": ["pub"]},
                "node0": {"ansible_host": "192.0.2.20", "modelwake_host_models": ["pair"]},
                "node1": {"ansible_host": "192.0.2.21", "modelwake_host_models": ["pair"]},
                "fixed": {"ansible_host": "192.0.2.30", "modelwake_host_models": ["bound"]},
                "typo": {"modelwake_host_models": ["pubb"]},
            }},
            "pair": {"hosts": {"node0": {}, "node1": {}}},
        },
        "vars": {
            "ansible_connection": "local",
            "modelwake_models": {
                "pub": {"engine": "sglang", "unit": "sglang-pub", "port": 30001, "host": "0.0.0.0", "model_path": "/m"},
                "local": {"engine": "vllm", "unit": "vllm-local", "port": 30002, "model_path": "/m"},
                "pair": {"engine": "sglang", "unit": "sglang-pair", "port": 30003, "host": "::", "model_path": "/m",
                         "nodes_group": "pair"},
                "bound": {"engine": "vllm", "unit": "vllm-bound", "port": 8000, "host": "198.51.100.7",
                          "model_path": "/m"},
            },
        },
    },
}


def test_the_scrape_targets_are_file_sd_json_one_per_host_and_model(tmp_path):
    inventory = tmp_path / "inventory.json"
    inventory.write_text(json.dumps(TARGET_INVENTORY))
    out = tmp_path / "prometheus" / "modelwake.json"
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    proc = subprocess.run([PLAYBOOK, "-i", str(inventory), os.path.join(ROOT, "playbooks", "prometheus-targets.yml"),
                           "-e", "modelwake_prometheus_targets_path=%s" % out],
                          cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          universal_newlines=True, timeout=300)
    # The host whose model is not in the catalog fails, naming it; the others' targets are written.
    assert proc.returncode == 2, proc.stdout
    said = " ".join(proc.stdout.split())
    assert "modelwake_host_models of typo names pubb, not in the model catalog" in said
    with open(str(out)) as handle:
        targets = json.load(handle)
    # file_sd: a list of {targets: [host:port, ...], labels: {name: value}}, nothing else.
    assert isinstance(targets, list)
    for group in targets:
        assert set(group) == {"targets", "labels"}
        assert all(isinstance(t, str) and re.match(r"^(\[[0-9a-f:]+\]|[0-9.]+):\d+$", t) for t in group["targets"])
        assert all(isinstance(v, str) and re.match(r"^[a-zA-Z_][a-zA-Z0-9_]*$", k) for k, v in group["labels"].items())
    # A wildcard bind at the host's address (IPv6 in brackets), a fixed bind at its own, only the first node
    # of a multi-node server, nothing bound to loopback (said in the output).
    assert targets == [
        {"targets": ["192.0.2.10:30001"], "labels": {"name": "sglang-pub.service", "model": "pub"}},
        {"targets": ["[2001:db8::11]:30001"], "labels": {"name": "sglang-pub.service", "model": "pub"}},
        {"targets": ["192.0.2.20:30003"], "labels": {"name": "sglang-pair.service", "model": "pair"}},
        {"targets": ["198.51.100.7:8000"], "labels": {"name": "vllm-bound.service", "model": "bound"}},
    ]
    assert "4 targets in %s; left out, bound to loopback" % out in said and "gpu01 vllm-local.service" in said
