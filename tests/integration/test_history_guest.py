"""The start history end to end on a real systemd guest: deploy-k26.yml with `stall_timeout: auto` and
`ready_timeout: auto`, then starts of the simulated engine under the launcher.

One systemd-nspawn guest with scripted GPUs runs the simulator as sglang-hist.service (Type=notify,
StateDirectory=modelwake/sglang-hist). Checked: every start leaves one record in
/var/lib/modelwake/sglang-hist/starts.jsonl (the launcher's, keyed by InvocationID; the deploy's own
wait adds none); the third restart says the usual figures and a whole-start ETA within 20 % of the
start's real length from before its first look, in the journal and in STATUS=; the status look
shows the last start and the usual one; a start made slower on purpose is flagged "slower than usual"
while it runs; and `stall_timeout: auto` (here its floor, 2 min, from the short silences of the
earlier starts) declares a real hang (the simulator's --fault hang:initializing) long before the fixed
default of 600 s, while none of the usual starts was ever called stalled. The guest is destroyed afterwards.
"""
import json
import os
import re
import shutil
import tempfile
import time

import pytest

from modelwake_runner.cli import run_playbook
from tests.helpers import until
from tests.helpers.guesthost import PlayOutput, guest_sh, guest_vars, host_tool

GUEST = "mwh-%d" % (os.getpid() % 100000)
UNIT = "sglang-hist"
SERVICE = UNIT + ".service"
RECORD = "/var/lib/modelwake/%s/starts.jsonl" % UNIT
UNIT_FILE = "/etc/systemd/system/" + SERVICE
# About 17 s a start at one look a second: long enough that the looks' granularity is small beside it.
TIMING = ["--disable-cuda-graph", "--load-rate-mib", "32", "--start-seconds", "2", "--init-seconds", "6",
          "--warmup-seconds", "1"]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0 or shutil.which("systemd-nspawn") is None,
                       reason="test hosts need root and systemd-nspawn (make system-deps)"),
]


def sh(command, check=True, timeout=180):
    return guest_sh(GUEST, command, check=check, timeout=timeout)


def records():
    text = sh("cat %s 2>/dev/null || true" % RECORD)
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def show(*properties):
    out = sh("systemctl show %s %s" % (SERVICE, " ".join("-p " + p for p in properties)))
    return dict(line.split("=", 1) for line in out.splitlines())


def journal_of(invocation):
    assert invocation, "a start without its InvocationID"
    return sh("journalctl _SYSTEMD_INVOCATION_ID=%s -o cat --no-pager" % invocation)


def seconds(text):
    """A duration as common/formatting.py writes it (45s, 6m12s, 1h02m), in seconds."""
    match = re.match(r"^(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$", text)
    assert match and text, text
    hours, minutes, secs = (int(part or 0) for part in match.groups())
    return hours * 3600 + minutes * 60 + secs


def edit_engine(old, new):
    """Change the engine's arguments in the rendered unit (a test's shortcut past a deploy)."""
    sh("sed -i 's/%s/%s/' %s && systemctl daemon-reload" % (old, new, UNIT_FILE))


def restart_watching(until_text=None, timeout=180):
    """Restart without blocking; follow StatusText every 0.5 s until the start ends (active, or a
    restart after a verdict). Returns (InvocationID of the new start, the status texts seen)."""
    before = show("InvocationID")["InvocationID"]
    sh("systemctl restart --no-block %s" % SERVICE)
    texts = []
    deadline = time.monotonic() + timeout
    invocation = None
    while time.monotonic() < deadline:
        state = show("InvocationID", "ActiveState", "SubState", "StatusText")
        if state["InvocationID"] not in ("", before):
            invocation = invocation or state["InvocationID"]
            if state["InvocationID"] != invocation:
                break  # systemd restarted it after a verdict: that start is over
            if state["StatusText"] and (not texts or texts[-1] != state["StatusText"]):
                texts.append(state["StatusText"])
            if state["ActiveState"] == "active" and state["SubState"] == "running":
                break
            if state["ActiveState"] in ("failed", "inactive") or state["SubState"] == "auto-restart":
                break
            if until_text and any(until_text in text for text in texts):
                break
        time.sleep(0.5)
    assert invocation, "the unit never started again"
    return invocation, texts


@pytest.fixture(scope="module")
def guest(tmp_path_factory):
    tmp = str(tmp_path_factory.mktemp("history"))
    host_tool("up", GUEST)
    try:
        host_tool("install-fake-gpus", GUEST)
        inventory = os.path.join(tmp, "inventory.json")
        with open(inventory, "w") as handle:
            json.dump({"all": {
                "children": {"model_hosts": {"hosts": {GUEST: {"ansible_host": host_tool("addr", GUEST)}}}},
                "vars": dict(guest_vars(host_tool("key")), **{
                    "modelwake_deploy_model": "hist", "modelwake_host_models": ["hist"],
                    "modelwake_gpus_required": True, "modelwake_demo_model_size_mib": 256,
                    "modelwake_demo_model_shards": 64, "model_service_poll_interval": 1,
                    # Seven starts in a few minutes: above the role's default start limit.
                    "model_service_start_limit_burst": 20,
                    "modelwake_models": {"hist": {
                        "engine": "sglang", "engine_package": "modelwake-sim", "engine_version": "0.1.0",
                        "unit": UNIT, "port": 30001, "model_path": "/srv/models/Kimi-K2.6-sim", "tp": 2,
                        "gpus": [0, 1], "extra_args": TIMING, "ready_timeout": "auto", "stall_timeout": "auto"}},
                })}}, handle)
        for playbook in ("playbooks/demo-model.yml", "deploy-k26.yml"):
            private = tempfile.mkdtemp(prefix="play-", dir=tmp)
            objects = []
            runner, _events = run_playbook(playbook, private, [inventory], None, on_object=objects.append,
                                           timeout=900)
            output = PlayOutput(runner.stdout.read(), objects)
            assert runner.rc == 0, output[-5000:]
        yield {"inventory": inventory, "tmp": tmp, "deploy": output}
    finally:
        host_tool("down", GUEST, check=False)


def test_three_starts_teach_the_usual_and_the_third_knows_its_eta(guest):
    deploy = guest["deploy"]
    # deploy-k26.yml's waits took the catalog's auto budgets and said how.
    waits = [o for o in deploy.objects if o["event"] == "verdict" and o.get("phase") == "ready"]
    assert waits and all((o.get("budgets") or "").startswith("auto budgets ") for o in waits), waits
    assert "StateDirectory=modelwake/%s" % UNIT in sh("systemctl cat %s" % SERVICE)
    first = records()
    # One record per start, the launcher's: the deploy's waits (on a launcher's unit) added none.
    assert first and all(r["verdict"] == "ready" for r in first), first
    assert "no earlier start of this model on this host, the defaults" in journal_of(first[0]["invocation"])
    for _ in range(2):
        sh("systemctl restart %s" % SERVICE, timeout=180)  # a notify unit: returns at READY=1
    invocation, texts = restart_watching()
    kept = records()
    assert len(kept) == len(first) + 3 and len(set(r["invocation"] for r in kept)) == len(kept), kept
    third = kept[-1]
    assert third["invocation"] == invocation and third["verdict"] == "ready"
    assert [p["phase"] for p in third["phases"]] == ["starting", "loading", "initializing"], third
    # The weights' size (the launcher's --model-path), as the wait sizes it: every *.safetensors file.
    weights = int(sh("cat /srv/models/Kimi-K2.6-sim/*.safetensors | wc -c"))
    assert third["model_bytes"] == weights and third["host"]["gpus"] == [0, 1], third
    # Before its first look the launcher said what the earlier starts let it expect.
    said = journal_of(invocation)
    match = re.search(r"earlier starts of this model \(%d\): usual: starting \S+, loading \S+, initializing \S+ "
                      r"\| ~(\S+) left" % (len(kept) - 1), said)
    assert match, said
    expected, truth = seconds(match.group(1)), third["verdict_after"]
    assert abs(expected - truth) <= 0.2 * truth, (expected, truth)
    # systemctl status said it too while the start ran.
    assert any(re.search(r" \| usual: starting \S+, loading \S+, initializing \S+ \| ~\S+ left", text)
               for text in texts), texts
    # The fleet view: the status look shows the last start and the usual one.
    private = tempfile.mkdtemp(prefix="play-", dir=guest["tmp"])
    runner, events = run_playbook("playbooks/status.yml", private, [guest["inventory"]], None, timeout=300)
    verdict = events.verdicts[(GUEST, SERVICE)]
    assert verdict["last_start"]["verdict"] == "ready" and verdict["last_start"]["phases"]["loading"] > 0, verdict
    assert set(verdict["usual"]) == {"starting", "loading", "initializing"}, verdict
    # (The callback folds long lines of the table: compared with its whitespace joined.)
    assert "last start: ready after" in " ".join(runner.stdout.read().split())


def test_a_slower_start_is_flagged_while_it_runs(guest):
    # Initialising 45 s where it usually takes about 6: flagged once past 1.5x, and never before 30 s into it.
    edit_engine("--init-seconds 6", "--init-seconds 45")
    try:
        invocation, texts = restart_watching(until_text="slower than usual")
    finally:
        edit_engine("--init-seconds 45", "--init-seconds 6")
    flagged = [text for text in texts if "slower than usual (x" in text]
    assert flagged and flagged[0].startswith("initializing"), texts
    until("the slow start ready", lambda: show("ActiveState")["ActiveState"] == "active", timeout=120)
    slow = [r for r in records() if r["invocation"] == invocation]
    assert slow and slow[0]["verdict"] == "ready", records()


def test_auto_stall_declares_a_real_hang_sooner_than_the_default(guest):
    assert all(r["verdict"] == "ready" for r in records()), records()  # the usual silences: never a hang
    edit_engine("--warmup-seconds 1", "--warmup-seconds 1 --fault hang:initializing")
    try:
        began = time.monotonic()
        invocation, texts = restart_watching(timeout=400)
        took = time.monotonic() - began
    finally:
        edit_engine(" --fault hang:initializing", "")
        sh("systemctl stop %s" % SERVICE, check=False)
    said = journal_of(invocation)
    budget = re.search(r"auto budgets from \d+ earlier start\(s\)[^:]*: stall_timeout (\S+) ", said)
    assert budget, said
    stall = seconds(budget.group(1))
    assert stall < 600, said
    assert "stalled: no progress for" in said, said
    # Declared within the derived budget (and its polls), long before the fixed default would.
    assert took < stall + 90 < 600, (took, stall)
    hung = [r for r in records() if r["invocation"] == invocation]
    assert hung and hung[0]["verdict"] == "stalled", records()
