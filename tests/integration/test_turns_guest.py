"""Models that share a GPU start one at a time, and a replacement waits for a stopped instance's memory,
on one real systemd guest (tools/testhosts) with one scripted GPU.

deploy-k26.yml deploys two simulated models (their own units and ports, both on the host's GPU: `gpus`
left empty, every GPU, and `share_gpus: true`) onto the guest. Then
- both are stopped and started together while the load of whichever took the turn is held
  (--hold-load): the other one's STATUS= says it waits for its turn naming the first and its phase,
  it has no engine process, the wait module calls it starting (not stalled), and its launcher takes its
  turn only once the first is ready (the two launchers' journal lines, in order);
- a process of a transient unit holds GPU memory (a holder file of the scripted GPU) and ignores
  SIGTERM for a few seconds while its unit stops: a model restarted meanwhile says it waits for GPU 0's
  memory to be released by that pid, and its engine starts only after the holder exited.
The guest is destroyed afterwards, also when a test fails.
"""
import json
import os
import shutil

import pytest

from tests.helpers.guesthost import GuestHost, guest_vars, host_tool
from tests.helpers.waiting import until

HOST = "turns"
A, B = "sglang-turn-a", "sglang-turn-b"
PORTS = {A: 30021, B: 30022}
HOLD = "/var/lib/mwt-hold-load"
GPU_DIR = "/run/modelwake-fake-gpu"
FAST = ["--disable-cuda-graph", "--fake-gpus", "--fake-gpu-count", "1", "--gpu-memory-mib", "500",
        "--load-rate-mib", "32", "--start-seconds", "1", "--init-seconds", "1", "--warmup-seconds", "1",
        "--hold-load", HOLD]
OLD = "mwt-old-instance"
# The stopped instance: holds 1000 MiB of GPU 0 (a holder file of the scripted GPU, as the simulated ranks
# write), takes 10 s to exit after SIGTERM, and notes its exit on the boot clock (/proc's starttime's clock).
HOLDER = r"""
import json, os, signal, time
path = "%s/holder-old.json"
with open(path + ".tmp", "w") as f:
    json.dump({"pid": os.getpid(), "name": "python", "gpus": {"0": {"memory_mib": 1000, "utilization": 0}}}, f)
os.replace(path + ".tmp", path)
def leave(signum, frame):
    time.sleep(10)
    with open("/run/mwt-old-exit", "w") as f:
        f.write(repr(time.clock_gettime(time.CLOCK_BOOTTIME)))
    os._exit(0)
signal.signal(signal.SIGTERM, leave)
while True:
    time.sleep(1)
""" % GPU_DIR

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0 or shutil.which("systemd-nspawn") is None,
                       reason="test hosts need root and systemd-nspawn (make system-deps)"),
]


def model(unit):
    return {"engine": "sglang", "engine_package": "modelwake-sim", "engine_version": "0.1.0", "unit": unit,
            "port": PORTS[unit], "model_path": "/srv/models/turns-sim", "tp": 1, "extra_args": FAST,
            # `gpus` left empty: every GPU of the host, which both share on purpose (else the deploy refuses).
            "share_gpus": True,
            # The held load shows no progress: long enough for the test's looks while it is held.
            "ready_timeout": 300, "stall_timeout": 150}


@pytest.fixture(scope="module")
def vm(tmp_path_factory):
    tmp = str(tmp_path_factory.mktemp("turns"))
    inventory = os.path.join(tmp, "inventory.json")
    with open(inventory, "w") as handle:
        json.dump({"all": {"children": {"model_hosts": {"hosts": {HOST: {}}}}, "vars": dict(guest_vars(host_tool("key")), **{
            "modelwake_host_models": ["turn-a", "turn-b"],
            "modelwake_gpus_required": True,
            "modelwake_demo_model_size_mib": 32,
            "modelwake_demo_model_shards": 4,
            "modelwake_models": {"turn-a": model(A), "turn-b": model(B)}})}}, handle)
    guest = GuestHost("mwt", inventory, HOST)
    try:
        guest.up(tmp)
        host_tool("install-fake-gpus", guest.name, "--count", "1")
        rc, out = guest.play("playbooks/demo-model.yml")
        assert rc == 0, out[-4000:]
        rc, out = guest.deploy()
        assert rc == 0, out[-4000:]
        assert guest.recap(out)["failed"] == 0
        yield guest
    finally:
        guest.down()


def turn_holder(vm):
    """The unit whose launcher of this start holds GPU 0's turn (the lock file names it and its pid is
    the unit's main process), or None while no one has written it."""
    holder = json.loads(vm.sh("cat /run/modelwake/gpu-turns/gpu-0.lock", check=False) or "{}")
    unit = (holder.get("unit") or "")[:-len(".service")]
    if unit in (A, B) and str(holder.get("pid")) == vm.show(unit + ".service", "MainPID")["MainPID"]:
        return unit
    return None


def status(vm, unit):
    return vm.show(unit + ".service", "StatusText")["StatusText"]


ENGINE_PIDS = r"""
import glob, sys
group, launcher = sys.argv[1].strip("/"), sys.argv[2]
pids = set()
for path in glob.glob("/sys/fs/cgroup/%s/cgroup.procs" % group) + glob.glob("/sys/fs/cgroup/*/%s/cgroup.procs" % group):
    pids.update(open(path).read().split())
for pid in sorted(pids - {launcher}, key=int):  # its command line holds the engine's after "--"
    try:
        if b"modelwake_sim\0serve" in open("/proc/%s/cmdline" % pid, "rb").read():
            print(pid)
    except OSError:
        pass
"""


def engine_pids(vm, unit):
    """The unit's engine processes (the simulator's), not its launcher nor the tools the launcher runs."""
    unit_props = vm.show(unit + ".service", "ControlGroup", "MainPID")
    return vm.sh("python3 - %s %s" % (unit_props["ControlGroup"], unit_props["MainPID"]),
                 stdin=ENGINE_PIDS.encode()).split()


def journal_time(vm, unit, text):
    """When journald got the unit's latest line containing `text` (seconds, wall clock): the deploy's
    starts logged the same lines before."""
    out = vm.sh("journalctl -b -u %s.service -o json --output-fields=MESSAGE,__REALTIME_TIMESTAMP" % unit)
    times = [int(entry["__REALTIME_TIMESTAMP"]) / 1e6 for entry in map(json.loads, out.splitlines())
             if text in str(entry.get("MESSAGE"))]
    assert times, "%s: no line with %r in its journal" % (unit, text)
    return times[-1]


def engine_start(vm, unit):
    """The boot-clock second at which the unit's engine process started (/proc/<pid>/stat starttime)."""
    pid = engine_pids(vm, unit)[0]
    return float(vm.sh("python3 -c \"import os; f = open('/proc/%s/stat').read().rsplit(')', 1)[1].split(); "
                       "print(int(f[19]) / os.sysconf('SC_CLK_TCK'))\"" % pid))


def test_two_models_started_together_on_one_gpu_start_in_turn(vm):
    vm.sh("systemctl stop %s %s && touch %s" % (A, B, HOLD))
    try:
        vm.sh("systemctl start --no-block %s %s" % (A, B))
        # Whichever took the turn loads (held before its last shard); the other waits, saying for whom.
        first = until("one start holds the turn on GPU 0", lambda: turn_holder(vm), timeout=60)
        second = B if first == A else A
        until("%s loading" % first, lambda: status(vm, first).startswith("loading"), timeout=60)
        first_pid = vm.show(first + ".service", "MainPID")["MainPID"]
        expected = ("starting: waiting for its turn on GPU 0: %s.service (pid %s) is starting (loading)"
                    % (first, first_pid))
        until("%s waiting for its turn" % second, lambda: status(vm, second) == expected, timeout=60)
        assert vm.show(second + ".service", "ActiveState")["ActiveState"] == "activating"
        assert engine_pids(vm, second) == [], "no engine before its turn"
        # The wait module reads the launcher's word: starting, quoting what it waits for.
        look = vm.wait(url="http://127.0.0.1:%d" % PORTS[second], unit=second + ".service", timeout=0)
        assert look["phase"] == "starting", look
        assert "the launcher is waiting for its turn on GPU 0: %s.service" % first in look["msg"], look
    finally:
        vm.sh("rm -f %s" % HOLD)
    for unit in (A, B):
        until("%s active" % unit, lambda: vm.show(unit + ".service", "ActiveState")["ActiveState"] == "active",
              timeout=120)
    ready = journal_time(vm, first, "modelwake: ready in ")
    turn = journal_time(vm, second, "modelwake: took its turn on GPU 0 after ")
    started = journal_time(vm, second, "modelwake: engine started as pid ")
    # journald stamps each line when it reads it: lines read in the same pass may differ by microseconds.
    assert turn >= ready - 0.1 and started >= turn - 0.1, (ready, turn, started)
    assert vm.completion(PORTS[A]) != "" and vm.completion(PORTS[B]) != ""


def test_a_replacement_waits_for_a_stopped_instances_gpu_memory(vm):
    vm.sh("cat > /root/mwt-old.py", stdin=HOLDER.encode())
    vm.sh("rm -f /run/mwt-old-exit && systemd-run --unit=%s --property=TimeoutStopSec=30 python3 /root/mwt-old.py" % OLD)
    holder = until("the old instance holds GPU 0", lambda: vm.sh(
        "nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits | grep ', 1000$' | cut -d, -f1",
        check=False), timeout=30)
    try:
        vm.sh("systemctl stop --no-block %s && systemctl restart --no-block %s" % (OLD, B))
        expected = ("starting: waiting for GPU 0's memory to be released by pid %s (%s.service, stopping)"
                    % (holder, OLD))
        until("%s waiting for the memory" % B, lambda: status(vm, B) == expected, timeout=60)
        assert engine_pids(vm, B) == []
        # A running model on the same GPU is a neighbour: named nowhere, never waited for.
        assert A not in status(vm, B)
        until("%s active" % B, lambda: vm.show(B + ".service", "ActiveState")["ActiveState"] == "active",
              timeout=120)
        exited = float(vm.sh("cat /run/mwt-old-exit"))
        # /proc's starttime is in clock ticks: up to one tick (10 ms) early.
        assert engine_start(vm, B) >= exited - 0.02
        # Said to the journal when the wait's words change, not at every poll (the holders may change
        # while it waits: this unit's previous engine can still be exiting at the first look).
        said = vm.sh("journalctl -b -u %s.service -o cat | grep 'waiting for GPU 0.s memory to be released by pid'"
                     % B).splitlines()
        assert any("by pid %s " % holder in line for line in said), said
        assert all(first != second for first, second in zip(said, said[1:])), said
    finally:
        vm.sh("systemctl stop %s; systemctl reset-failed %s" % (OLD, OLD), check=False)
