"""Crash loops on a real systemd guest: deploy-k26.yml deploys the simulated engine under the launcher
(Restart=always, RestartSec=1), then its starts fail, with the error each start takes from a queue on
the guest (a small wrapper pops one line per start: no redeploy between starts).

The same error three times: the launcher exits 7, RestartPreventExitStatus= leaves the unit failed,
the journal and /var/lib/modelwake/<unit>/failed-starts.json name the loop, the textfile counts the
failed starts, and playbooks/status.yml and `python -m modelwake_runner status` say "crash loop: 3
failed starts in ..., each AttributeError: ..., stopped". Then, started again: one error twice and
another three times: the other error starts the count again, so the loop is stopped only at the fifth
start, on the second error. After a failure, the deploy's next move: the same deploy again refuses to
start the stopped loop, quoting it, and starts it with model_service_retry_failed_start=true; a changed
deploy whose restart fails stops the unit (no start of Restart= after the play), and the same deploy
again refuses, quoting that start's cause, and a changed catalog entry starts it, the play naming the change.
The start history (starts.jsonl) keeps a failed start of each phase with the phase it reached and its real duration.
The guest is destroyed afterwards, also when a test fails.
"""
import json
import os
import re
import shutil
import subprocess
import time

import pytest

from tests.helpers import ANSIBLE_PLAYBOOK as PLAYBOOK, ROOT, VENV_BIN, until
from tests.helpers.guesthost import guest_sh, guest_vars, host_tool

PYTHON = os.path.join(VENV_BIN, "python")
GUEST = "mwc-%d" % (os.getpid() % 100000)
UNIT = "sglang-mwc"
STATE = "/var/lib/modelwake/%s/failed-starts.json" % UNIT
TEXTFILE_DIR = "/var/lib/mwc-textfile"
# The wrapper's queue: in the unit's CacheDirectory=, which the service user may write.
QUEUE = "/var/cache/modelwake/%s/faults" % UNIT
WRAPPER = "/usr/local/bin/mwc-engine"
# The fault of each start: the queue's first line, popped while more than one remain (the last one stays).
WRAPPER_SCRIPT = """#!/bin/sh
queue=$1
shift
fault=""
if [ -s "$queue" ]; then
    fault=$(head -n 1 "$queue")
    if [ "$(wc -l < "$queue")" -gt 1 ]; then
        sed -i 1d "$queue"
    fi
fi
exec "$@" $fault
"""
FAST = ["--disable-cuda-graph", "--load-rate-mib", "64", "--start-seconds", "1", "--init-seconds", "1",
        "--warmup-seconds", "1"]
STARTING = "--fault crash1:starting"  # AttributeError: type object 'CompressionFormat' has no attribute ...
LOADING = "--fault crash1:loading"  # torch.OutOfMemoryError: CUDA out of memory. ...
INITIALIZING = "--fault crash1:initializing"  # RuntimeError: CUDA error: an illegal memory access was encountered
HISTORY = "/var/lib/modelwake/%s/starts.jsonl" % UNIT
ATTRIBUTE = "AttributeError: type object 'CompressionFormat' has no attribute 'nvfp4_pack_quantized'"
OOM = "torch.OutOfMemoryError: CUDA out of memory."

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0 or shutil.which("systemd-nspawn") is None,
                       reason="test hosts need root and systemd-nspawn (make system-deps)"),
]


def on_guest(command, check=True, stdin=None):
    return guest_sh(GUEST, command, check=check, stdin=stdin)


def unit_state():
    out = on_guest("systemctl show %s -p ActiveState,SubState,ExecMainStatus,NRestarts,Result" % UNIT)
    return dict(line.split("=", 1) for line in out.splitlines())


def record():
    return json.loads(on_guest("cat %s" % STATE))


def metric(name):
    text = on_guest("cat %s/%s.prom" % (TEXTFILE_DIR, UNIT))
    match = re.search(r'^%s\{name="%s\.service"\} (\S+)$' % (name, UNIT), text, re.M)
    assert match, text
    return float(match.group(1))


def start_failing(faults):
    """Queue one fault per start (the last one for every start after), then start the unit again
    without waiting for it; returns when the unit is failed, with the journal of these starts."""
    on_guest("cat > %s && chmod 0644 %s" % (QUEUE, QUEUE), stdin="".join(fault + "\n" for fault in faults))
    cursor = on_guest("journalctl -n 0 --show-cursor -o cat | sed -n 's/^-- cursor: //p'")
    on_guest("systemctl restart --no-block %s" % UNIT)
    until("the unit failed", lambda: unit_state()["ActiveState"] == "failed", timeout=180)
    return on_guest("journalctl -u %s -o cat --after-cursor '%s'" % (UNIT, cursor))


def play(tmp, playbook, *args):
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    proc = subprocess.run([PLAYBOOK, "-i", str(tmp / "inventory.json"), os.path.join(ROOT, playbook)] + list(args),
                          cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          universal_newlines=True, timeout=900)
    return proc.returncode, proc.stdout


def runner_status(tmp):
    """`python -m modelwake_runner status`: (rc, its JSON objects)."""
    argv = [PYTHON, "-m", "modelwake_runner", "status", "-i", str(tmp / "inventory.json"),
            "--artifacts", str(tmp / ("runner-%d" % time.monotonic_ns()))]
    proc = subprocess.run(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True,
                          timeout=600)
    return proc.returncode, [json.loads(line) for line in proc.stdout.splitlines()]


@pytest.fixture(scope="module")
def guest(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("mwc")
    host_tool("up", GUEST)
    try:
        host_tool("install-fake-gpus", GUEST)
        on_guest("cat > %s && chmod 0755 %s" % (WRAPPER, WRAPPER), stdin=WRAPPER_SCRIPT)
        inventory = {"all": {
            "children": {"model_hosts": {"hosts": {GUEST: {"ansible_host": host_tool("addr", GUEST)}}}},
            "vars": dict(guest_vars(host_tool("key")), **{
                "modelwake_deploy_model": "mwc",
                "modelwake_host_models": ["mwc"],
                "modelwake_gpus_required": True,
                "modelwake_demo_model_size_mib": 32,
                "modelwake_demo_model_shards": 4,
                "modelwake_textfile_dir": TEXTFILE_DIR,
                "modelwake_models": {"mwc": {
                    "engine": "sglang", "engine_package": "modelwake-sim", "engine_version": "0.1.0",
                    "unit": UNIT, "port": 30007, "model_path": "/srv/models/mwc-sim", "tp": 1, "gpus": [0],
                    "extra_args": FAST, "ready_timeout": 300, "stall_timeout": 60}},
                # Fast restarts, and a start limit no test reaches: only the launcher ends these loops.
                "model_service_restart_sec": 1,
                "model_service_start_limit_burst": 100,
                # The simulator behind the wrapper that gives each start its fault.
                "model_service_engine_command": "{{ ['%s', '%s', model_service_venv ~ '/bin/python', '-m', "
                                                "'modelwake_sim', 'serve', '--engine', model_service_engine] }}"
                                                % (WRAPPER, QUEUE),
            })}}
        (tmp / "inventory.json").write_text(json.dumps(inventory))
        rc, out = play(tmp, "playbooks/demo-model.yml")
        assert rc == 0, out[-5000:]
        rc, out = play(tmp, "deploy-k26.yml")
        assert rc == 0, out[-5000:]
        assert unit_state()["ActiveState"] == "active"
        yield tmp
    finally:
        host_tool("down", GUEST, check=False)


def test_the_same_error_three_times_stops_the_loop_and_every_look_names_it(guest):
    # The deploy's start reached ready: a record with nothing failed, owned by the service user.
    assert on_guest("stat -c '%%U' %s" % STATE) == "modelwake"
    assert record()["failed_starts_total"] == 0
    journal = start_failing([STARTING])
    state = unit_state()
    assert (state["ExecMainStatus"], state["Result"], state["NRestarts"]) == ("7", "exit-code", "2"), (state, journal)
    said = [line for line in journal.splitlines() if line.startswith("modelwake: crash loop: ")]
    assert len(said) == 1 and re.match(r"modelwake: crash loop: 3 failed starts in \w+, each %s, stopped$"
                                       % re.escape(ATTRIBUTE), said[0]), journal
    kept = record()
    assert kept["consecutive"] == 3 and kept["stopped"]["message"] == said[0][len("modelwake: "):]
    assert ATTRIBUTE in kept["evidence"]
    assert (metric("modelwake_failed_starts_total"), metric("modelwake_crash_loop")) == (3, 1)
    # The status playbook's table, and the runner's verdict with the recorded evidence.
    rc, out = play(guest, "playbooks/status.yml")
    # The table's row, as Ansible's output wraps it.
    row = r"\s+".join([GUEST, UNIT, "failed", "failed:", "crash", "loop:", "3", "failed", "starts", "in"])
    assert rc == 0 and re.search(row, out), out
    rc, objects = runner_status(guest)
    verdict, = objects[-1]["verdicts"]
    assert rc == 1 and verdict["phase"] == "failed", objects[-1]
    assert verdict["msg"].startswith("failed: %s (unit %s" % (kept["stopped"]["message"], UNIT)), verdict
    assert "exit status 7" in verdict["msg"], verdict
    assert ATTRIBUTE in verdict["evidence"]


def test_another_error_starts_the_count_again(guest):
    # Started again after the stop: a new run. The first error twice, then another one: 1, 2, then 1, 2, 3.
    journal = start_failing([STARTING, STARTING, LOADING])
    assert unit_state()["ExecMainStatus"] == "7", journal
    assert len(re.findall(r"modelwake: engine started as pid \d+", journal)) == 5, journal
    counts = re.findall(r"modelwake: failed start (\d) of 3 in a row", journal)
    assert counts == ["1", "2", "1", "2"], journal
    kept = record()
    causes = [start["cause"] for start in kept["starts"][-5:]]
    assert [ATTRIBUTE in cause for cause in causes] == [True, True, False, False, False], causes
    assert all(cause.startswith(OOM) for cause in causes[2:]), causes
    assert kept["consecutive"] == 3 and kept["stopped"]["message"].startswith("crash loop: 3 failed starts in ")
    assert ", each %s" % OOM in kept["stopped"]["message"]
    assert (metric("modelwake_failed_starts_total"), metric("modelwake_crash_loop")) == (8, 1)


def engine_starts(journal):
    return len(re.findall(r"modelwake: engine started as pid \d+", journal))


def journal_cursor():
    return on_guest("journalctl -n 0 --show-cursor -o cat | sed -n 's/^-- cursor: //p'")


def journal_after(cursor):
    return on_guest("journalctl -u %s -o cat --after-cursor '%s'" % (UNIT, cursor))


def test_a_deploy_that_changes_nothing_refuses_the_stopped_loop_and_the_retry_variable_starts_it(guest):
    # The loop the test above stopped (stopped again here on a rerun, whose failed try may have started the
    # unit): the same deploy again would start a new loop of the same failure.
    if unit_state()["ExecMainStatus"] != "7":
        start_failing([LOADING])
    assert unit_state()["ExecMainStatus"] == "7"
    on_guest("rm -f %s" % QUEUE)  # were the unit started, it would now come up: the refusal alone keeps it down
    cursor = journal_cursor()
    rc, out = play(guest, "deploy-k26.yml")
    flat = " ".join(out.split())
    assert rc == 2 and "is down after a failed start and nothing it runs from changed since" in flat, out[-4000:]
    assert re.search(r"crash loop: 3 failed starts in \w+, each %s" % re.escape(OOM), flat), flat[-4000:]
    assert "(3 failed starts in a row; journalctl -u %s)" % UNIT in flat, flat[-4000:]
    assert "changed: [" not in out, out[-4000:]
    assert unit_state()["ActiveState"] == "failed" and engine_starts(journal_after(cursor)) == 0
    # Told to: started as it is, and ready.
    rc, out = play(guest, "deploy-k26.yml", "-e", "model_service_retry_failed_start=true")
    assert rc == 0, out[-4000:]
    assert unit_state()["ActiveState"] == "active" and record()["consecutive"] == 0


def test_a_failed_restart_stops_the_unit_so_no_start_follows_the_play_and_the_same_deploy_refuses(guest):
    on_guest("cat > %s && chmod 0644 %s" % (QUEUE, QUEUE), stdin=LOADING + "\n")  # every start runs out of memory
    slower = ["-e", json.dumps({"model_service_extra_args": FAST[:-2] + ["--warmup-seconds", "2"]})]
    cursor = journal_cursor()
    rc, out = play(guest, "deploy-k26.yml", *slower)
    flat = " ".join(out.split())
    assert rc == 2 and OOM in flat, flat[-4000:]
    assert "%s was stopped after this failed start, so that systemd starts no load after the play" % UNIT in flat, \
        flat[-4000:]
    # Restart= would start it again within RestartSec (1 s; here a start fails faster than the wait's verdict,
    # so Restart= may have made one before the stop): nothing starts after the play.
    starts = engine_starts(journal_after(cursor))
    time.sleep(5)
    assert unit_state()["ActiveState"] in ("inactive", "failed"), unit_state()
    assert starts >= 1 and engine_starts(journal_after(cursor)) == starts, journal_after(cursor)
    # The same deploy again: refused in seconds, quoting the failed start.
    started = time.monotonic()
    rc, out = play(guest, "deploy-k26.yml", *slower)
    flat = " ".join(out.split())
    assert rc == 2 and "Its last start failed: %s" % OOM in flat, flat[-4000:]
    # (The last start may have been stopped before it failed: the record counts the ones that did.)
    counted = re.search(r"\((\d+) failed starts? in a row; journalctl -u %s\)" % UNIT, flat)
    assert counted and 1 <= int(counted.group(1)) <= starts, flat[-4000:]
    assert engine_starts(journal_after(cursor)) == starts
    print("the refused deploy took %.1f s" % (time.monotonic() - started))
    # The cause fixed, and the catalog entry changed (its arguments as before): that change starts it, and the
    # play says which change it saw. (Without a change, the retry variable starts it: the test above.)
    on_guest("rm -f %s" % QUEUE)
    rc, out = play(guest, "deploy-k26.yml")
    assert rc == 0 and unit_state()["ActiveState"] == "active", out[-4000:]
    assert "msg: %s restarts for its unit file" % UNIT in out, out[-4000:]


def test_with_retry_the_deploy_follows_restarts_until_a_start_is_ready(guest):
    # A cause that passes: the first start runs out of memory, the next one comes up.
    on_guest("cat > %s && chmod 0644 %s" % (QUEUE, QUEUE), stdin=LOADING + "\n\n")
    changed = ["-e", json.dumps({"model_service_extra_args": FAST[:-2] + ["--warmup-seconds", "3"],
                                 "model_service_failed_start": "retry"})]
    cursor = journal_cursor()
    rc, out = play(guest, "deploy-k26.yml", *changed)
    flat = " ".join(out.split())
    assert rc == 0, flat[-4000:]
    assert flat.count("FAILED - RETRYING: [%s]: Wait for the restarted model service to be ready" % GUEST) == 1, flat[-4000:]
    assert "%s: ready on start 2, after 1 failed start(s) that Restart= followed" % UNIT in flat, flat[-4000:]
    assert unit_state()["ActiveState"] == "active" and engine_starts(journal_after(cursor)) == 2


def test_the_history_keeps_each_failed_start_with_the_phase_it_reached_and_its_real_duration(guest):
    # The tests above failed starts in `starting` and `loading`; one more fails in `initializing`, then the
    # next start comes up.
    on_guest("cat > %s && chmod 0644 %s" % (QUEUE, QUEUE), stdin=INITIALIZING + "\n\n")
    cursor = journal_cursor()
    on_guest("systemctl restart --no-block %s" % UNIT)
    until("a start ready after the failed one",
          lambda: engine_starts(journal_after(cursor)) == 2 and unit_state()["SubState"] == "running"
          and "ready in" in on_guest("systemctl show -p StatusText --value %s" % UNIT), timeout=120)
    records = [json.loads(line) for line in on_guest("cat %s" % HISTORY).splitlines()]
    assert records[-1]["verdict"] == "ready", records[-1]
    failed = {}
    for entry in records:
        if entry["verdict"] == "failed":
            failed.setdefault(entry["phases"][-1]["phase"], entry)
    assert sorted(failed) == ["initializing", "loading", "starting"], [
        (entry["verdict"], entry["verdict_after"], [(step["phase"], step["duration"]) for step in entry["phases"]])
        for entry in records]
    for phase, entry in failed.items():
        # Each phase lasted until the next began, the last one until the verdict: none of them 0 s, and
        # together the whole start as the launcher watched it (from its first look).
        durations = [step["duration"] for step in entry["phases"]]
        assert all(duration > 0 for duration in durations), (phase, entry)
        assert abs(sum(durations) - entry["verdict_after"]) <= 0.2, (phase, entry)
