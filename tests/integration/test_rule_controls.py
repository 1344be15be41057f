"""The negative controls of the terminal rules (plugins/module_utils/readiness/rules.py), run by real
Ansible against real processes: for each rule that can end a wait `failed`, a healthy start that
looks like the rule's evidence, which must end ready with no look failed or stalled. The rank rules'
controls are test_rank_churn.py's, the stall rule's test_arrivals.py's; the unit rules and the crash
loop need systemd guests. The port rule's healthy server is tests/helpers/forked_server.py: the
simulated engine serves its port from the process a wait watches.

Each start is watched from its first instant (test_module_sim.attached, pid mode), and each test also
proves that its look-alike evidence was really there: in the module's looks (progress_path: every
look's snapshot and verdict), the engine's log or the churn record.
"""
import json
import os
import socket
import threading

import pytest

from tests.fakes import fake_nvml
from tests.helpers import forked_server, free_port, poll
from tests.integration.test_arrivals import model_dir, sims  # noqa: F401 (fixtures)
from tests.integration.test_module_sim import attached, module, wait_args
from tests.integration.test_rank_churn import assert_ready_without_a_death, json_lines
from tests.integration.test_xid_sim import kmsg_record

# Driver lines (tests/unit/test_xid.py has their forms): an application's bad access on GPU 0, and the
# bus lost by GPU 1, a GPU of another tenant of the host (no process of ours named).
APP_ERROR = ("NVRM: Xid (PCI:0000:18:00): 13, pid=%d, name=python3, Graphics SM Warp Exception on (GPC 0, TPC 0, "
             "SM 0): Out Of Range Address")
OTHER_GPU_FALLEN = "NVRM: Xid (PCI:0000:19:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
PEER = "node-1"


def start_looks(tmp_path, sim, engine, attach=True, **options):
    """The module on `sim`, from its first instant unless attach is false: the run and every look
    (snapshot and verdict)."""
    progress = str(tmp_path / "progress.jsonl")
    options = dict((k, v) for k, v in wait_args(sim, engine, progress_path=progress, **options).items()
                   if v is not None)  # a server that logs nothing: no log_path
    run = attached(sim, **options) if attach else module(sim.url, sim.pid, **options)
    return run, json_lines(progress)


def verdicts_of(looks):
    return [look["verdict"] for look in looks]


def test_an_application_xid_on_a_watched_gpu_and_a_fatal_one_on_another_gpu_end_ready(tmp_path, sims, model_dir):
    # Two scripted GPUs (the fake libnvidia-ml.so.1 gives their PCI ids: 0000:18:00 and 0000:19:00);
    # the engine holds GPU 0, the wait watches GPU 0 alone.
    gpus = tmp_path / "gpu"
    gpus.mkdir()
    (gpus / "gpus.json").write_text(json.dumps({"gpus": [
        {"index": i, "uuid": "GPU-%d" % i, "bus_id": "00000000:%02X:00.0" % (0x18 + i), "memory_total_mib": 97887,
         "memory_used_mib": 0, "utilization_gpu": 0} for i in range(2)]}))
    library = os.path.dirname(fake_nvml.build(str(tmp_path / "nvml")))
    sim = sims.start("sglang", model_dir, "--fake-gpus", env={"MODELWAKE_FAKE_GPU_DIR": str(gpus)})
    # The kernel's records, stamped after the engine's start: both are this start's.
    kmsg = tmp_path / "kmsg"
    kmsg.write_text(kmsg_record(1, APP_ERROR % sim.pid) + kmsg_record(2, OTHER_GPU_FALLEN))
    env = {"LD_LIBRARY_PATH": library, "MODELWAKE_FAKE_GPU_DIR": str(gpus), "MODELWAKE_KMSG_PATH": str(kmsg)}
    run, looks = start_looks(tmp_path, sim, "sglang", gpus="0", env=env)
    assert_ready_without_a_death(run, verdicts_of(looks))
    # Both read and mapped to their GPUs by PCI id, and quoted.
    read = [x for look in looks for x in look["snapshot"]["xids"] or []]
    assert sorted((x["code"], x["gpu"]) for x in read) == [(13, 0), (79, 1)], read
    evidence = run.result["evidence"]
    assert any("Xid 13 on GPU 0 (PCI 0000:18:00)" in line and "; app]" in line for line in evidence), evidence
    assert any("Xid 79 on GPU 1 (PCI 0000:19:00): GPU has fallen off the bus; not a watched GPU]" in line
               for line in evidence), evidence


def test_a_healthy_start_that_logs_lines_like_a_crash_ends_ready(tmp_path, sims, model_dir):
    sim = sims.start("sglang", model_dir, "--tp", "2", "--benign-error-lines")
    run, looks = start_looks(tmp_path, sim, "sglang")
    assert_ready_without_a_death(run, verdicts_of(looks))
    # Each rank's pair of lines, cutlass's and SGLang's, read by the module's looks.
    seen = [line for look in looks for line in look["snapshot"]["log_lines"]
            if "Unexpected error during package walk: cutlass.cute.experimental" in line]
    assert len(seen) == 4 and sum(" TP1] " in line for line in seen) == 1, seen


def test_an_earlier_runs_crash_in_an_appended_log_ends_ready(tmp_path, sims, model_dir):
    # The log file is appended to across restarts: the earlier run crashed (its own start line, then its
    # traceback); the new run's first line comes only after its imports (--start-seconds).
    old = sims.start("sglang", model_dir, "--fault", "crash1:loading", "--fault-after", "0.3")
    old.wait_exit()
    earlier = old.log()
    assert "Scheduler hit an exception" in earlier and "server_args=ServerArgs(" in earlier
    sim = sims.start("sglang", model_dir, "--start-seconds", "3", log_before=earlier)
    run, looks = start_looks(tmp_path, sim, "sglang")
    assert_ready_without_a_death(run, verdicts_of(looks))
    # The first look read the earlier crash; the start went on to ready all the same.
    assert "Scheduler hit an exception" in " ".join(looks[0]["snapshot"]["log_context"])


def test_children_that_exit_while_the_watched_process_lives_end_ready(tmp_path, sims, model_dir):
    # The watched process forks a helper that exits 1; its rank fork+execs compile workers that exit 0.
    record = str(tmp_path / "churn.jsonl")
    sim = sims.start("sglang", model_dir, "--node-rank", "0", "--churn", "node-rank", "--churn", "compile-workers",
                     "--churn-seconds", "2", "--churn-record", record)
    run, looks = start_looks(tmp_path, sim, "sglang")
    assert_ready_without_a_death(run, verdicts_of(looks))
    assert sim.proc.poll() is None  # it outlived them all
    ended = json_lines(record)
    helper = [c for c in ended if c.get("churn") == "node-rank"]
    assert [(c["parent"], c["ended"]) for c in helper] == [(sim.pid, "exit 1")], ended
    execd = [c for c in ended if c["made"] == "fork+exec"]
    assert len(execd) == 3 and {c["ended"] for c in execd} == {"exit 0"}, ended


@pytest.fixture
def forked():
    servers = []

    def start(**options):
        servers.append(forked_server.start(**options))
        return servers[-1]
    yield start
    for server in servers:
        server.stop()


def test_a_port_served_by_the_servers_own_worker_ends_ready(tmp_path, forked):
    # Its port is open from the first look, whose /health would wait for a stopped worker: not attached.
    server = forked(warmup_seconds=3)
    run, looks = start_looks(tmp_path, server, "sglang", attach=False, ready_check="completion")
    assert_ready_without_a_death(run, verdicts_of(looks))
    # Every look that found the port open found the worker alone on it, a child of the watched process.
    holders = [[o["pid"] for o in look["snapshot"]["listeners"]] for look in looks if look["snapshot"]["listeners"]]
    assert len(holders) >= 2 and all(pids == [server.worker] for pids in holders), holders
    assert any(look["snapshot"]["http"]["health"]["code"] == 503 for look in looks)


def test_sglangs_health_503_while_it_warms_up_ends_ready(tmp_path, sims, model_dir):
    # engine auto, the module's default: the log tells that this 503 is SGLang's warm-up.
    sim = sims.start("sglang", model_dir, "--warmup-seconds", "4")
    run, looks = start_looks(tmp_path, sim, "auto")
    assert_ready_without_a_death(run, verdicts_of(looks))
    warming = [look["verdict"] for look in looks if (look["snapshot"]["http"]["health"] or {}).get("code") == 503]
    assert len(warming) >= 2 and {v["engine"] for v in warming} == {"sglang"}, warming


def test_extra_connections_to_the_dist_init_port_coming_and_going_end_ready(tmp_path, sims, model_dir):
    # Node 1 joins and stays; once a look has seen it joined, a client of the store from its address
    # comes and goes, each connection held across a look.
    dist = free_port()
    group = ("--tp", "2", "--nnodes", "2", "--dist-init-addr", "127.0.0.1:%d" % dist)
    sims.start("sglang", model_dir, "--node-rank", "1", *group)
    node0 = sims.start("sglang", model_dir, "--node-rank", "0", *group)
    progress = tmp_path / "progress.jsonl"
    stop = threading.Event()

    def joined():
        try:
            return any(peer_connections(look) for look in json_lines(str(progress)))
        except ValueError:
            return False  # a look's line half written

    def knock():
        if not poll(joined, 60, interval=0.2, stop=stop.is_set):
            return
        while not stop.is_set():
            with socket.create_connection(("127.0.0.1", dist), timeout=2):
                stop.wait(1.5)
            stop.wait(1.0)
    knocker = threading.Thread(target=knock, daemon=True)
    knocker.start()
    try:
        run, looks = start_looks(tmp_path, node0, "sglang", peers=[{"name": PEER, "address": "127.0.0.1"}],
                                 peer_port=dist)
    finally:
        stop.set()
        knocker.join(5)
    assert_ready_without_a_death(run, verdicts_of(looks))
    # Loopback shows both ends of each connection: node 1's own, and the extra one while it is there.
    counts = [len(peer_connections(look)) for look in looks]
    since_joined = counts[next(i for i, count in enumerate(counts) if count):]
    assert max(since_joined) == 4 and min(since_joined) == 2 and since_joined[0] == 2, counts


def peer_connections(look):
    return (look["snapshot"]["peers"] or {}).get(PEER) or []
