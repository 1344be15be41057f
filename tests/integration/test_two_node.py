"""SGLang's two-node tensor parallel for real: the simulated engine on two systemd test hosts, node 0
listening on the dist-init port, node 1 connecting to it over the test bridge, deployed as one group
(`nodes_group`) by deploy-k26.yml.

  first deploy              both nodes restart together; node 0's wait asks its own port, node 1's wait
                            asks node 0's; each follows its own processes; the group serves; status.yml
                            looks at both the same way
  node 1 dies while loading node 0's wait fails at its next look, naming node 1 (its connections to the
                            dist-init port closed), not by the stall bound; with model_service_failed_start:
                            retry the deploy then follows the group's next start, re-formed by itself, to ready
  rolling restart           the pair restarts as one unit of service onto a changed argument: node 0's
                            turn restarts both onto their new units, each node starts once

The guests are destroyed afterwards, also on failure.
"""
import json
import os
import re
import shutil
import tempfile
import threading
import time

import pytest

from modelwake_runner.cli import run_playbook
from tests.helpers import until
from tests.helpers.guesthost import PlayOutput, Timed, guest_sh, guest_vars, host_tool, verdicts

GROUP = "sim_pair"
NODES = ["pair-node0", "pair-node1"]
UNIT = "sglang-pair"
PORT = 30003
DIST_PORT = 50000
MODEL = "/srv/models/pair-sim"
SECRET = "sk-pair-test-41d9"
HOLD = "/var/lib/mwp-hold-load"
FAST = ["--disable-cuda-graph", "--load-rate-mib", "32", "--start-seconds", "1", "--init-seconds", "1",
        "--warmup-seconds", "1"]
STALL = 60

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0 or shutil.which("systemd-nspawn") is None,
                       reason="test hosts need root and systemd-nspawn (make system-deps)"),
]

TIMINGS = {}


class Pair(object):
    """Two guests as the inventory group sim_pair, in rank order."""

    def __init__(self):
        suffix = os.getpid() % 100000
        self.guests = {node: "mwp%d-%d" % (rank, suffix) for rank, node in enumerate(NODES)}
        self.addresses = {}
        self.tmp = None
        self.extra_args = FAST  # the engine arguments the pair's units run with now

    def up(self, tmp):
        self.tmp = tmp
        for node, guest in self.guests.items():
            host_tool("up", guest)
            self.addresses[node] = host_tool("addr", guest)
        self.inventory = os.path.join(tmp, "pair.json")
        with open(self.inventory, "w") as handle:
            json.dump({"all": {
                "children": {GROUP: {"hosts": dict((node, {"ansible_host": self.addresses[node]}) for node in NODES)}},
                "vars": dict(guest_vars(host_tool("key")), **{
                    "modelwake_host_models": ["pair"],
                    "modelwake_gpus_required": False,
                    "modelwake_demo_model_size_mib": 64,
                    "modelwake_demo_model_shards": 8,
                    "modelwake_models": {"pair": {
                        "engine": "sglang", "engine_package": "modelwake-sim", "engine_version": "0.1.0", "unit": UNIT,
                        "port": PORT, "host": "0.0.0.0", "api_key": SECRET, "model_path": MODEL, "tp": 2,
                        "gpus": [0], "nodes_group": GROUP, "extra_args": FAST, "ready_timeout": 300,
                        "stall_timeout": STALL}},
                })}}, handle)

    def down(self):
        for guest in self.guests.values():
            host_tool("down", guest, check=False)

    def sh(self, node, command, check=True):
        return guest_sh(self.guests[node], command, check=check)

    def unit_state(self, node):
        out = self.sh(node, "systemctl show %s -p InvocationID -p NRestarts -p ActiveState -p MainPID "
                            "-p ActiveEnterTimestampMonotonic" % UNIT)
        return dict(line.split("=", 1) for line in out.splitlines())

    def play(self, playbook, extra=None):
        """A playbook of the repository against the pair, through ansible-runner: (rc, PlayOutput)."""
        private = tempfile.mkdtemp(prefix="pair-", dir=self.tmp)
        objects = []
        try:
            # The play's hosts: come from extra variables (a play's hosts: never sees the inventory's).
            runner, _events = run_playbook(playbook, private, [self.inventory],
                                           dict(extra or {}, modelwake_deploy_hosts=GROUP),
                                           on_object=objects.append, timeout=900)
            return runner.rc, PlayOutput(runner.stdout.read(), objects)
        finally:
            shutil.rmtree(private, ignore_errors=True)


PAIR = Pair()


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    try:
        with Timed(TIMINGS, "two guests up"):
            PAIR.up(str(tmp_path_factory.mktemp("pair")))
        with Timed(TIMINGS, "model on both, first deploy of the group"):
            rc, out = PAIR.play("playbooks/demo-model.yml")
            assert rc == 0, out[-4000:]
            rc, out = PAIR.play("deploy-k26.yml")
        assert rc == 0, out[-4000:]
        PAIR.first = out
        assert any(o["event"] == "recap" and len(o["hosts"]) == 2 for o in out.objects), out[-3000:]
        yield PAIR
    finally:
        PAIR.down()
        print("\ntwo-node deploy, measured (s): %s" % json.dumps(TIMINGS, indent=1))


def completion(node):
    """A completion asked of node 0's port from `node` (over the bridge from node 1)."""
    return PAIR.sh(node, "python3 -c \"import json, urllib.request\n"
                         "request = urllib.request.Request('http://%s:%d/v1/completions', method='POST',"
                         " data=json.dumps({'prompt': '2+2=', 'max_tokens': 4}).encode(),"
                         " headers={'Content-Type': 'application/json', 'Authorization': 'Bearer %s'})\n"
                         "print(json.load(urllib.request.urlopen(request, timeout=30))['choices'][0]['text'])\""
                   % (PAIR.addresses[NODES[0]], PORT, SECRET))


def dist_init_peers(node):
    """The remote addresses of node's established connections on the dist-init port."""
    out = PAIR.sh(node, "ss -Htn state established '( sport = :%d or dport = :%d )'" % (DIST_PORT, DIST_PORT))
    return set(re.sub(r"^\[?(::ffff:)?", "", line.split()[-1]).rsplit(":", 1)[0].rstrip("]")
               for line in out.splitlines() if line.strip())


def test_the_group_comes_up_together_and_serves_from_node_0(pair):
    first = pair.first
    waits = dict(((v.get("host"), v["phase"]) for v in verdicts(first, UNIT + ".service")))
    assert waits.get(NODES[0]) == "ready" and waits.get(NODES[1]) == "ready", verdicts(first)
    # Node 1 waited on node 0's port, with its own processes as evidence.
    assert completion(NODES[1]) != "" and completion(NODES[0]) != ""
    # Node 0 listens on the dist-init port; node 1's engine is connected to it, and serves no HTTP.
    assert dist_init_peers(NODES[0]) == {pair.addresses[NODES[1]]}
    assert dist_init_peers(NODES[1]) == {pair.addresses[NODES[0]]}
    assert pair.sh(NODES[1], "ss -Htln '( sport = :%d )'" % PORT) == ""
    unit = pair.sh(NODES[1], "systemctl cat %s" % UNIT)
    assert "--nnodes 2 --node-rank 1 --dist-init-addr %s:%d" % (pair.addresses[NODES[0]], DIST_PORT) in unit
    assert SECRET not in unit and SECRET not in first
    # status.yml looks at each node the same way: both ready, none missing from the group.
    document = os.path.join(pair.tmp, "status.json")
    rc, out = pair.play("playbooks/status.yml", {"modelwake_status_json": document})
    assert rc == 0, out[-3000:]
    with open(document) as handle:
        looks = dict((look["host"], look) for look in json.load(handle))
    assert [looks[node]["phase"] for node in NODES] == ["ready", "ready"], looks
    assert "not joined" not in json.dumps(looks) and SECRET not in json.dumps(looks)


def journal_cursor(pair, node):
    return pair.sh(node, "journalctl -u %s -n 0 --show-cursor --no-pager" % UNIT).split("cursor: ", 1)[1].strip()


def launcher_names_node_1(pair, cursor):
    """Node 0's launcher has logged, after the journal's `cursor`, that node 1 left the group (and
    exited for Restart=)."""
    left = "node pair-node1 (%s) left the group" % pair.addresses[NODES[1]]
    try:
        until("node 0's launcher names node 1", lambda: left in pair.sh(
            NODES[0], "journalctl -u %s --no-pager -o cat --after-cursor '%s' | grep -F 'left the group' || true"
            % (UNIT, cursor)), timeout=60)
    except AssertionError:
        raise AssertionError("%s\n%s\n%s" % (pair.sh(NODES[0], "systemctl show %s -p StatusText -p NRestarts; "
                                                             "grep -i ':C350 ' /proc/net/tcp /proc/net/tcp6; ps -ef" % UNIT),
                                         pair.sh(NODES[0], "systemctl cat %s | grep ExecStart" % UNIT),
                                         pair.sh(NODES[0], "journalctl -u %s --no-pager -o cat | grep -v ' Load weight' "
                                                           "| tail -60" % UNIT)))


def test_node_1_dying_while_loading_fails_node_0s_wait_naming_it(pair):
    # A hold file of this attempt's own: its path is a new argument on both nodes, so the group restarts
    # together, also on a rerun after a failed attempt left the pair running with the previous one.
    hold = "%s-%d" % (HOLD, time.time())
    pair.sh(NODES[0], "touch %s" % hold)  # node 0 pauses before its last shard: the group is mid-load
    before = pair.unit_state(NODES[0])["InvocationID"]
    pair.extra_args = FAST + ["--hold-load", hold]
    result = {}

    def deploy():
        # A lost peer is a transient cause: the deploy follows Restart='s next start (the default stops the
        # units, so that no load runs after the play), and the group forms again by itself.
        result["run"] = pair.play("deploy-k26.yml", {"model_service_extra_args": pair.extra_args,
                                                     "model_service_failed_start": "retry"})

    runner = threading.Thread(target=deploy)
    try:
        runner.start()
        until("node 0 restarted and loading, node 1 connected",
              lambda: pair.unit_state(NODES[0])["InvocationID"] != before
              and "Load weight begin" in pair.sh(NODES[0], "journalctl -u %s -n 30 --no-pager -o cat" % UNIT)
              and pair.addresses[NODES[1]] in dist_init_peers(NODES[0]), timeout=240)
        # Node 0's launcher looks every 5 s (the role's poll interval): it must have seen node 1's
        # connection before the kill, or a node 1 that systemd restarts within that look is only a join.
        time.sleep(11)
        killed = time.monotonic()
        cursor = journal_cursor(pair, NODES[0])
        # The engine's API process, which holds node 1's connection (systemctl kill cannot signal a
        # unit's whole cgroup inside a test host); its ranks follow it, and systemd restarts the unit.
        pair.sh(NODES[1], "kill -KILL $(systemctl show -p MainPID --value %s)" % UNIT)
        # Node 0's own launcher watches the group too: it says who left and exits, so that Restart= starts
        # node 0 again beside the restarted node 1 and the group forms anew, without anyone. The load is let
        # go then, not when the deploy ends: the deploy also waits for node 1's own wait, which this
        # machine's speed decides, and a new attempt still held would stall (60 s) and leave node 1 alone
        # in a group that node 0's next attempt cannot join.
        launcher_names_node_1(pair, cursor)
        pair.sh(NODES[0], "rm -f %s" % hold)
        runner.join(300)
        assert not runner.is_alive(), "the deploy did not end"
        TIMINGS["node 1 killed -> deploy ended"] = round(time.monotonic() - killed, 1)
    finally:
        pair.sh(NODES[0], "rm -f %s" % hold, check=False)
        runner.join(300)
    rc, out = result["run"]
    # Followed (model_service_failed_start: retry): node 0's wait said why its start failed, then followed
    # the next start of the group, re-formed by itself, to ready.
    # Named by node 0's wait itself, or by node 0's launcher when it saw it first (the wait then quotes
    # the launcher's status: the unit's process exited, "failed: node pair-node1 ... left the group").
    # Decided by the leave, not by the stall bound (a "stalled" verdict); that it is the very next look
    # after the leave is the classifier's, tested on replayed looks (test_classifier_peers.py): here the
    # deploy also waits for node 1's own wait, which this machine's speed decides.
    said = re.search(r"^wait_for_model_ready \[%s\]: (failed: .*)$" % NODES[0], out, re.M)
    assert rc == 0 and said, out[-4000:]
    left = re.search(r"failed: node pair-node1 \(%s\) left the group at \+(\d+) s: its connections to the dist-init "
                     r"port %d closed" % (re.escape(pair.addresses[NODES[1]]), DIST_PORT), said.group(1))
    assert left, said.group(1)
    assert re.search(r"%s: ready on start \d+, after \d+ failed start\(s\) that Restart= followed" % UNIT,
                     " ".join(out.split())), out[-4000:]
    TIMINGS["node 0's wait: failed at"] = int(left.group(1))
    until("the group re-formed by itself and serves", lambda: int(pair.unit_state(NODES[0])["NRestarts"]) > 0
          and pair.unit_state(NODES[0])["ActiveState"] == "active", timeout=300)
    assert completion(NODES[1]) != ""


def test_a_rolling_restart_restarts_the_pair_as_one_unit(pair):
    """With a changed argument, as an operator's rolling restart of a new setting: node 0's turn restarts
    both nodes onto their new units, node 1's turn only waits. Each node starts once."""
    before = dict((node, pair.unit_state(node)) for node in NODES)
    since = pair.sh(NODES[0], "date +%s")
    pair.extra_args = FAST + ["--load-rate-mib", "48"]  # the simulator takes the last value
    with Timed(TIMINGS, "rolling restart of the pair onto a changed argument"):
        rc, out = pair.play("playbooks/rolling-restart.yml", {"model_service_extra_args": pair.extra_args})
    assert rc == 0, out[-4000:]
    after = dict((node, pair.unit_state(node)) for node in NODES)
    journal = "\n".join(pair.sh(node, "journalctl -u %s --since @%s -o short-precise --no-pager | grep -v ' Load weight' "
                                      "| tail -40" % (UNIT, since)) for node in NODES)
    turns = "\n".join(line for line in str(out).splitlines() if re.search(r"^(TASK|RUNNING HANDLER|PLAY |changed)", line))
    for node in NODES:
        assert after[node]["ActiveState"] == "active", "%s\n%s\n%s" % (after, journal, turns)
        assert after[node]["InvocationID"] != before[node]["InvocationID"]
        assert "--load-rate-mib 48" in pair.sh(node, "systemctl show -p ExecStart --value %s" % UNIT)
        # Each restart stops the unit once (node 0's Type=notify logs "Starting", node 1's "Started" only).
        restarts = pair.sh(node, "journalctl -u %s --since @%s -o cat --no-pager | grep -c '^Stopped ' || true"
                           % (UNIT, since))
        assert restarts == "1", "%s restarted %s times in the rolling restart:\n%s\n%s" % (node, restarts, journal, turns)
    assert completion(NODES[1]) != ""
