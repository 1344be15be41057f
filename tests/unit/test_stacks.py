"""The stack reader (host/stacks.py) on a recorded py-spy dump, and the one-line summary.

tests/fixtures/stacks/sglang-spin-tp2.json: `py-spy 0.4.1 dump --json --nonblocking` of each
process of the simulated SGLang server (--tp 2 --fault spin:initializing): TP0 spinning in
all_reduce, TP1 parked (the rank that never arrives), the API process idle.
"""
import json
import os
import stat

import pytest

from ansible_collections.modelwake.serving.plugins.module_utils.host import stacks
from ansible_collections.modelwake.serving.plugins.module_utils.readiness.stack_summary import summarize
from tests.helpers import FIXTURES, ROOT

FIXTURE = os.path.join(FIXTURES, "stacks",
                       "sglang-spin-tp2.json")


@pytest.fixture(scope="module")
def dumps():
    with open(FIXTURE) as handle:
        return json.load(handle)


def test_the_frames_shown_are_the_busy_threads_innermost_first(dumps):
    signature, thread, frames = stacks.parse_threads(json.dumps(dumps["sglang::scheduler_TP0"]))
    assert thread == "MainThread"
    assert frames[0] == ["all_reduce", "modelwake_sim/ranks.py", frames[0][2]] and frames[0][2] > 0
    assert [f[0] for f in frames[1:]] == ["check_fault", "burn"]
    assert len(frames) == stacks.SHOWN_FRAMES and len(signature) == 16


def test_the_signature_changes_when_any_frame_moves_and_only_then(dumps):
    threads = dumps["sglang::scheduler_TP1"]
    same = stacks.parse_threads(json.dumps(threads))[0]
    assert stacks.parse_threads(json.dumps(list(reversed(threads))))[0] == same  # thread order is no news
    moved = json.loads(json.dumps(threads))
    moved[0]["frames"][-1]["line"] += 1  # the outermost frame of one thread
    assert stacks.parse_threads(json.dumps(moved))[0] != same
    assert stacks.parse_threads(json.dumps(dumps["sglang::scheduler_TP0"]))[0] != same


def test_the_idle_api_process_shows_its_main_thread(dumps):
    _sig, thread, frames = stacks.parse_threads(json.dumps(dumps["api"]))
    assert thread == "MainThread" and frames


def test_the_title_is_the_name_when_the_process_set_one():
    assert stacks.process_name({"cmdline": "sglang::scheduler_TP0", "comm": "sglang::schedul"}) == "sglang::scheduler_TP0"
    assert stacks.process_name({"cmdline": "/opt/v/bin/python -m vllm.entrypoints.openai.api_server --port 1",
                                "comm": "python3"}) == "api_server"
    assert stacks.process_name({"cmdline": "/usr/bin/python3 /opt/x/serve.py", "comm": "python3"}) == "python3"


def executable(path):
    path.write_text("#!/bin/sh\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def test_py_spy_is_looked_for_next_to_the_engine_interpreter_first(tmp_path, monkeypatch):
    venv_bin = tmp_path / "venv" / "bin"
    venv_bin.mkdir(parents=True)
    on_path = tmp_path / "path"
    on_path.mkdir()
    monkeypatch.setenv("PATH", str(on_path))
    processes = {10: {"cmdline": "%s/python -m sglang.launch_server" % venv_bin}, 11: {"cmdline": "sglang::scheduler_TP0"}}
    found, missing = stacks.find_py_spy("auto", processes)
    assert found is None
    assert "not installed" in missing and str(venv_bin) in missing and "py-spy==%s" % stacks.PY_SPY_VERSION in missing
    in_path = executable(on_path / "py-spy")
    assert stacks.find_py_spy("auto", processes) == (in_path, None)
    in_venv = executable(venv_bin / "py-spy")
    assert stacks.find_py_spy("auto", processes) == (in_venv, None)
    assert stacks.find_py_spy(in_path, processes) == (in_path, None)
    assert stacks.find_py_spy("off", processes) == (None, "stacks are off (py_spy: off)")
    assert "not an executable file" in stacks.find_py_spy(str(tmp_path / "nope"), processes)[1]


def test_a_refused_read_makes_stacks_unavailable_with_the_reason(tmp_path):
    py_spy = executable(tmp_path / "py-spy")
    calls = []

    def refusing(argv, timeout):
        calls.append(argv)
        assert timeout == stacks.DUMP_TIMEOUT and "--nonblocking" in argv and "--json" in argv
        return 1, "", "Error: Permission Denied (os error 13)\nPermission denied"

    reader = stacks.StackReader(py_spy, runner=refusing, proc_root=str(tmp_path))
    result = reader.read({5: {"cmdline": "python3 x.py", "comm": "python3", "state": "S", "own_ticks": 0}})
    assert result["processes"] == [] and calls
    assert "may not read process 5" in result["unavailable"] and "CAP_SYS_PTRACE" in result["unavailable"]


def test_a_read_gives_name_rank_frames_and_the_counters(tmp_path, dumps):
    py_spy = executable(tmp_path / "py-spy")

    def recorded(argv, timeout):
        pid = int(argv[argv.index("--pid") + 1])
        return 0, json.dumps(dumps["sglang::scheduler_TP%d" % (pid - 20)]), ""

    reader = stacks.StackReader(py_spy, runner=recorded, proc_root=str(tmp_path))
    processes = dict((20 + r, {"cmdline": "sglang::scheduler_TP%d" % r, "comm": "sglang::schedul", "state": "R",
                               "own_ticks": 250, "faults": 800 + r}) for r in (0, 1))
    processes[30] = {"cmdline": "/usr/bin/g++ -O2 x.cpp", "comm": "g++", "state": "R", "own_ticks": 3}
    result = reader.read(processes)
    assert result["unavailable"] is None
    assert [(p["pid"], p["rank"], p["frames"][0][0]) for p in result["processes"]] == [(20, 0, "all_reduce"), (21, 1, "hang")]
    assert result["processes"][1]["faults"] == 801
    assert result["processes"][0]["cpu_seconds"] == round(250.0 / stacks.CLK_TCK, 2)


def entry(pid, rank, function, line=10, state="R", since=0.0, name=None):
    return {"pid": pid, "rank": rank, "name": name or "sglang::scheduler_TP%s" % rank, "state": state,
            "frames": [[function, "parallel_state.py" if function == "all_reduce" else "loader.py", line]],
            "since": since}


def test_identical_ranks_are_grouped_and_the_odd_one_out_named():
    entries = [entry(100 + r, r, "all_reduce", 512, since=5.0) for r in range(7)]
    entries.append(entry(107, 7, "load_weights", 449, state="T", since=2.0))
    assert summarize(entries, 605.0) == ("TP0-6 in all_reduce (parallel_state.py:512) for 600 s; "
                                         "TP7 state T (stopped) in load_weights (loader.py:449) for 603 s - the odd one out")
    assert summarize(entries, 605.0, seconds=False).startswith("TP0-6 in all_reduce (parallel_state.py:512) for 10m00s; ")


def test_unranked_processes_are_named_by_title_and_pid_and_ranges_compress():
    entries = [entry(r, r, "repack_marlin_weights", 211, since=60.0) for r in (0, 1, 2, 4, 6, 7)]
    entries.append(entry(9, None, "select", 468, state="S", since=0.0, name="python3"))
    assert summarize(entries, 100.0, seconds=False) == ("TP0-2,4,6-7 in repack_marlin_weights (loader.py:211) for 40s; "
                                                        "python3 (pid 9) in select (loader.py:468) for 1m40s")
    assert summarize([], 1.0) == ""


def test_one_py_spy_release_everywhere():
    """The reader is tested with one py-spy release: the controller's, the role's and the wheelhouse's."""
    import yaml
    root = ROOT
    pin = "py-spy==%s" % stacks.PY_SPY_VERSION
    with open(os.path.join(root, "requirements.txt")) as handle:
        assert pin in handle.read().split()
    with open(os.path.join(root, "roles", "inference_env", "defaults", "main.yml")) as handle:
        assert yaml.safe_load(handle)["inference_env_py_spy_version"] == stacks.PY_SPY_VERSION
    with open(os.path.join(root, "roles", "inference_env", "meta", "argument_specs.yml")) as handle:
        spec = yaml.safe_load(handle)["argument_specs"]["main"]["options"]
    assert spec["inference_env_py_spy_version"]["default"] == stacks.PY_SPY_VERSION
    with open(os.path.join(root, "tools", "vllm_cpu.py")) as handle:
        assert '"%s"' % pin in handle.read()
    with open(os.path.join(root, "tools", "sim_wheels.py")) as handle:
        assert 'PY_SPY_VERSION = "%s"' % stacks.PY_SPY_VERSION in handle.read()


def test_a_group_first_seen_at_this_read_gets_no_duration():
    assert summarize([entry(5, 0, "poll", 106, state="T", since=62.0)], 62.0) == \
        "TP0 state T (stopped) in poll (loader.py:106)"


def test_py_spy_of_a_container_is_found_along_the_engines_own_path_in_its_own_root(tmp_path, monkeypatch):
    """A container's engine runs `python3 -m ...`: its interpreter is where its own PATH finds it, in its
    own root (/proc/<pid>/root), and so is the py-spy beside it. A laid-out /proc stands for the host's."""
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    proc = tmp_path / "proc"
    root = proc / "4242" / "root"
    (proc / "4242").mkdir(parents=True)
    (proc / "4242" / "environ").write_bytes(b"HOME=/root\0PATH=/usr/local/bin:/opt/modelwake/venv/bin:/usr/bin\0")
    venv_bin = root / "opt" / "modelwake" / "venv" / "bin"
    venv_bin.mkdir(parents=True)
    (root / "usr" / "bin").mkdir(parents=True)
    executable(venv_bin / "python3")
    executable(root / "usr" / "bin" / "python3")  # further along the PATH: not the one the process runs
    processes = {4242: {"cmdline": "python3 -m modelwake_sim serve --engine sglang"}}
    found, missing = stacks.find_py_spy("auto", processes, str(proc))
    assert found is None and str(venv_bin) in missing
    in_container = executable(venv_bin / "py-spy")
    assert stacks.find_py_spy("auto", processes, str(proc)) == (in_container, None)
    # An image without py-spy: the one beside the unit's launcher, in the host's venv (inference_env's).
    os.unlink(in_container)
    host_bin = tmp_path / "host-venv" / "bin"
    host_bin.mkdir(parents=True)
    on_host = executable(host_bin / "py-spy")
    launcher = {77: {"cmdline": "%s/python /opt/modelwake/lib/modelwake-launch --url http://x" % host_bin}}
    assert stacks.find_py_spy("auto", processes, str(proc), helpers=launcher) == (on_host, None)
    # Another user's process, whose environment cannot be read: PATH here, as before.
    (proc / "4242" / "environ").unlink()
    assert stacks.interpreter_dirs(processes, str(proc)) == []
