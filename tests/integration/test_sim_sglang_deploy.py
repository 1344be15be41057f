"""The fault matrix of test_vllm_deploy.py, where it applies, on the simulated engine speaking SGLang's
protocol: deployed by deploy-k26.yml (inventories/vllm-cpu, catalog entry `sim-sglang`) onto its own
systemd test host, so that both engines' semantics stay covered and this file runs beside the real one.

  crash exit 0 after ready   the unit comes back by itself, the launcher names the exit
  hang while loading         stalled after stall_timeout
  truncated shard            failed, SafetensorError in the evidence
  config.json missing        refused before any change
  port already taken         failed, the other process named

(A reboot mid-load of the simulated SGLang server: the Molecule `deploy` scenario.) Model files are never
written by the toolkit: the tests break copies. The guest is destroyed afterwards, also on failure.
"""
import json
import os
import shutil

import pytest

from guesthost import ROOT, GuestHost, Timed, until, verdict_msg

HOST = "vllm-cpu"  # the inventory's host name; the catalog entry chooses what it runs
VM = GuestHost("mws", os.path.join(ROOT, "inventories", "vllm-cpu"), HOST)
UNIT = "sglang-sim"
PORT = 30001
MODEL = "/srv/models/sim-sglang"
# The sim entry shares the group's variables: its own distribution, no vLLM wheelhouse.
SIM = {"modelwake_deploy_model": "sim-sglang", "inference_env_engine_package": "",
       "inference_env_wheelhouse": "", "inference_env_wheelhouse_lock": ""}
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
        yield VM
    finally:
        VM.down()
        print("\nsimulated SGLang deploy and fault matrix, measured (s): %s" % json.dumps(TIMINGS, indent=1))
        print("verdicts: %s" % json.dumps(VERDICTS, indent=1))


def sim_deploy(**extra):
    return VM.deploy(dict(SIM, **extra))


def test_crash_exit_0_after_ready_restarts_by_itself(sim):
    with timed("crash0 after ready -> unit back by itself"):
        # Late enough for the play's own wait and smoke to pass first.
        rc, out = sim_deploy(model_service_extra_args=FAST + ["--fault", "crash0:ready", "--fault-after", "20"])
        assert rc == 0, out[-4000:]
        before = VM.unit_state(UNIT)
        until("a restart by systemd", lambda: int(VM.unit_state(UNIT)["NRestarts"]) > int(before["NRestarts"]),
              timeout=60)
    journal = VM.sh("journalctl -u %s --no-pager -n 200" % UNIT)
    assert "the engine exited after it was ready (exit status 0)" in journal, journal[-3000:]


def test_hang_during_load_is_stalled(sim):
    with timed("hang during load -> stalled (stall_timeout %d)" % STALL):
        # Without the notify launcher: with it, the unit's own launcher judges the same stall_timeout,
        # stops the hung start and the wait reports that exit (failed, status "stalled: ...").
        rc, out = sim_deploy(model_service_extra_args=FAST + ["--fault", "hang:loading", "--fault-after", "1"],
                             model_service_stall_timeout=STALL, model_service_launcher=False)
    VERDICTS["hang during load"] = verdict_msg(out)
    flat = " ".join(out.split())
    assert rc == 2 and "phase: stalled" in flat, flat[-4000:]


def test_truncated_shard_fails_with_the_safetensor_error(sim):
    broken = MODEL + "-truncated"
    VM.sh("rm -rf {b} && cp -a {m} {b} && f={b}/model-00001-of-00008.safetensors && "
          "truncate -s $(( $(stat -c %s $f) / 2 )) $f".format(m=MODEL, b=broken))
    with timed("truncated shard -> failed"):
        rc, out = sim_deploy(model_service_model_path=broken)
    assert rc == 2, out[-4000:]
    failed = out[out.index("Wait for the restarted model service to be ready"):]
    VERDICTS["truncated shard"] = verdict_msg(failed)
    assert "phase: failed" in failed and "SafetensorError" in failed, failed[-4000:]


def test_missing_config_is_refused(sim):
    broken = MODEL + "-noconfig"
    VM.sh("rm -rf {b} && cp -a {m} {b} && rm {b}/config.json".format(m=MODEL, b=broken))
    with timed("config.json missing -> refused"):
        rc, out = sim_deploy(model_service_model_path=broken, gpu_preflight_model_path=broken,
                             inference_env_model_path=broken)
    assert rc == 2 and "config.json" in out and "changed: [%s]" % HOST not in out, out[-4000:]


def test_port_taken_fails(sim):
    VM.sh("systemctl stop %s && systemd-run --unit=port-squatter python3 -m http.server %d --bind 127.0.0.1"
          % (UNIT, PORT))
    try:
        until("the squatter listening", lambda: VM.health(PORT) != "000", timeout=30)
        with timed("port taken -> failed"):
            rc, out = sim_deploy()
    finally:
        VM.sh("systemctl stop port-squatter", check=False)
    VERDICTS["port taken"] = verdict_msg(out)
    flat = " ".join(out.split())
    assert rc == 2 and "phase: failed" in flat, flat[-4000:]
    assert "port %d is held by another process" % PORT in flat, flat[-4000:]
