"""The prefetch through a real launcher run (`python -m modelwake launch`, installed as the role
installs it, a real sd_notify socket): the model is read before the engine exists, systemd hears
its progress, and a shard that cannot be read ends the start with exit 9 naming it,
recorded as a failed start, the engine never started."""
import os
import subprocess
import sys

import pytest

from ansible_collections.modelwake.serving.plugins.module_utils.host import failed_starts, storage
from ansible_collections.modelwake.serving.plugins.module_utils.launcher.exit_codes import EXIT_FAILED, EXIT_PREFETCH

from tests.helpers import launcher_package
from tests.helpers.network import free_port as closed_port
from tests.helpers.notify_listener import NotifyListener
from tests.unit.test_prefetch_step import UNREADABLE, drop_cache

MIB = 1024 * 1024
# An engine that leaves a mark that it ran, then dies at once (the start's verdict: failed).
ENGINE = "import sys; open(sys.argv[1], 'w').write('ran'); sys.exit(1)"


@pytest.fixture(scope="module")
def pythonpath(tmp_path_factory):
    return launcher_package.install(str(tmp_path_factory.mktemp("launcher")))


@pytest.fixture
def model_dir(tmp_path):
    directory = tmp_path / "model"
    directory.mkdir()
    for i in range(2):
        path = str(directory / ("model-%05d-of-00002.safetensors" % (i + 1)))
        with open(path, "wb") as handle:
            handle.write(os.urandom(24 * MIB + i))
            handle.flush()
            os.fsync(handle.fileno())
        drop_cache(path)
    return str(directory)


def launch(tmp_path, pythonpath, model_dir, listener):
    """One start as the unit makes it: (exit status, the launcher's log, whether the engine ran)."""
    mark = tmp_path / "engine-ran"
    state = tmp_path / "state"
    state.mkdir(exist_ok=True)
    argv = [sys.executable, "-m", "modelwake", "launch", "--url", "http://127.0.0.1:%d" % closed_port(),
            "--model-path", model_dir, "--prefetch", "auto", "--poll-interval", "0.2", "--stall-timeout", "10",
            "--state-dir", str(state), "--name", "prefetch-test.service",
            "--", sys.executable, "-c", ENGINE, str(mark)]
    environ = dict(os.environ, PYTHONPATH=pythonpath, NOTIFY_SOCKET=listener.address)
    proc = subprocess.run(argv, env=environ, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          universal_newlines=True, timeout=60)
    return proc.returncode, proc.stderr, mark.exists()


@pytest.fixture
def listener():
    listener = NotifyListener()
    yield listener
    listener.close()


def test_the_model_is_read_before_the_engine_starts_and_systemd_hears_its_progress(
        tmp_path, pythonpath, model_dir, listener):
    code, log, ran = launch(tmp_path, pythonpath, model_dir, listener)
    assert code == EXIT_FAILED and ran, log  # the engine started after the prefetch (and died: its verdict)
    lines = [line[len("modelwake: "):] for line in log.splitlines() if line.startswith("modelwake: ")]
    said = [i for i, line in enumerate(lines) if line.startswith(("prefetching: ", "prefetch done: ", "engine started"))]
    assert [lines[i].split(":")[0].split(" as ")[0] for i in said] == [
        "prefetching", "prefetch done", "engine started"], lines
    assert lines[said[1]].startswith("prefetch done: 48.0 MiB in "), lines
    listener.wait_for("STATUS", 5, lambda value: "(100%)" in value)
    statuses = [value for _t, value in listener.fields("STATUS")]
    prefetching = [value for value in statuses if value.startswith("starting: prefetching ")]
    assert prefetching and prefetching[-1].startswith("starting: prefetching 48.0 MiB of 48.0 MiB (100%), "), statuses
    share = storage.page_cache_share([path for path, _size in storage.model_files(model_dir)])
    if share["fraction"] is not None:
        # All of it was read; the kernel may reclaim a few pages since (seen: 99.8 % on a machine with
        # proactive reclaim, kdamond, under a full test run's memory use).
        assert share["fraction"] >= 0.99, share
        # The next start on this warm cache reads nothing, and says why.
        code, log, ran = launch(tmp_path, pythonpath, model_dir, listener)
        assert "modelwake: not prefetched: the page cache already holds 100% of the model" in log, log
        assert "prefetch done" not in log


def test_a_shard_that_cannot_be_read_ends_the_start_with_exit_9_naming_it(tmp_path, pythonpath, model_dir, listener):
    if not os.path.isfile(UNREADABLE):
        pytest.skip("no %s here" % UNREADABLE)
    os.symlink(UNREADABLE, os.path.join(model_dir, "model-00003-of-00003.safetensors"))
    code, log, ran = launch(tmp_path, pythonpath, model_dir, listener)
    assert code == EXIT_PREFETCH and not ran, log
    message = "failed: model-00003-of-00003.safetensors: cannot open (Permission denied)"
    assert "modelwake: " + message in log.splitlines(), log
    assert listener.wait_for("STATUS", 5, lambda value: value == message)
    record = failed_starts.read_record(str(tmp_path / "state"))
    assert [start["cause"] for start in record["starts"]] == [message]
