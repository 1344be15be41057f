"""wait_for_model_ready run by real Ansible against the simulated engine, on scripted GPUs (the fake
libnvidia-ml.so.1) and a scripted kernel log (MODELWAKE_KMSG_PATH): a fatal Xid written while the
engine loads fails the wait naming the GPU, and a driver that never answers is said while the wait
still ends on the other signals. No guest: pid mode on this machine, as test_module_sim.py."""
import json
import os
import subprocess
import threading
import time

import pytest

from tests.fakes import fake_nvml
from tests.helpers import ANSIBLE, ROOT, poll
from tests.helpers.simharness import SimRunner, make_model
from tests.integration.test_module_ansible import ENV, parse
from tests.integration.test_module_sim import FAST, Run

FALLEN = "NVRM: Xid (PCI:0000:19:00): 79, pid=%d, name=python3, GPU has fallen off the bus."  # GPU 1's default bus id
PAGE_FAULT = "NVRM: Xid (PCI:0000:18:00): 31, pid=%d, name=python3, Ch 00000008, intr 10000000. MMU Fault"


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    """The fake driver library, two scripted GPUs, a model, and the engines started (killed at the end)."""
    base = tmp_path_factory.mktemp("xid")
    gpus = base / "gpu"
    gpus.mkdir()
    (gpus / "gpus.json").write_text(json.dumps({"gpus": [
        {"index": i, "uuid": "GPU-%d" % i, "memory_total_mib": 97887, "memory_used_mib": 0, "utilization_gpu": 0}
        for i in range(2)]}))
    library = os.path.dirname(fake_nvml.build(str(base / "nvml")))
    sims = SimRunner(str(base), FAST)
    yield {"dir": base, "gpus": str(gpus), "library": library, "model": make_model(str(base / "model")), "sims": sims}
    sims.stop_all()


def run_module(host, sim, kmsg, extra_env=None, **options):
    """test_module_sim's module(), with the scripted GPUs and kernel log in the module's environment."""
    env = dict(ENV, LD_LIBRARY_PATH=host["library"], MODELWAKE_FAKE_GPU_DIR=host["gpus"], MODELWAKE_KMSG_PATH=kmsg,
               **(extra_env or {}))
    args = dict(url=sim.url, pid=sim.pid, engine="sglang", log_path=sim.log_path, poll_interval=1, **options)
    argv = [ANSIBLE, "localhost", "-c", "local", "-m", "wait_for_model_ready", "-a",
            " ".join("%s=%s" % (k, v) for k, v in sorted(args.items()))]
    started = time.monotonic()
    proc = subprocess.run(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True, timeout=240)
    return Run(proc.returncode, parse(proc.stdout, proc.stderr), proc.stdout + proc.stderr, started, time.monotonic())


def kmsg_record(seq, message):
    """A record stamped now: CLOCK_MONOTONIC's microseconds, the kernel log's own clock."""
    return "4,%d,%d,-;%s\n" % (seq, int(time.monotonic() * 1e6), message)


def test_a_fatal_xid_on_a_watched_gpu_fails_the_wait_while_the_engine_loads(host):
    sim = host["sims"].start("sglang", host["model"], "--load-rate-mib", "1")  # 32 s of loading
    kmsg = str(host["dir"] / "kmsg-fatal")
    with open(kmsg, "w") as log:
        log.write("4,1,1000,-;NVRM: Xid (PCI:0000:19:00): 48, pid=1, name=old, DBE (0x1)\n")  # at boot: not this start's
    progress = str(host["dir"] / "fatal.progress.jsonl")
    result = {}
    waiting = threading.Thread(target=lambda: result.setdefault("run", run_module(
        host, sim, kmsg, gpus="1", timeout=60, stall_timeout=30, progress_path=progress)))
    waiting.start()
    try:
        sim.wait_log("Loading safetensors checkpoint shards", timeout=60)
        poll(lambda: os.path.exists(progress) and os.path.getsize(progress), 60)
        with open(kmsg, "a") as log:
            log.write(kmsg_record(2, PAGE_FAULT % sim.pid))
            log.write(kmsg_record(3, FALLEN % sim.pid))
        began = time.monotonic()
    finally:
        waiting.join(120)
    run = result["run"]
    assert run.rc != 0 and run.result["phase"] == "failed", run
    assert run.result["msg"].startswith("failed: GPU 1 (PCI 0000:19:00) reported Xid 79 (GPU has fallen off the bus)"), run
    assert run.ended - began < 10, run  # a look or two after the line, not the stall timeout
    evidence = run.result["evidence"]
    assert evidence[0] == FALLEN % sim.pid
    assert any("Xid 31 on GPU 0 (PCI 0000:18:00)" in line and "not a watched GPU" not in line for line in evidence)
    assert not any("Xid 48" in line for line in evidence)


def test_a_driver_that_never_answers_is_said_and_the_wait_still_ends_ready(host):
    sim = host["sims"].start("sglang", host["model"], "--load-rate-mib", "4")  # 8 s of loading
    kmsg = str(host["dir"] / "kmsg-quiet")
    open(kmsg, "w").close()
    run = run_module(host, sim, kmsg, extra_env={"MODELWAKE_FAKE_NVML_BLOCK": "nvmlDeviceGetMemoryInfo_v2"},
                     timeout=90, stall_timeout=20)
    assert run.rc == 0 and run.result["phase"] == "ready", run
    assert run.result["gpu"] == [] and run.result["cost"]["looks"] >= 3, run  # looks went on without the GPUs
    # The module's warnings (module.warn()), said once.
    warning = "NVML did not answer in 5 s (GPU 0, nvmlDeviceGetMemoryInfo); the GPUs are not read again by this process"
    assert run.output.count(warning) == 1, run.output
