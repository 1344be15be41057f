"""The Type=notify launcher under the guest's real systemd (testinfra; runs after converge). Each
test leaves the unit ready for the next; faults come from a runtime drop-in
that appends the simulator's --fault to the rendered ExecStart, removed afterwards."""
import json
import re

UNIT = "sglang-k26"
SECRET = "mol-notify-secret-52e1"
DROP_IN = "/run/systemd/system/%s.service.d/fault.conf" % UNIT

# Runs on the guest: start the unit with a blocking `systemctl start`, its load held (the unit's
# --hold-load file), sample its state every second meanwhile; once the status says loading, look at
# `systemctl status`, try a completion and let the load go; send a completion the moment the start
# returned.
WATCH_START = r'''
import json, os, re, subprocess, time, urllib.request
UNIT = "sglang-k26"
HOLD = "/var/lib/mol-hold-load"
key = re.search(r'api-key: "([^"]*)"', open("/etc/modelwake/%s.sglang.yaml" % UNIT).read()).group(1)
def show():
    out = subprocess.run(["systemctl", "show", UNIT, "-p", "ActiveState", "-p", "StatusText"],
                         stdout=subprocess.PIPE, universal_newlines=True).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
def completion():
    req = urllib.request.Request("http://127.0.0.1:30001/v1/completions", data=json.dumps(
        {"model": "/srv/models/Kimi-K2.6-sim", "prompt": "2+2=", "max_tokens": 4}).encode(),
        headers={"Content-Type": "application/json", "Authorization": "Bearer " + key})
    try:
        return urllib.request.urlopen(req, timeout=30).status
    except Exception as exc:
        return repr(exc)
subprocess.run(["systemctl", "stop", "model-client.service", UNIT], check=True)
open(HOLD, "w").close()
t0 = time.monotonic()
start = subprocess.Popen(["systemctl", "start", UNIT])
samples, during_load, early, released = [], None, None, None
try:
    while start.poll() is None:
        props = show()
        samples.append([round(time.monotonic() - t0, 1), props.get("ActiveState"), props.get("StatusText")])
        if during_load is None and props.get("StatusText", "").startswith("loading"):
            during_load = subprocess.run(["systemctl", "status", UNIT, "--no-pager", "-n", "0"],
                                         stdout=subprocess.PIPE, universal_newlines=True).stdout
            early = completion()
        # Released once seen loading (or after 120 s, and the checks fail): the start may go on.
        if released is None and (during_load is not None or time.monotonic() - t0 > 120):
            os.remove(HOLD)
            released = round(time.monotonic() - t0, 1)
        time.sleep(1)
finally:
    if os.path.exists(HOLD):
        os.remove(HOLD)
returned = round(time.monotonic() - t0, 1)
print(json.dumps({"rc": start.returncode, "returned": returned, "released": released, "after": completion(),
                  "early": early, "samples": samples, "status_during_load": during_load, "final": show()}))
'''


def guest_python(host, script):
    return host.check_output("python3 - <<'PYEOF'\n%s\nPYEOF" % script)


def show(host, *props):
    out = host.check_output("systemctl show %s %s" % (UNIT, " ".join("-p " + p for p in props)))
    return dict(line.split("=", 1) for line in out.splitlines())


def wait_for(host, command, pattern, timeout):
    """Poll a command on the guest until its output matches; returns the match (or None)."""
    script = (
        "import re, subprocess, time\n"
        "deadline = time.monotonic() + %d\n"
        "while True:\n"
        "    out = subprocess.run(%r, shell=True, stdout=subprocess.PIPE, universal_newlines=True).stdout\n"
        "    m = re.search(%r, out, re.M)\n"
        "    if m or time.monotonic() > deadline:\n"
        "        print(m.group(0) if m else '')\n"
        "        break\n"
        "    time.sleep(1)\n" % (timeout, command, pattern))
    return guest_python(host, script) or None


def start_with_fault(host, fault):
    unit_file = host.file("/etc/systemd/system/%s.service" % UNIT).content_string
    exec_start = [line for line in unit_file.splitlines() if line.startswith("ExecStart=")][0]
    # Where this test's part of the journal begins (the restart below does not happen at once).
    cursor = host.check_output("journalctl -u %s -n 0 --show-cursor --no-pager" % UNIT).split("cursor: ", 1)[1].strip()
    host.check_output("mkdir -p %s" % DROP_IN.rsplit("/", 1)[0])
    host.check_output("printf '[Service]\\nExecStart=\\n%%s\\n' %s > %s"
                      % (json.dumps(exec_start + " --fault " + fault), DROP_IN))
    host.check_output("systemctl daemon-reload && systemctl reset-failed %s; "
                      "systemctl restart --no-block %s" % (UNIT, UNIT))
    return cursor


def clear_fault(host):
    host.check_output("rm -f %s && systemctl daemon-reload && systemctl stop %s; systemctl reset-failed %s; "
                      "systemctl start %s" % (DROP_IN, UNIT, UNIT, UNIT))
    assert show(host, "ActiveState")["ActiveState"] == "active"


def journal_since(host, cursor):
    return host.check_output("journalctl -u %s --no-pager -o cat --after-cursor '%s'" % (UNIT, cursor))


def test_unit_is_a_notify_unit_with_the_stall_budget(host):
    props = show(host, "Type", "NotifyAccess", "TimeoutStartUSec", "ActiveState", "StatusText")
    assert props["Type"] == "notify" and props["NotifyAccess"] == "main"
    assert props["TimeoutStartUSec"] == "54s"  # stall_timeout 20 + 2 polls of 2 + 30
    assert props["ActiveState"] == "active" and re.match(r"ready in \d+", props["StatusText"])
    assert SECRET not in host.check_output("systemctl show %s" % UNIT)


def capabilities(host, pid):
    status = host.file("/proc/%s/status" % pid).content_string
    return dict((k, int(v, 16)) for k, v in re.findall(r"^(Cap\w+):\s+([0-9a-f]+)$", status, re.M))


def test_only_the_launcher_holds_cap_sys_ptrace(host):
    cap_sys_ptrace = 1 << 19
    launcher = show(host, "MainPID")["MainPID"]
    assert capabilities(host, launcher)["CapAmb"] == cap_sys_ptrace
    engine = host.check_output("pgrep -P %s -f modelwake_sim" % launcher).split()  # not a py-spy in flight
    ranks = host.check_output("pgrep -f '^sglang::scheduler_TP'").split()
    assert engine and len(ranks) == 8
    for pid in engine + ranks:
        caps = capabilities(host, pid)
        assert caps["CapEff"] == 0 and caps["CapAmb"] == 0 and caps["CapPrm"] == 0, (pid, caps)


def test_status_shows_the_phases_and_start_returns_only_when_a_completion_works(host):
    got = json.loads(guest_python(host, WATCH_START))
    assert got["rc"] == 0, got
    # The first sample may come before systemd queued the start job.
    first = next(i for i, sample in enumerate(got["samples"]) if sample[1] == "activating")
    samples = got["samples"][first:]
    # Activating for the whole load, until READY=1. A look taken between READY=1 and `systemctl start`
    # noticing its job done (a busy machine) reads active: only at the end, never before a later activating.
    states = [state for _t, state, _text in samples]
    ready = states.index("active") if "active" in states else len(states)
    assert set(states[:ready]) == {"activating"} and set(states[ready:]) <= {"active"}, samples
    samples = samples[:ready]
    texts = [text for _t, _state, text in samples]
    assert any(re.match(r"loading \d+% \(\d+/64 shards", t) for t in texts), texts
    assert any(t.startswith("initializing") for t in texts), texts
    # During the silent initialisation the launcher (as the service user, with the py-spy that
    # inference_env put into the venv) shows where the ranks are. Only the frame: stack reads are
    # spaced by their cost (up to stall_timeout / 4 = 5 s), so an 8 s phase may get a single read,
    # and a function first seen at a read has no "for Ns" yet (durations: test_stacks_sim.py).
    assert any(re.match(r"initializing.* \| TP[0-9,-]+ in burn \(modelwake_sim/ranks\.py:\d+\)", t)
               for t in texts), texts
    assert 'Status: "loading' in got["status_during_load"] and "activating (start)" in got["status_during_load"]
    assert got["early"] != 200  # while loading, no completion: the start must not have returned
    # The start returned only after the load was let go, and the initialisation after it.
    assert got["after"] == 200 and got["returned"] > got["released"], got
    assert got["final"]["ActiveState"] == "active" and got["final"]["StatusText"].startswith("ready in ")


def test_a_dependent_unit_starts_only_once_the_model_is_ready(host):
    host.check_output("systemctl stop model-client.service %s" % UNIT)
    # Requires= pulls the model in, After= orders the client behind its READY=1.
    host.check_output("systemctl start model-client.service")
    assert "client answer 200" in host.check_output("journalctl -u model-client.service --no-pager -o cat -n 5")
    ready_at = int(host.check_output("systemctl show %s -p ActiveEnterTimestampMonotonic --value" % UNIT))
    client_at = int(host.check_output("systemctl show model-client.service -p ExecMainStartTimestampMonotonic --value"))
    assert 0 < ready_at <= client_at


def test_a_crash_ends_the_unit_with_the_root_cause_in_the_journal(host):
    cursor = start_with_fault(host, "crash1:loading --fault-after 1")
    after = "journalctl -u %s --no-pager --after-cursor '%s'" % (UNIT, cursor)
    try:
        line = wait_for(host, after + " -o cat", r"^modelwake: failed: the server logged a fatal error: .*", 90)
        assert line and "CUDA out of memory" in line, line
        code = wait_for(host, after, r"Main process exited, code=exited, status=3/\w+", 30)
        assert code, "the launcher's exit status 3 (EXIT_FAILED) is not in the journal"
        journal = journal_since(host, cursor)
        assert re.search(r"modelwake:   \| .*OutOfMemoryError: CUDA out of memory", journal), journal[-3000:]
    finally:
        clear_fault(host)


def test_a_hang_fails_the_unit_after_the_stall_budget_and_restart_applies(host):
    cursor = start_with_fault(host, "hang:loading --fault-after 2")
    try:
        restarted = wait_for(host, "systemctl show %s -p NRestarts --value" % UNIT, r"^[1-9]\d*$", 120)
        assert restarted, "no automatic restart after the hang"
        journal = journal_since(host, cursor)
        assert "Scheduled restart job, restart counter is at" in journal
        assert re.search(r"^modelwake: stalled: no progress for 2\d s in phase loading", journal, re.M), journal[-3000:]
        assert "modelwake: engine " in journal and "exiting 4 so that Restart= applies" in journal
    finally:
        clear_fault(host)


def test_stopping_the_unit_leaves_no_engine_process(host):
    assert host.run("pgrep -f 'modelwake_si[m] serve'").rc == 0
    host.check_output("systemctl stop %s" % UNIT)
    assert host.run("pgrep -f 'modelwake_si[m] serve'").rc == 1
    assert host.run("pgrep -f '^sglang::'").rc == 1  # the ranks, titled as SGLang titles them
    assert host.run("pgrep -f 'modelwake-launc[h]'").rc == 1
    host.check_output("systemctl start %s" % UNIT)
    assert show(host, "ActiveState")["ActiveState"] == "active"
