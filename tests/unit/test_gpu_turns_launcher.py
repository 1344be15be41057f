"""The launcher takes its GPU turn before it starts the engine: the real launcher (as the role installs
it) in a subprocess, the scripted nvidia-smi for one fake GPU, a real notify socket, and the turn held
by this test with a real lock. Its engine is a small script that leaves a file when it starts."""
import json
import os
import signal
import subprocess
import sys

import pytest

from ansible_collections.modelwake.serving.plugins.module_utils.launcher.gpu_turns import TurnLocks

from tests.helpers import FAKES, free_port, launcher_package
from tests.helpers.notify_listener import NotifyListener
from tests.helpers.waiting import poll

ENGINE = "import sys, time; open(sys.argv[1], 'w').close(); time.sleep(120)"


@pytest.fixture
def host(tmp_path):
    gpu_dir = tmp_path / "fake-gpu"
    gpu_dir.mkdir()
    (gpu_dir / "gpus.json").write_text(json.dumps({"gpus": [{"index": 0, "memory_total_mib": 97887}]}))
    listener = NotifyListener()
    env = dict(os.environ, PATH=FAKES + os.pathsep + os.environ["PATH"], MODELWAKE_FAKE_GPU_DIR=str(gpu_dir),
               NOTIFY_SOCKET=listener.address, PYTHONPATH=launcher_package.install(str(tmp_path / "lib")))
    yield {"env": env, "listener": listener, "turns": str(tmp_path / "turns"), "tmp": tmp_path}
    listener.close()


def launch(host, started, *options):
    argv = [sys.executable, os.path.join(host["env"]["PYTHONPATH"], "modelwake-launch"),
            "--url", "http://127.0.0.1:%d" % free_port(), "--engine", "sglang", "--ready-check", "health",
            "--gpus", "0", "--gpu-turns", host["turns"], "--poll-interval", "1", "--stall-timeout", "60",
            "--name", "sglang-b.service"] + list(options) + ["--", sys.executable, "-c", ENGINE, started]
    return subprocess.Popen(argv, env=host["env"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            universal_newlines=True)


def test_the_engine_starts_only_once_the_turn_on_its_gpu_is_free(host):
    os.makedirs(host["turns"])
    other = TurnLocks(host["turns"], [0])
    assert other.try_take(0)
    other.write_holder("sglang-a.service", 4242)
    started = str(host["tmp"] / "engine-started")
    proc = launch(host, started)
    try:
        waiting = host["listener"].wait_for(
            "STATUS", 30, lambda value: value.startswith("starting: waiting for its turn on GPU 0: "
                                                         "sglang-a.service (pid 4242) is "))
        assert waiting, host["listener"].fields("STATUS")
        assert host["listener"].fields("EXTEND_TIMEOUT_USEC")
        assert not os.path.exists(started)
        other.release()
        assert poll(lambda: os.path.exists(started), 30), host["listener"].fields("STATUS")
        # Its turn, held until the start's verdict: the next start on GPU 0 waits behind it now.
        again = TurnLocks(host["turns"], [0])
        assert not again.try_take(0)
        assert again.holder(0)["pid"] == proc.pid
        again.release()
    finally:
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, output
    assert "waiting for its turn on GPU 0: sglang-a.service (pid 4242)" in output
    assert "took its turn on GPU 0 after" in output


def stopped_while_it_waits(host, held, waiting, *options):
    """The launcher's output when it is stopped (SIGTERM) as soon as its STATUS= says `waiting` behind the
    lock `held` (a TurnLocks that holds it): it ends cleanly, no engine started."""
    started = str(host["tmp"] / "engine-started")
    proc = launch(host, started, *options)
    try:
        assert host["listener"].wait_for("STATUS", 30, lambda value: waiting in value)
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=30)
    finally:
        held.release()
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, output
    assert not os.path.exists(started)
    return output


def one_shard_model(host, mib):
    model = host["tmp"] / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "model-00001-of-00001.safetensors").write_bytes(os.urandom(mib * 2 ** 20))
    return str(model)


def test_a_stop_while_it_waits_ends_it_cleanly_without_an_engine(host):
    os.makedirs(host["turns"])
    other = TurnLocks(host["turns"], [0])
    assert other.try_take(0)
    stopped_while_it_waits(host, other, "waiting for its turn on GPU 0")


def test_the_prefetch_reads_only_once_the_turn_is_taken(host):
    # Two starts on one GPU never read their models at once: the prefetch is inside the turn.
    model = one_shard_model(host, 4)
    os.makedirs(host["turns"])
    other = TurnLocks(host["turns"], [0])
    assert other.try_take(0)
    other.write_holder("sglang-a.service", 4242)
    started = str(host["tmp"] / "engine-started")
    proc = launch(host, started, "--model-path", model, "--prefetch", "on")
    try:
        assert host["listener"].wait_for("STATUS", 30, lambda value: "waiting for its turn on GPU 0" in value)
        other.release()
        assert poll(lambda: os.path.exists(started), 30), host["listener"].fields("STATUS")
    finally:
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, output
    said = [line for line in output.splitlines() if "took its turn on GPU 0" in line or "prefetch" in line
            or "engine started as pid" in line]
    assert len(said) >= 3 and "took its turn on GPU 0" in said[0] and "prefetch done" in said[-2], output
    assert "engine started as pid" in said[-1], output
    # While it waited for the turn, systemd never heard of a prefetch.
    statuses = [value for _at, value in host["listener"].fields("STATUS")]
    waited = [i for i, value in enumerate(statuses) if "waiting for its turn" in value]
    assert waited and not any("prefetch" in value for value in statuses[:waited[-1] + 1]), statuses


def test_a_prefetch_waits_for_the_disk_while_a_start_on_another_gpu_reads(host):
    # Two starts on different GPUs of one host take no GPU turn from each other, and still never read
    # their models at once: the read takes the host's disk turn.
    model = one_shard_model(host, 4)
    os.makedirs(host["turns"])
    reading = TurnLocks(host["turns"], ["disk"], file_name="%s.lock")
    assert reading.try_take("disk")
    reading.write_holder("sglang-a.service", 4242)
    started = str(host["tmp"] / "engine-started")
    proc = launch(host, started, "--model-path", model, "--prefetch", "on")
    try:
        waiting = host["listener"].wait_for(
            "STATUS", 30, lambda value: value == "starting: waiting for the disk: sglang-a.service (pid 4242) "
                                                 "is prefetching its model")
        assert waiting, host["listener"].fields("STATUS")
        assert not os.path.exists(started)
        reading.release()
        assert poll(lambda: os.path.exists(started), 30), host["listener"].fields("STATUS")
        # The disk is free again once its read is done: the engine's start does not hold it.
        again = TurnLocks(host["turns"], ["disk"], file_name="%s.lock")
        assert again.try_take("disk")
        assert again.holder("disk") is None
        again.release()
    finally:
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, output
    said = [line for line in output.splitlines() if "disk" in line or "prefetch done" in line]
    assert "waiting for the disk: sglang-a.service (pid 4242)" in said[0], output
    assert "took the disk after" in said[1] and "prefetch done" in said[2], output


def test_a_stop_while_it_waits_for_the_disk_starts_no_engine(host):
    model = one_shard_model(host, 1)
    os.makedirs(host["turns"])
    reading = TurnLocks(host["turns"], ["disk"], file_name="%s.lock")
    assert reading.try_take("disk")
    output = stopped_while_it_waits(host, reading, "waiting for the disk", "--model-path", model, "--prefetch", "on")
    assert "a stop was asked for while it waited for the disk" in output, output
