"""The launcher's prefetch step (launcher/prefetch_step.py) on a real model directory, with a real
sd_notify socket: what auto decides and says, the progress systemd hears, a damaged shard named,
a warm cache read no second time, off reading nothing, a stop and a stall."""
import json
import os
import re
import shutil
import subprocess
import tempfile

import pytest

from ansible_collections.modelwake.serving.plugins.module_utils.common.errors import ModelWakeError
from ansible_collections.modelwake.serving.plugins.module_utils.host import prefetch, storage
from ansible_collections.modelwake.serving.plugins.module_utils.launcher.cli import build_launch_config, parse_args
from ansible_collections.modelwake.serving.plugins.module_utils.launcher.notify import Notifier
from ansible_collections.modelwake.serving.plugins.module_utils.launcher.prefetch_step import PrefetchStep

from tests.helpers import ROOT
from tests.helpers.notify_listener import NotifyListener
from tests.helpers.traces import Trace, config, replay

MIB = 1024 * 1024
# A regular file of 4096 bytes by its size that no one may open for reading, root included (a
# write-only sysfs attribute): a shard the launcher cannot read, as a service user meets a 0600 one.
UNREADABLE = "/sys/bus/pci/rescan"


def drop_cache(path):
    fd = os.open(path, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)


@pytest.fixture
def model_dir(tmp_path):
    """Three shards of random bytes, on disk (fsynced) and out of the page cache."""
    directory = tmp_path / "model"
    directory.mkdir()
    (directory / "config.json").write_text("{}")
    for i in range(3):
        path = str(directory / ("model-%05d-of-00003.safetensors" % (i + 1)))
        with open(path, "wb") as handle:
            handle.write(os.urandom((20 + 4 * i) * MIB + 77))
            handle.flush()
            os.fsync(handle.fileno())
        drop_cache(path)
    return str(directory)


@pytest.fixture
def listener():
    listener = NotifyListener()
    yield listener
    listener.close()


class Run(object):
    """One prefetch step as the launcher runs it: its options from the command line, its journal lines."""

    def __init__(self, model_dir, listener, *args, **kwargs):
        self.options = parse_args(["--url", "http://127.0.0.1:9", "--model-path", model_dir] + list(args)
                                  + ["--", "true"])
        build_launch_config(self.options, {})
        self.lines = []
        self.notifier = Notifier({"NOTIFY_SOCKET": listener.address})
        self.step = PrefetchStep(self.options, self.notifier, self.lines.append, stall_timeout=60,
                                 progress_interval=0.01, **kwargs)

    def run(self):
        return self.step.run()


def rchar():
    """Bytes this process has read through read(2) and its kind, page cache hits included."""
    with open("/proc/self/io") as handle:
        return int(next(line for line in handle if line.startswith("rchar:")).split()[1])


def model_bytes(model_dir):
    return sum(size for _path, size in storage.model_files(model_dir))


def test_auto_reads_a_cold_model_into_the_cache_with_its_progress_and_says_why(model_dir, listener):
    run = Run(model_dir, listener, "--prefetch", "auto")
    assert run.run() is True
    total = model_bytes(model_dir)
    assert run.lines[0].startswith("prefetching: ") and "available memory holds the" in run.lines[0], run.lines
    assert run.lines[-1].startswith("prefetch done: %s in " % prefetch.size(total)), run.lines
    assert run.lines[-1].endswith(", 3 files: the page cache holds the model"), run.lines
    progress = [line for line in run.lines if line.startswith("prefetching ") and " of " in line]
    assert progress and progress[-1].startswith("prefetching %s of %s (100%%), " % ((prefetch.size(total),) * 2))
    assert " GB/s, ETA " in progress[-1]
    # systemd heard the progress as the start's (the engine does not exist yet), and a new stall budget with each one.
    statuses = [value for _t, value in listener.wait_for("STATUS", 5, lambda v: "(100%)" in v) and
                listener.fields("STATUS")]
    assert statuses and all(value.startswith("starting: prefetching ") for value in statuses), statuses
    assert statuses[-1].startswith("starting: prefetching %s of %s (100%%)" % ((prefetch.size(total),) * 2))
    assert listener.wait_for("EXTEND_TIMEOUT_USEC", 5, lambda v: v == str(int(run.options.extend_timeout * 1e6)))
    share = storage.page_cache_share([path for path, _size in storage.model_files(model_dir)])
    if share["fraction"] is not None:
        assert share["resident_bytes"] == total


def test_auto_on_a_cache_that_holds_the_model_reads_nothing_and_says_so(model_dir, listener):
    for path, _size in storage.model_files(model_dir):
        with open(path, "rb") as handle:
            handle.read()
    if storage.page_cache_share([model_dir + "/config.json"])["fraction"] is None:
        pytest.skip("no mincore: the cache cannot be seen")
    before = rchar()
    run = Run(model_dir, listener, "--prefetch", "auto")
    assert run.run() is True
    assert rchar() - before < MIB  # the decision reads no weights (mincore only)
    assert len(run.lines) == 1 and run.lines[0].startswith(
        "not prefetched: the page cache already holds 100% of the model"), run.lines
    assert listener.wait_for("STATUS", 5, lambda v: v == "starting: " + run.lines[0])


def test_auto_declines_when_available_memory_does_not_hold_the_model_with_the_margin(model_dir, listener):
    # The margin the rule compares against, raised so far that this host's MemAvailable falls short.
    before = rchar()
    run = Run(model_dir, listener, "--prefetch", "auto", "--prefetch-margin", "1000000")
    assert run.run() is True
    assert rchar() - before < MIB
    assert len(run.lines) == 1 and "available memory does not hold the" in run.lines[0], run.lines
    assert "with a 1000000.0x margin" in run.lines[0] and run.lines[0].startswith("not prefetched: ")


def test_off_reads_nothing_and_says_nothing(model_dir, listener):
    before = rchar()
    run = Run(model_dir, listener, "--prefetch", "off")
    assert run.run() is True
    assert run.lines == [] and rchar() - before < MIB


def test_on_reads_even_a_cached_model(model_dir, listener):
    Run(model_dir, listener, "--prefetch", "on").run()
    before = rchar()
    run = Run(model_dir, listener, "--prefetch", "on")
    assert run.run() is True
    assert rchar() - before >= model_bytes(model_dir)
    assert run.lines[0].startswith("prefetching: the ") and run.lines[0].endswith("(prefetch: on)")


def test_a_shard_that_cannot_be_read_is_named(model_dir, listener):
    if not os.path.isfile(UNREADABLE):
        pytest.skip("no %s here" % UNREADABLE)
    os.symlink(UNREADABLE, os.path.join(model_dir, "model-00004-of-00004.safetensors"))
    run = Run(model_dir, listener, "--prefetch", "on")
    with pytest.raises(prefetch.PrefetchError) as caught:
        run.run()
    assert str(caught.value) == "model-00004-of-00004.safetensors: cannot open (Permission denied)"


def test_a_stop_asked_for_while_it_reads_ends_the_step_before_the_model_is_read(model_dir, listener):
    asked = []

    def stopping():
        asked.append(True)
        return len(asked) > 3  # a SIGTERM arrives after the first blocks
    run = Run(model_dir, listener, "--prefetch", "on", stopping=stopping)
    assert run.run() is False
    assert run.lines[-1].startswith("prefetch stopped after "), run.lines


def test_a_read_that_stops_moving_is_a_stall_after_the_stall_timeout(model_dir, listener):
    now = [100.0]
    run = Run(model_dir, listener, "--prefetch", "on", clock=lambda: now[0])
    step = run.step
    step.last_progress_t = step.last_log_t = now[0]
    report = {"bytes": 5 * MIB, "total_bytes": 60 * MIB, "rate_bytes_per_s": 1e6, "fraction": 5 / 60.0,
              "eta_seconds": 55.0}
    step._progress(report)  # bytes read: progress
    now[0] += 59
    step._progress(dict(report, rate_bytes_per_s=0.5e6))  # none since: no news, no new budget
    assert len(listener.wait_for("EXTEND_TIMEOUT_USEC", 2) and listener.fields("EXTEND_TIMEOUT_USEC")) == 1
    now[0] += 1
    with pytest.raises(prefetch.PrefetchError) as caught:
        step._progress(report)
    assert str(caught.value).startswith("prefetch stalled: no byte read for 1m00s (prefetching 5.0 MiB of 60.0 MiB")


@pytest.mark.parametrize("args,problem", [
    (["--prefetch", "auto"], "prefetch: auto needs --model-path"),
    (["--prefetch", "on", "--model-path", "MODEL", "--prefetch-margin", "0.5"], "prefetch-margin: must be 1.0 or more"),
])
def test_options_it_cannot_run_with_are_usage_errors(args, problem, model_dir):
    args = [model_dir if arg == "MODEL" else arg for arg in args]
    options = parse_args(["--url", "http://127.0.0.1:9"] + args + ["--", "true"])
    with pytest.raises(ModelWakeError) as caught:
        build_launch_config(options, {})
    assert str(caught.value).startswith(problem)


def launcher_unit(status):
    return {"ActiveState": "activating", "SubState": "start", "MainPID": 900, "NRestarts": 0, "ExecMainStatus": 0,
            "ExecMainCode": 0, "Result": "success", "StatusText": status, "Type": "notify", "LoadState": "loaded"}


def test_the_wait_sees_the_prefetch_as_the_launchers_step_before_the_engine(model_dir, listener):
    # What the wait reads from systemd while a real prefetch runs: the launcher's STATUS= texts.
    Run(model_dir, listener, "--prefetch", "on").run()
    texts = [value for _t, value in listener.fields("STATUS")]
    assert texts and all(text.startswith("starting: prefetching ") for text in texts), texts
    cfg = config(unit="sglang-k26.service", stall_timeout=60)
    trace = Trace(pids=(900,))
    # A long prefetch, its text on every look (no engine process yet: the launcher is not the tree).
    steps = [trace.step(t, unit=launcher_unit(texts[min(t // 5, len(texts) - 1)]), alive=False)
             for t in range(0, 300, 5)]
    verdicts = replay(cfg, steps)
    assert not verdicts[-1][1].terminal and {v.phase for _t, v in verdicts} == {"starting"}, verdicts[-1]
    assert verdicts[-1][1].msg.endswith("; the launcher is " + texts[-1][len("starting: "):])
    # Never loading: the prefetch's bytes are not the engine's load, which the wait follows afterwards.
    assert "loading" not in [v.phase for _t, v in verdicts]


# The launcher as the unit runs it, as its service user (not root) on a model root owns: mincore says
# "all cached" to such a reader whatever the cache holds (Linux >= 5.2), so auto must not believe it.
AS_SERVICE_USER = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
from ansible_collections.modelwake.serving.plugins.module_utils.host import prefetch, storage
from ansible_collections.modelwake.serving.plugins.module_utils.launcher.prefetch_step import decide
files = storage.model_files(sys.argv[2])
print(json.dumps({"truthful": prefetch.mincore_is_truthful(files[0][0]), "decision": decide("auto", files, 1.2)}))
"""


def as_service_user(model_dir):
    out = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3", "-c",
                          AS_SERVICE_USER, ROOT, model_dir], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         universal_newlines=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@pytest.fixture
def shared_model_dir():
    """A model every user may read (root's, mode 0644), outside pytest's private temporary directory."""
    directory = tempfile.mkdtemp(prefix="modelwake-prefetch-", dir="/var/tmp")
    os.chmod(directory, 0o755)
    for i in range(2):
        path = os.path.join(directory, "model-%05d-of-00002.safetensors" % (i + 1))
        with open(path, "wb") as handle:
            handle.write(os.urandom(16 * MIB))
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(path, 0o644)
        drop_cache(path)
    yield directory
    shutil.rmtree(directory)


def test_auto_as_the_service_user_sees_a_cold_cache_and_a_warm_one(shared_model_dir):
    if os.geteuid() != 0 or not shutil.which("setpriv") or not os.path.exists("/usr/bin/python3"):
        pytest.skip("needs root, setpriv and /usr/bin/python3 to run as another user")
    if not os.access(ROOT, os.R_OK) or oct(os.stat(ROOT).st_mode)[-1] not in "57":
        pytest.skip("the checkout is not readable by other users")
    cold = as_service_user(shared_model_dir)
    assert cold["truthful"] is False
    read, reason = cold["decision"]
    if "not supported" in reason:
        pytest.skip(reason)  # no RWF_NOWAIT on this filesystem: the decision says so, as the docs tell
    # A refused probe still starts its one-page read, and on fast storage that read can end before the
    # probe returns (seen: 3% of a cold model's probes): cold is a few percent, never near CACHED_ENOUGH.
    cached = re.search(r", (\d+)% of it cached$", reason)
    assert read is True and cached and int(cached.group(1)) <= 10, reason
    for path, _size in storage.model_files(shared_model_dir):
        with open(path, "rb") as handle:
            handle.read()
    read, reason = as_service_user(shared_model_dir)["decision"]
    assert read is False and reason.startswith("not prefetched: the page cache already holds 100% of the model"), reason
