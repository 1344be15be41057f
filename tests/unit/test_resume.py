"""A wait in slices continues exactly where the previous call stopped.

The action plugin prints progress between calls of the module; each call restores the wait from
a state file. These tests split replayed starts into slices (with a JSON round trip of the state
and the call's own overhead in between) and compare them look by look with one continuous wait,
then check each piece of state on real files, real processes and a scripted journalctl.
"""
import json
import os
import stat
import subprocess
import sys

import pytest

from ansible_collections.modelwake.serving.plugins.module_utils.host import logs, procfs

from ansible_collections.modelwake.serving.plugins.module_utils.readiness import resume
from ansible_collections.modelwake.serving.plugins.module_utils.readiness.config import build_config
from ansible_collections.modelwake.serving.plugins.module_utils.readiness.probe import HostProbe
from ansible_collections.modelwake.serving.plugins.module_utils.readiness.waiter import new_wait_state, wait_for_ready

from loopback import closed_port
from test_logs import ScriptedRunner, append
from traces import MIB, SGLANG_PREFIX, Trace, config, http, vllm_prefix


class FakeClock(object):
    """Times are multiples of 1/8 s, exact in binary floating point, so the sliced and the
    continuous wait compute bit-identical times."""

    def __init__(self):
        self.now = 5000.0

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        assert seconds >= 0
        self.now += seconds


class StoryProbe(object):
    """The host: answers snapshot(t) from a story; it lives on across slices, like the server."""

    def __init__(self, story, clock=None, cost=0.0):
        self.story = story
        self.trace = Trace(pids=(100, 200, 300), gpus=2)
        self.clock = clock
        self.cost = cost  # seconds each look takes

    def snapshot(self, t, remaining=None, stacks=False):
        if self.clock is not None:
            self.clock.now += self.cost
        return self.story(self.trace, t)


def sglang_start(trace, t):
    p = SGLANG_PREFIX
    if t < 10:
        return trace.step(t, cpu=1.0, lines=["server_args=ServerArgs(model_path='/m', tp_size=2)"] if t == 0 else [])
    if t < 300:
        bar = "Loading safetensors checkpoint shards: %d%% Completed | %d/29" % (100 * (t // 10) / 29, t // 10)
        return trace.step(t, cpu=0.9, read=100 * MIB, gpu_mem=[500 + int(t) * 200] * 2,
                          lines=[p + "Load weight begin."] if t == 10 else ([bar] if t % 20 == 0 else []))
    if t < 420:
        return trace.step(t, cpu=1.5, gpu_mem=[60000] * 2, lines=[p + "Load weight end."] if t == 300 else [])
    return trace.step(t, cpu=0.5, lines=[p + "The server is fired up and ready to roll!"],
                      http_result=http(200, models=200, completion=200, ready=True, model="/m"))


def vllm_hang(trace, t):
    worker = vllm_prefix("Worker", 300)
    if t <= 100:
        return trace.step(t, cpu=1.0, read=50 * MIB, lines=[worker + "Starting to load model /m..."] if t == 0 else [])
    return trace.step(t, cpu=0.0, states={300: "T"}, gpu_util=[100, 100])


def vllm_crash(trace, t):
    worker = vllm_prefix("Worker", 300)
    if t < 135:
        return trace.step(t, cpu=1.0, read=50 * MIB, lines=[worker + "Starting to load model /m..."] if t == 0 else [])
    return trace.step(t, alive=t < 140, lines=[
        "Traceback (most recent call last):",
        '  File "/opt/vllm/model_loader.py", line 42, in load',
        "safetensors_rust.SafetensorError: Error while deserializing header: incomplete metadata",
    ] if t == 135 else [])


STORIES = [
    ("ready", sglang_start, dict(engine="sglang", expected_bytes=290 * 100 * MIB), "ready"),
    ("stalled", vllm_hang, dict(engine="vllm", stall_timeout=120), "stalled"),
    ("failed", vllm_crash, dict(engine="vllm"), "failed"),
    ("timeout", sglang_start, dict(engine="sglang", timeout=200), "timeout"),
]


def continuous(story, cfg, cost=0.0):
    clock = FakeClock()
    looks = []
    result = wait_for_ready(cfg, StoryProbe(story, clock, cost), clock=clock, sleep=clock.sleep,
                            on_snapshot=lambda snap, verdict: looks.append((snap.t, verdict.to_dict())))
    return result, looks


def sliced(story, cfg, slice_seconds, overhead=1.25, cost=0.0):
    """As the action plugin drives it: slices, the state through JSON, the call's overhead."""
    clock = FakeClock()
    probe = StoryProbe(story, clock, cost)
    looks, slices, state = [], [], None
    while True:
        clock.now += overhead  # starting the module (again)
        began = clock()
        state = new_wait_state(began) if state is None else json.loads(state)
        result = wait_for_ready(cfg, probe, clock=clock, sleep=clock.sleep, state=state, slice_seconds=slice_seconds,
                                on_snapshot=lambda snap, verdict: looks.append((snap.t, verdict.to_dict())))
        slices.append((began, clock(), result))
        if state["done"]:
            return result, looks, slices
        state = json.dumps(state)


@pytest.mark.parametrize("name,story,overrides,verdict", STORIES, ids=[s[0] for s in STORIES])
def test_a_wait_in_slices_sees_what_one_continuous_wait_sees(tmp_path, name, story, overrides, verdict):
    one_path, sliced_path = tmp_path / "one.jsonl", tmp_path / "sliced.jsonl"
    one, one_looks = continuous(story, config(poll_interval=5, progress_path=str(one_path), **overrides))
    result, looks, slices = sliced(story, config(poll_interval=5, progress_path=str(sliced_path), **overrides), 30)
    assert one["phase"] == verdict
    assert result == one  # same keys, same phases history, msg, evidence, elapsed from the true start
    assert looks == one_looks  # every look at the same time, with the same verdict
    assert sliced_path.read_text() == one_path.read_text()  # progress_path: one line per look, across slices
    assert len(slices) >= 3
    for began, ended, partial in slices[:-1]:
        assert ended - began <= 30 and partial["failed"] is False and partial["phase"] not in ("ready", verdict)


def test_looks_that_take_time_start_every_poll_interval_in_slices_as_in_one_wait():
    # Start to start: looks of 1.5 s keep the 5 s rhythm, across slices too.
    cfg = config(engine="sglang", poll_interval=5)
    one, one_looks = continuous(sglang_start, cfg, cost=1.5)
    result, looks, slices = sliced(sglang_start, cfg, 30, cost=1.5)
    assert looks == one_looks and result == one and len(slices) >= 3
    assert [t for t, _v in looks][:8] == [0.0, 5.0, 10.0, 15.0, 20.0, 25.0, 30.0, 35.0]


def test_a_look_that_overran_is_followed_at_once_within_a_slice_and_after_the_next_call_starts():
    cfg = config(engine="sglang", poll_interval=5)
    _one, one_looks = continuous(sglang_start, cfg, cost=6.25)
    assert [t for t, _v in one_looks][:4] == [0.0, 6.25, 12.5, 18.75]
    _result, looks, slices = sliced(sglang_start, cfg, 30, cost=6.25, overhead=1.25)
    gaps = set(b - a for (a, _v), (b, _w) in zip(looks, looks[1:]))
    assert gaps == {6.25, 7.5}  # 7.5: the module's own start (1.25 s) between two slices
    assert len(slices) >= 3


def test_slices_hold_the_phases_and_elapsed_of_the_wait_so_far():
    _result, _looks, slices = sliced(sglang_start, config(engine="sglang", poll_interval=5), 30)
    second = slices[1][2]
    assert second["elapsed"] == 60 and second["phase"] == "loading"
    assert [p["phase"] for p in second["phases"]] == ["starting", "loading"]
    assert [p["phase"] for p in slices[-1][2]["phases"]] == ["starting", "loading", "initializing", "ready"]


def test_a_poll_interval_longer_than_the_slice_gives_one_look_per_slice():
    result, looks, slices = sliced(sglang_start, config(engine="sglang", poll_interval=45), 20)
    assert len(slices) == len(looks) and result["phase"] == "ready"
    assert [t for t, _v in looks][:4] == [0.0, 45.0, 90.0, 135.0]


def test_timeout_zero_is_one_slice_and_one_look():
    result, looks, slices = sliced(sglang_start, config(engine="sglang", timeout=0), 30)
    assert len(slices) == 1 and len(looks) == 1 and result["failed"] is False


# -- each piece of state ---------------------------------------------------------------------------

def info(pid, start, own, reaped, rbytes, ppid=1):
    return {"pid": pid, "starttime": start, "own_ticks": own, "child_ticks": reaped, "read_bytes": rbytes,
            "ppid": ppid, "state": "S", "comm": "python3", "cmdline": ""}


def test_tree_counter_continues_with_its_debts_across_a_round_trip():
    # A child is seen, exits, and its reaper's counters take its work over two polls later.
    polls = [
        {10: info(10, 1, 100, 0, 4096), 11: info(11, 2, 50, 0, 8192, ppid=10)},
        {10: info(10, 1, 120, 0, 4096)},
        {10: info(10, 1, 130, 60, 4096 + 8192 + 1024)},
        {10: info(10, 1, 170, 60, 4096 + 8192 + 4096)},
    ]
    one = procfs.TreeCounter()
    expected = [one.update(p) for p in polls]
    first = procfs.TreeCounter()
    got = [first.update(p) for p in polls[:2]]
    again = procfs.TreeCounter.from_state(json.loads(json.dumps(first.state_dict())))
    got += [again.update(p) for p in polls[2:]]
    assert got == expected
    assert expected[2][1] == 4096 + 8192 + 1024  # the child's 8192 counted once, the new 1024 counted


def test_file_tailer_continues_mid_line_without_a_line_lost_or_read_twice(tmp_path):
    path = str(tmp_path / "server.log")
    append(path, b"old run line\n")
    first = logs.FileTailer(path)
    assert first.read_new() == ["old run line"] and first.last_read_context
    append(path, b"Load weight begin.\nLoading safetensors: 10%\rLoading safe")
    assert first.read_new() == ["Load weight begin.", "Loading safetensors: 10%"]
    saved = json.loads(json.dumps(first.state_dict()))
    append(path, b"tensors: 20%\rLoad weight end.\n")
    second = logs.FileTailer(path)
    second.restore(saved)
    assert second.read_new() == ["Loading safetensors: 20%", "Load weight end."]
    assert not second.last_read_context


def test_file_tailer_restored_after_rotation_or_truncation_reads_the_new_file_from_its_start(tmp_path):
    path = str(tmp_path / "server.log")
    append(path, b"a long first line of the old file\n")
    tailer = logs.FileTailer(path)
    tailer.read_new()
    saved = tailer.state_dict()
    os.rename(path, path + ".1")
    append(path, b"new file\n")
    rotated = logs.FileTailer(path)
    rotated.restore(saved)
    assert rotated.read_new() == ["new file"]
    with open(path, "wb") as handle:
        handle.write(b"cut\n")  # truncated in place, shorter than where reading stopped
    truncated = logs.FileTailer(path)
    truncated.restore(dict(rotated.state_dict(), offset=10 ** 6))
    assert truncated.read_new() == ["cut"]


def test_file_tailer_of_a_file_not_there_yet_reads_it_from_the_start_once_it_appears(tmp_path):
    path = str(tmp_path / "later.log")
    first = logs.FileTailer(path)
    assert first.read_new() == []
    second = logs.FileTailer(path)
    second.restore(json.loads(json.dumps(first.state_dict())))
    append(path, b"hello\n")
    assert second.read_new() == ["hello"] and not second.last_read_context


def test_journal_reader_continues_after_its_cursor():
    entry = {"__CURSOR": "s=a;i=7", "_SYSTEMD_INVOCATION_ID": "inv1", "MESSAGE": "Load weight begin."}
    first = logs.JournalReader("k26.service", runner=ScriptedRunner([(0, json.dumps(entry) + "\n", "")]),
                               invocation_id="inv1", since_epoch=1700000000)
    assert first.read_new() == ["Load weight begin."]
    runner = ScriptedRunner([(0, json.dumps({"__CURSOR": "s=a;i=8", "MESSAGE": "Load weight end."}) + "\n", "")])
    second = logs.JournalReader("k26.service", runner=runner, invocation_id="a-later-invocation")
    second.restore(json.loads(json.dumps(first.state_dict())))
    assert second.read_new() == ["Load weight end."]
    assert runner.calls[0][-2:] == ["--after-cursor", "s=a;i=7"]
    assert second.invocation_id == "inv1" and second.since_epoch == 1700000000


# -- real processes and the state file -------------------------------------------------------------

@pytest.fixture
def server_process():
    """A stand-in server: burns a little CPU, says so, then waits for stdin to close (its crash)."""
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sum(range(3000000)); print('up', flush=True); "
                             "sys.stdin.read()"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    proc.stdout.readline()
    yield proc
    if proc.poll() is None:
        proc.kill()
    proc.wait()


@pytest.fixture
def state_dir(tmp_path, monkeypatch):
    directory = tmp_path / "state"
    directory.mkdir()
    monkeypatch.setattr(resume, "state_dir", lambda: str(directory))
    return directory


def params(proc, tmp_path, **extra):
    log = tmp_path / "server.log"
    log.touch()
    return dict(url="http://127.0.0.1:%d" % closed_port(), pid=proc.pid, log_path=str(log), timeout=600,
                stall_timeout=300, poll_interval=5, api_key="sk-resume-secret-91", **extra)


def test_host_probe_continues_its_counters_and_log_and_outlives_its_server(server_process, tmp_path):
    args = params(server_process, tmp_path)
    append(args["log_path"], b"Init torch distributed begin.\n")
    first = HostProbe(build_config(args))
    snap = first.snapshot(0.0)
    assert snap.process["alive"] and snap.log_context == ["Init torch distributed begin."]
    saved = json.loads(json.dumps(first.state_dict()))
    append(args["log_path"], b"Load weight begin.\n")
    server_process.stdin.close()
    server_process.wait()
    # The server is gone: a later slice is no bad input, it sees the crash.
    cfg = build_config(args, resuming=True)
    second = HostProbe(cfg, state=saved)
    later = second.snapshot(5.0)
    assert later.log_lines == ["Load weight begin."] and later.log_context == []
    assert later.process["alive"] is False
    assert later.process["cpu_seconds"] >= snap.process["cpu_seconds"] > 0
    with pytest.raises(Exception, match="pid: no process with pid"):
        build_config(args)


def test_wait_slice_keeps_a_private_state_file_and_reports_the_crash_between_slices(server_process, tmp_path,
                                                                                    state_dir):
    args = params(server_process, tmp_path)
    clock = FakeClock()
    first = resume.wait_slice(args, {"slice": 30, "state_path": None}, clock=clock, sleep=clock.sleep)
    path = first["_slice"]["state_path"]
    assert first["_slice"]["done"] is False and first["phase"] == "starting" and first["failed"] is False
    assert os.path.dirname(path) == str(state_dir)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    with open(path) as handle:
        text = handle.read()
    assert "sk-resume-secret-91" not in text
    assert json.loads(text)["wait"]["start"] == 5000.0
    clock.now += 2.0
    second = resume.wait_slice(args, {"slice": 30, "state_path": path}, clock=clock, sleep=clock.sleep)
    assert second["_slice"]["state_path"] == path and second["elapsed"] == 60
    server_process.stdin.close()
    server_process.wait()
    last = resume.wait_slice(args, {"slice": 30, "state_path": path}, clock=clock, sleep=clock.sleep)
    assert last["_slice"]["done"] is True and last["_slice"]["state_path"] is None
    assert last["phase"] == "failed" and last["failed"] is True
    assert "process %d exited 65 s into the wait" % server_process.pid in last["msg"]
    assert [p["phase"] for p in last["phases"]] == ["starting", "failed"]
    assert not os.path.exists(path) and os.listdir(str(state_dir)) == []


def test_a_reboot_between_slices_fails_the_wait_with_what_it_had_run(server_process, tmp_path, state_dir):
    args = params(server_process, tmp_path)
    clock = FakeClock()
    first = resume.wait_slice(args, {"slice": 30}, clock=clock, sleep=clock.sleep, boot="boot-a")
    path = first["_slice"]["state_path"]
    with pytest.raises(resume.ResumeError) as info:
        resume.wait_slice(args, {"slice": 30, "state_path": path}, clock=clock, sleep=clock.sleep, boot="boot-b")
    assert str(info.value).startswith("failed: the host rebooted during the wait (boot id boot-a -> boot-b)")
    assert info.value.elapsed == 30
    assert not os.path.exists(path)


def test_state_of_another_wait_a_foreign_file_or_a_vanished_one_is_refused(server_process, tmp_path, state_dir):
    args = params(server_process, tmp_path)
    clock = FakeClock()
    path = resume.wait_slice(args, {"slice": 30}, clock=clock, sleep=clock.sleep)["_slice"]["state_path"]
    other = dict(args, url="http://127.0.0.1:%d" % closed_port())
    with pytest.raises(resume.ResumeError, match="holds the state of another wait"):
        resume.wait_slice(other, {"slice": 30, "state_path": path}, clock=clock, sleep=clock.sleep)
    assert os.path.exists(path)  # the other wait's: left alone
    os.unlink(path)
    with pytest.raises(resume.ResumeError, match="is gone: the host rebooted or its temporary files were cleaned"):
        resume.wait_slice(args, {"slice": 30, "state_path": path}, clock=clock, sleep=clock.sleep)
    foreign = tmp_path / "passwd"
    foreign.write_text("root:x:0:0\n")
    with pytest.raises(resume.ResumeError, match="is not a wait state file"):
        resume.wait_slice(args, {"slice": 30, "state_path": str(foreign)}, clock=clock, sleep=clock.sleep)
    assert foreign.exists()  # never removed: not ours
