"""The terminal rules' table (readiness/rules.py): every row proven both ways, and the rows' own
negative controls as replayed traces. The live ones run real processes through Ansible
(tests/integration/test_rank_churn.py)."""
import ast
import os
import subprocess
import sys

from ansible_collections.modelwake.serving.plugins.module_utils.host.ranks import engine_ranks
from ansible_collections.modelwake.serving.plugins.module_utils.readiness import rules
from ansible_collections.modelwake.serving.plugins.module_utils.readiness.snapshot import ProcessTree, Snapshot

from tests.helpers import ROOT
from tests.helpers.traces import SGLANG_PREFIX, Trace, config, http, replay
from tests.unit.test_classifier import unit_props

INIT = SGLANG_PREFIX + "Load weight end. type=DeepseekV3ForCausalLM, dtype=torch.bfloat16, avail mem=20.66 GB"


def _test_functions(path):
    with open(os.path.join(ROOT, path)) as handle:
        tree = ast.parse(handle.read())
    return set(node.name for node in tree.body if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"))


def test_every_rule_names_a_positive_test_and_a_negative_control_that_exist():
    names = [rule.name for rule in rules.RULES]
    assert len(names) == len(set(names)), names
    for rule in rules.RULES:
        assert rule.positive, "rule %s names no positive test" % rule.name
        assert rule.negative, "rule %s names no negative control" % rule.name
        for test in rule.positive + rule.negative:
            path, _sep, function = test.partition("::")
            assert os.path.exists(os.path.join(ROOT, path)), "rule %s: no file %s" % (rule.name, path)
            assert function in _test_functions(path), "rule %s: no test %s" % (rule.name, test)


def test_the_rank_rules_have_live_negative_controls_through_ansible():
    for rule in rules.RULES:
        if rule.name.startswith("rank_"):
            assert any(test.startswith("tests/integration/") for test in rule.negative), rule.name


def test_the_docs_show_the_codes_table():
    # tools/rule_table.py renders it; `tools/rule_table.py --write` puts it into docs/readiness.md.
    result = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "rule_table.py"), "--check"],
                            capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stdout + result.stderr


# -- a server as /proc shows it: its ranks found by host/ranks.py as the probe finds them ------------
class Server(object):
    """An SGLang server at TP 2 (100: the API process, 101-102: its schedulers), and what comes and goes."""

    def __init__(self):
        self.processes = {100: ("python3 -m sglang.launch_server --tp 2 --node-rank 0", 1),
                          101: ("sglang::scheduler_TP0", 100), 102: ("sglang::scheduler_TP1", 100)}
        self.zombies = {}  # pid -> waitpid status, for one look
        self.cpu = 3.0

    def look(self, t, cpu=0.5, lines=(), ready=False):
        self.cpu += cpu
        infos = dict((pid, {"pid": pid, "ppid": ppid, "cmdline": cmdline, "comm": cmdline[:15]})
                     for pid, (cmdline, ppid) in self.processes.items())
        states = dict((str(pid), "S") for pid in self.processes)
        states.update((str(pid), "Z") for pid in self.zombies)
        process = ProcessTree(root_pid=100, alive=True, pids=sorted(self.processes), cpu_seconds=self.cpu, read_bytes=0,
                              states=states, comms=dict((str(p), i["comm"]) for p, i in infos.items()),
                              ranks=dict((str(p), r) for p, r in engine_ranks(infos).items()),
                              exits=dict((str(p), s) for p, s in self.zombies.items()))
        self.zombies = {}
        answer = http(200, 200, 200, ready=True, model="k26") if ready else http()
        return Snapshot(t=t, process=process, log_lines=list(lines), http=answer)

    def start(self, pid, cmdline, parent):
        self.processes[pid] = (cmdline, parent)

    def end(self, pid, status=None):
        """status: the zombie's waitpid status, seen at the next look; None: reaped before any look."""
        del self.processes[pid]
        if status is not None:
            self.zombies[pid] = status


def phases(verdicts):
    return [verdict.phase for _t, verdict in verdicts]


def test_a_forked_child_with_its_ranks_title_that_is_killed_is_no_rank():
    server = Server()
    looks = [server.look(0, lines=[INIT])]
    server.start(103, "sglang::scheduler_TP0", 101)  # fork() without exec: the rank's title, inherited
    looks.append(server.look(5))
    server.end(103, status=9)  # its rank killed it
    looks += [server.look(10), server.look(15), server.look(20, ready=True)]
    seen = replay(config(engine="sglang"), looks)
    assert phases(seen) == ["initializing"] * 4 + ["ready"], [v.msg for _t, v in seen]


def test_a_helper_its_rank_sigterms_on_purpose_is_no_rank_death():
    server = Server()
    looks = [server.look(0, lines=[INIT])]
    server.start(103, "nvidia-smi --query-gpu=memory.used --format=csv", 101)  # a hung probe
    server.start(104, "sglang::scheduler_TP0", 101)  # a forked check
    looks += [server.look(t) for t in (5, 10)]
    server.end(103, status=15)
    server.end(104, status=15)
    looks += [server.look(15), server.look(20, ready=True)]
    seen = replay(config(engine="sglang"), looks)
    assert phases(seen) == ["initializing"] * 4 + ["ready"], [v.msg for _t, v in seen]


def test_a_loader_chain_that_exits_0_before_the_server_comes_up_is_ready():
    # A process titled like a rank by itself, its loader below it; both exit 0 and are reaped.
    server = Server()
    del server.processes[101], server.processes[102]
    looks = [server.look(0, lines=[SGLANG_PREFIX + "Init torch distributed begin."])]
    server.start(101, "sglang::scheduler_TP0", 100)
    server.start(102, "loader_TP0", 101)
    looks += [server.look(t) for t in (5, 10, 15)]
    server.end(102, status=0)
    server.end(101)  # reaped before any look saw its status
    looks += [server.look(20), server.look(25)]
    server.start(103, "sglang::scheduler_TP0", 100)
    server.start(104, "sglang::scheduler_TP1", 100)
    looks += [server.look(30, lines=[INIT]), server.look(35, ready=True)]
    seen = replay(config(engine="sglang"), looks)
    assert "failed" not in phases(seen) and phases(seen)[-1] == "ready", [v.msg for _t, v in seen]
    notes = [line for _t, v in seen[:-1] for line in v.evidence if "the start went on" in line]
    assert "rank TP0 (pid 101) is gone (exit status unknown: reaped) at +20 s; the start went on" in notes


def test_compile_worker_churn_is_ready():
    server = Server()
    looks = [server.look(0, lines=[INIT])]
    pid = 200
    for wave in range(3):
        children = []
        for rank_pid in (101, 102):
            server.start(pid, server.processes[rank_pid][0], rank_pid)  # forked: the rank's title
            server.start(pid + 1, "/opt/v/bin/python3 -c compile", rank_pid)  # exec'd
            children += [pid, pid + 1]
            pid += 2
        looks.append(server.look(5 + 10 * wave))
        for child in children:
            server.end(child, status=0 if child % 2 else None)
        looks.append(server.look(10 + 10 * wave))
    looks.append(server.look(40, ready=True))
    seen = replay(config(engine="sglang"), looks)
    assert "failed" not in phases(seen) and phases(seen)[-1] == "ready", [v.msg for _t, v in seen]


def test_children_that_come_and_go_while_the_watched_process_lives_are_no_exit():
    server = Server()
    looks = [server.look(0, lines=[INIT])]
    server.start(300, "/bin/sh -c true", 100)
    looks.append(server.look(5))
    server.end(300, status=1 << 8)
    looks += [server.look(10), server.look(15, ready=True)]
    seen = replay(config(engine="sglang"), looks)
    assert phases(seen) == ["initializing"] * 3 + ["ready"]


def test_a_unit_that_does_not_exist_fails_at_once():
    props = dict(unit_props(state="inactive", sub="dead", main_pid=0), LoadState="not-found")
    seen = replay(config(unit="sglang-k26.service"), [Trace(pids=(1,)).step(0, unit=props, alive=False)])
    verdict = seen[-1][1]
    assert verdict.phase == "failed" and verdict.rule == "unit_not_found"
    assert verdict.msg == "failed: unit sglang-k26.service does not exist"


def test_a_unit_with_no_stopped_loop_is_judged_by_its_run():
    # Its launcher exited 7 before (a stopped loop) and was started again by hand: no record is read now.
    trace = Trace(pids=(500,))
    looks = [trace.step(0, unit=unit_props(status=7), lines=[INIT]),
             trace.step(5, unit=unit_props(status=7), cpu=0.5, http_result=http(200, 200, 200, ready=True, model="k26"))]
    assert phases(replay(config(unit="sglang-k26.service", engine="sglang"), looks)) == ["initializing", "ready"]


def test_vllms_health_503_fails_the_wait():
    trace = Trace()
    seen = replay(config(engine="vllm"), [trace.step(0, lines=["(APIServer pid=1) INFO Starting vLLM API server"]),
                                          trace.step(5, http_result=http(503))])
    verdict = seen[-1][1]
    assert verdict.phase == "failed" and verdict.rule == "vllm_engine_dead"


def test_vllms_health_503_names_the_exception_its_core_died_of():
    # The core's crash written just before the wait's first look (a loaded machine starts the module late):
    # the log's context, which the fatal-line rule leaves to a new run's start line; the 503 says the
    # core is dead now, and its message names what it died of.
    trace = Trace()
    crash = ["(EngineCore_DP0 pid=7) ERROR EngineCore encountered a fatal error.",
             "(EngineCore_DP0 pid=7) Traceback (most recent call last):",
             "(EngineCore_DP0 pid=7) RuntimeError: CUDA error: an illegal memory access was encountered"]
    seen = replay(config(engine="vllm"), [trace.step(0, context=["(APIServer pid=1) INFO Starting vLLM API server"] + crash,
                                                     http_result=http(503))])
    verdict = seen[-1][1]
    assert verdict.phase == "failed" and verdict.rule == "vllm_engine_dead", verdict
    assert verdict.msg.startswith("failed: vLLM's /health answers 503: its engine core is dead: "), verdict.msg
    assert "RuntimeError: CUDA error: an illegal memory access was encountered" in verdict.msg, verdict.msg


def test_an_sglang_health_503_while_it_warms_up_is_no_failure():
    # SGLang answers 503 until its warm-up request ends (ServerStatus.Starting): not a dead engine.
    trace = Trace()
    looks = [trace.step(0, lines=[INIT]), trace.step(5, cpu=0.5, http_result=http(503)),
             trace.step(10, cpu=0.5, http_result=http(200, 200, 200, ready=True, model="k26"))]
    assert phases(replay(config(engine="sglang"), looks)) == ["initializing", "initializing", "ready"]


def test_a_port_held_by_the_servers_own_child_is_no_foreign_holder():
    # vLLM's API server may hand its socket to a child: a listener of the tree is the server's.
    trace = Trace(pids=(100, 101))
    looks = [trace.step(0, lines=[INIT]),
             trace.step(5, cpu=0.5, http_result=http(200, 200, 200, ready=True, model="k26"),
                        listeners=[{"pid": 101, "comm": "python3"}])]
    assert phases(replay(config(engine="sglang"), looks)) == ["initializing", "ready"]


def test_a_start_still_working_at_the_deadline_times_out():
    trace = Trace()
    looks = [trace.step(0, lines=[INIT])] + [trace.step(t, cpu=0.8) for t in range(5, 65, 5)]
    verdict = replay(config(engine="sglang", timeout=60, stall_timeout=600), looks)[-1][1]
    assert verdict.phase == "timeout" and verdict.rule == "timeout" and verdict.terminal
    assert verdict.msg.startswith("timeout: not ready after 60 s; in phase initializing since +0 s")


def test_a_start_ready_a_look_before_the_deadline_is_ready():
    trace = Trace()
    looks = [trace.step(0, lines=[INIT])] + [trace.step(t, cpu=0.8) for t in range(5, 55, 5)]
    looks.append(trace.step(55, cpu=0.8, http_result=http(200, 200, 200, ready=True, model="k26")))
    assert phases(replay(config(engine="sglang", timeout=60, stall_timeout=600), looks))[-1] == "ready"


# -- stalled: a server that had been ready is named so, not by a start phase -------------------------
def _stopped_after_ready(ready_line=None, unit=None, poll=1, stall=15):
    """A server whose processes are all stopped when the wait begins: it accepts and never answers."""
    trace = Trace(pids=(100, 200, 300))
    stopped = {100: "T", 200: "T", 300: "T"}
    snaps = []
    for t in range(0, stall + 2 * poll + 1, poll):
        context = [ready_line] if ready_line and t == 0 else []
        snaps.append(trace.step(t, cpu=0.0, context=context, states=stopped, http_result=http("timeout"), unit=unit))
    return replay(config(engine="sglang", timeout=3600, stall_timeout=stall, poll_interval=poll,
                         unit="sglang-k26.service" if unit else None), snaps)


def test_a_server_stopped_after_its_engine_logged_ready_is_stalled_as_one_that_had_been_ready():
    _t, verdict = _stopped_after_ready(SGLANG_PREFIX + "The server is fired up and ready to roll!")[-1]
    assert verdict.phase == "stalled" and verdict.rule == "stalled"
    assert verdict.msg.startswith("stalled: no progress for 15 s after the engine logged that it was ready: "
                                  "it answers nothing"), verdict.msg
    assert " in phase " not in verdict.msg


def test_a_server_stopped_after_its_launcher_said_ready_is_stalled_as_one_that_had_been_ready():
    unit = unit_props(main_pid=100)
    unit.update(Type="notify", StatusText="ready in 52s")
    _t, verdict = _stopped_after_ready(unit=unit)[-1]
    assert verdict.phase == "stalled"
    assert "after it had been ready (its launcher told systemd: ready in 52s): it answers nothing" in verdict.msg


def test_a_server_stopped_that_never_said_ready_is_stalled_in_its_start_phase():
    _t, verdict = _stopped_after_ready()[-1]
    assert verdict.phase == "stalled"
    assert "stalled: no progress for 15 s in phase " in verdict.msg and "was ready" not in verdict.msg


# -- a notify unit's status: its derived figures are no progress, its percent is -----------------------
def _loading_under_a_launcher(status_at, stall=15):
    """A notify unit loading under its launcher, whose engine the wait sees idle (its reads stopped at 0)."""
    trace = Trace(pids=(100, 200, 300))
    snaps = []
    for t in range(0, 31):
        unit = unit_props(state="activating", sub="start", main_pid=100)
        unit.update(Type="notify", StatusText=status_at(t))
        snaps.append(trace.step(t, cpu=0.0, http_result=http("refused"), unit=unit))
    return replay(config(engine="sglang", timeout=3600, stall_timeout=stall, poll_interval=1,
                         unit="sglang-k26.service"), snaps)


def test_a_hung_load_whose_launcher_status_only_recounts_its_rate_and_eta_is_stalled():
    # The launcher's average rate falls and its ETA grows at every look of a hung load: the clock, not work.
    verdicts = _loading_under_a_launcher(
        lambda t: "loading 12%% (1/8 shards, %d MiB/s, ETA %ds) | usual: starting 1s, loading 4s" % (16 // (t + 1), 9 + 3 * t))
    t, verdict = verdicts[-1]
    assert verdict.phase == "stalled" and t <= 15 + 1, (t, verdict.msg)


def test_a_load_whose_launcher_status_advances_is_not_stalled():
    # The negative control: its percent and shard count move (the engine reads where this wait cannot see).
    verdicts = _loading_under_a_launcher(
        lambda t: "loading %d%% (%d/64 shards, 575 MiB/s, ETA %ds)" % (t * 3, t * 2, 600 - t))
    assert all(verdict.phase != "stalled" for _t, verdict in verdicts), verdicts[-1][1].msg
