"""The fault matrix of test_vllm_deploy.py, where it applies, on the simulated engine speaking SGLang's
protocol: deployed by deploy-k26.yml (inventories/vllm-cpu, catalog entry `sim-sglang`) onto its own
systemd test host, so that both engines' semantics stay covered and this file runs beside the real one.

  a second model beside it   both deployed in one run, each its own unit and port; the first untouched
  damaged copy               refused by the preflight naming each shard; the ready unit untouched
  upgrade that cannot start  rolled back to the exact previous packages, ready again, the play failed
  hang while loading         stalled after stall_timeout

Not repeated here, because the real engine proves them the same way in test_vllm_deploy.py: a crash
with exit 0 after ready (the unit back by itself, the launcher naming the exit), config.json missing
(refused before any change) and the port taken by another process (named). (A reboot mid-load of the simulated SGLang server: test_deploy_lifecycle.py. A shard cut short behind the
preflight's back, the engine's SafetensorError as the verdict's root cause: test_module_sim.py on both
protocols, test_vllm_deploy.py on the real engine.) Model files are never
written by the toolkit: the tests break copies. The guest is destroyed afterwards, also on failure.
"""
import json
import os
import re
import shutil

import pytest

from tests.helpers import ROOT, SIM_WHEELS, until
from tests.helpers.guesthost import GuestHost, Timed, verdict_msg, verdicts
from tools import sim_wheels

HOST = "vllm-cpu"  # the inventory's host name; the catalog entry chooses what it runs
VM = GuestHost("mws", os.path.join(ROOT, "inventories", "vllm-cpu"), HOST)
UNIT = "sglang-sim"
PORT = 30001
MODEL = "/srv/models/sim-sglang"
# The sim entry shares the group's variables (its catalog entry names its own distribution): no vLLM wheelhouse.
SIM = {"modelwake_deploy_model": "sim-sglang",
       "inference_env_wheelhouse": "", "inference_env_wheelhouse_lock": "",
       "modelwake_textfile_dir": "/var/lib/node_exporter/textfile"}
TEXTFILE = "/var/lib/node_exporter/textfile/%s.prom"
FAST = ["--disable-cuda-graph", "--load-rate-mib", "32", "--start-seconds", "1", "--init-seconds", "2",
        "--warmup-seconds", "1"]
STALL = 20

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0 or shutil.which("systemd-nspawn") is None,
                       reason="test hosts need root and systemd-nspawn (make system-deps)"),
]

TIMINGS = {}
VERDICTS = {}


def timed(label):
    return Timed(TIMINGS, label)


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    try:
        VM.up(str(tmp_path_factory.mktemp("sim-deploy")))
        with timed("make the model and deploy"):
            rc, out = VM.play("playbooks/demo-model.yml", dict(SIM, modelwake_demo_model_size_mib=64,
                                                                modelwake_demo_model_shards=8))
            assert rc == 0, out[-4000:]
            rc, out = VM.deploy(SIM)
        assert rc == 0, out[-4000:]
        # node_exporter's textfiles: the launcher's phase, and the preflight's expected load time beside it.
        # (The launcher says ready a moment after the play's wait saw it.)
        until("the textfile says ready", lambda: 'modelwake_phase{name="sglang-sim.service",phase="ready"} 1'
              in VM.sh("cat " + TEXTFILE % UNIT), timeout=60)
        expected = VM.sh("cat " + (TEXTFILE % UNIT).replace(".prom", "-expected-load.prom")).split()
        assert expected[-2] == 'modelwake_load_expected_seconds{name="sglang-sim.service"}' and int(expected[-1]) > 0
        yield VM
    finally:
        VM.down()
        print("\nsimulated SGLang deploy and fault matrix, measured (s): %s" % json.dumps(TIMINGS, indent=1))
        print("verdicts: %s" % json.dumps(VERDICTS, indent=1))


def sim_deploy(**extra):
    return VM.deploy(dict(SIM, **extra))


# Damage that the shards' sizes alone do not show, and the plain truncation: one shard of one copy
# each, so that one deploy proves all three (the preflight names every damaged shard).
DAMAGES = {
    "model-00003-of-00008.safetensors": ("truncate -s -4096 {f}", "-lt", "truncated"),
    # Garbage over the header's JSON, in place: same size.
    "model-00005-of-00008.safetensors": ("printf 'garbage!' | dd of={f} bs=1 seek=24 conv=notrunc status=none",
                                         "-eq", "its header is not valid JSON"),
    # A downloader that preallocated the file and was killed after the header: the data all zeros.
    "model-00007-of-00008.safetensors": (
        "python3 -c \"import os, struct\nf = open('{f}', 'r+b'); size = os.fstat(f.fileno()).st_size\n"
        "start = 8 + struct.unpack('<Q', f.read(8))[0]; f.truncate(start); os.posix_fallocate(f.fileno(), 0, size)\"",
        "-eq", "all zeros: allocated and never written"),
}


def test_two_models_on_one_host_in_one_run(sim):
    """modelwake_host_models deploys every model of the host, one after the other, each restarted only
    if it changed: sim-sglang (ready, unchanged) keeps its process, sim-sglang-small is installed and
    started beside it on its own unit, port and GPU."""
    second_unit, second_port = "sglang-sim-small", 30002
    before = VM.unit_state(UNIT)
    both = {k: v for k, v in SIM.items() if k != "modelwake_deploy_model"}
    try:
        with timed("a second model beside the first, one run"):
            rc, out = VM.deploy(dict(both, modelwake_host_models=["sim-sglang", "sim-sglang-small"]))
        assert rc == 0, out[-4000:]
        waits = [(v.get("unit"), v["phase"]) for v in verdicts(out)]
        assert (UNIT + ".service", "ready") in waits and (second_unit + ".service", "ready") in waits, waits
        after = VM.unit_state(UNIT)
        assert (after["MainPID"], after["InvocationID"]) == (before["MainPID"], before["InvocationID"]), after
        assert VM.unit_state(second_unit)["ActiveState"] == "active"
        assert VM.completion(PORT) != "" and VM.completion(second_port) != ""
        assert "--port 30002" in VM.sh("systemctl cat %s" % second_unit)
        # Each model its own textfile: the host's two launchers never write the same one.
        assert 'name="%s.service"' % second_unit in VM.sh("cat " + TEXTFILE % second_unit)
    finally:
        VM.sh("systemctl disable --now %s" % second_unit, check=False)


def test_damaged_copy_is_refused_before_any_change(sim):
    before = VM.unit_state(UNIT)
    assert before["ActiveState"] == "active", before
    broken = MODEL + "-damaged"
    VM.sh("rm -rf {b} && cp -a {m} {b}".format(m=MODEL, b=broken))
    for shard, (command, size_test, _) in DAMAGES.items():
        path = "%s/%s" % (broken, shard)
        VM.sh("size=$(stat -c %%s %s) && %s && test $(stat -c %%s %s) %s $size" % (
            path, command.format(f=path), path, size_test))
    with timed("damaged copy -> refused by the preflight"):
        rc, out = sim_deploy(model_service_model_path=broken, gpu_preflight_model_path=broken,
                             inference_env_model_path=broken)
    VM.sh("rm -rf %s" % broken)
    flat = " ".join(out.split())
    assert rc == 2 and "%s is not whole, nothing was changed: " % broken in flat, flat[-4000:]
    for shard, (_, _, reason) in DAMAGES.items():
        named = re.search(r"%s: [^;]*" % re.escape(shard), flat)
        assert named and reason in named.group(0), flat[-4000:]
        VERDICTS["damaged copy, " + reason] = named.group(0)[:160]
    assert "changed: [%s]" % HOST not in out and "TASK [inference_env" not in out, flat[-4000:]
    # The working service was never touched: the same process, still answering.
    after = VM.unit_state(UNIT)
    assert (after["MainPID"], after["InvocationID"]) == (before["MainPID"], before["InvocationID"]), after
    assert VM.completion(PORT) != ""


def broken_sim_build(dest, version):
    """The simulated engine's source as another release whose server exits at once (it still imports)."""
    shutil.copytree(os.path.join(ROOT, "engines", "sim"), dest,
                    ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    for name, old, new in (("pyproject.toml", 'version = "0.1.0"', 'version = "%s"' % version),
                           ("modelwake_sim/__init__.py", '__version__ = "0.1.0"', '__version__ = "%s"' % version),
                           ("modelwake_sim/__main__.py", 'if __name__ == "__main__":\n',
                            'if __name__ == "__main__":\n    sys.exit("modelwake-sim %s: a broken build" % __version__)\n')):
        path = os.path.join(dest, name)
        with open(path) as handle:
            text = handle.read()
        assert old in text, (name, old)
        with open(path, "w") as handle:
            handle.write(text.replace(old, new, 1))
    return dest


def test_an_upgrade_that_does_not_come_up_is_rolled_back(sim, tmp_path):
    venv_python = "/opt/modelwake/sim-venv/bin/python"
    packages_before = VM.sh("%s -m pip freeze --all" % venv_python)
    # Its own wheel directory, so that no other test's host is offered the broken wheel; py-spy's
    # wheel (downloaded once) comes from the suite's.
    wheels = str(tmp_path / "sim-wheels")
    os.makedirs(wheels)
    for wheel in os.listdir(SIM_WHEELS):
        if wheel.startswith("py_spy-"):
            shutil.copy(os.path.join(SIM_WHEELS, wheel), wheels)
    source = broken_sim_build(str(tmp_path / "sim-0.1.1"), "0.1.1")
    sim_wheels.build(wheels, source)
    with timed("upgrade that cannot start -> rolled back, ready again"):
        rc, out = sim_deploy(inference_env_extra_wheel_dirs=[wheels], inference_env_engine_version="0.1.1")
    flat = " ".join(out.split())
    assert rc == 2, flat[-4000:]
    assert "%s did not come up after the upgrade of /opt/modelwake/sim-venv (modelwake-sim 0.1.0 -> 0.1.1)" % UNIT in flat, flat[-4000:]
    assert re.search(r"\(modelwake-sim 0\.1\.0 -> 0\.1\.1\): failed \(rule [a-z_]+\) after \d+ s: failed: ", flat), flat[-4000:]
    # Before anything was undone, the output named the rule that ended the start and its evidence.
    assert re.search(r"Rolling back %s: its start on the upgrade ended failed by the rule [a-z_]+ after \d+ s: failed: "
                     % UNIT, flat), flat[-4000:]
    # The broken build's own words are in the unit's journal, where the message's status points.
    assert "modelwake-sim 0.1.1: a broken build" in VM.sh("journalctl -u %s --no-pager -n 300" % UNIT)
    assert re.search(r"Rolled back to the previous package set \(modelwake-sim 0\.1\.1 -> 0\.1\.0\) and restarted: "
                     r"ready again after \d+ s", flat), flat[-4000:]
    VERDICTS["upgrade that cannot start"] = re.search(r"did not come up[^.]*", flat).group(0)[:200]
    # The host is as it was: the exact previous packages, the service answering.
    assert VM.sh("%s -m pip freeze --all" % venv_python) == packages_before
    # The previous build restarted on its own compile caches, keyed by the build: never the failed one's.
    environment = VM.sh("systemctl show %s -p Environment --value" % UNIT)
    assert "/compile/modelwake-sim-0.1.0/triton" in environment and "0.1.1" not in environment, environment
    # (The launcher says READY=1 after its own completion, a moment after the wait's.)
    until("the unit active again", lambda: VM.unit_state(UNIT)["ActiveState"] == "active", timeout=60)
    assert VM.completion(PORT) != ""


def test_hang_during_load_is_stalled(sim):
    with timed("hang during load -> stalled (stall_timeout %d)" % STALL):
        # Without the notify launcher: with it, the unit's own launcher judges the same stall_timeout,
        # stops the hung start and the wait reports that exit (failed, status "stalled: ...").
        rc, out = sim_deploy(model_service_extra_args=FAST + ["--fault", "hang:loading", "--fault-after", "1"],
                             model_service_stall_timeout=STALL, model_service_launcher=False)
    VERDICTS["hang during load"] = verdict_msg(out)
    flat = " ".join(out.split())
    assert rc == 2 and "phase: stalled" in flat, flat[-4000:]
