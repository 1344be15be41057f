"""What py-spy tells about a rank's CPU use: a Python hot loop, a busy-wait inside one C call with
the GIL released or kept, a regex backtrack, a C sleep (tests/fixtures/stacks/shapes.py).

tests/fixtures/stacks/shapes.json holds three `py-spy 0.4.1 dump --json --nonblocking` of each live
shape, ~50 ms apart (recorded by tests/fixtures/stacks/record_shapes.py); the last test runs the
shapes live under the py-spy this machine has, side by side.
"""
import json
import os
import shutil
import subprocess
import sys

import pytest

from ansible_collections.modelwake.serving.plugins.module_utils.host import stacks

HERE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures", "stacks")
with open(os.path.join(HERE, "shapes.json")) as _handle:
    RECORDED = json.load(_handle)["shapes"]

# (shape, owns_gil, active, innermost function): what py-spy reported on the live shapes.
EXPECTED = [
    ("hot-loop", True, True, "hot_loop"),
    ("native-spin", False, True, "native_spin"),
    ("native-spin-gil", True, True, "native_spin"),
    ("regex", True, True, "regex"),
    ("native-sleep", False, False, "native_sleep"),
]


@pytest.mark.parametrize("shape, owns_gil, active, function", EXPECTED)
def test_each_recorded_sample_shows_the_shapes_gil_and_activity(shape, owns_gil, active, function):
    for dump in RECORDED[shape]:
        sample = stacks.parse_sample(json.dumps(dump))
        assert (sample["owns_gil"], sample["active"], sample["frames"][0][0]) == (owns_gil, active, function)
        assert sample["locals"] is None  # dumped without --locals


def recorded_runner(shape):
    dumps = list(RECORDED[shape])

    def runner(argv, timeout):
        return 0, json.dumps(dumps.pop(0)), ""
    return runner


def fake_py_spy(tmp_path):
    path = tmp_path / "py-spy"
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return str(path)


@pytest.mark.parametrize("shape, gil_active", [("hot-loop", 3), ("native-spin", 0), ("regex", 3), ("native-sleep", 0)])
def test_three_samples_in_one_read_count_gil_and_see_the_line_stay(tmp_path, shape, gil_active):
    slept = []
    reader = stacks.StackReader(fake_py_spy(tmp_path), runner=recorded_runner(shape), proc_root=str(tmp_path),
                                sleep=slept.append)
    result = reader.read({9: {"cmdline": "python3 shapes.py", "comm": "python3", "state": "R", "own_ticks": 5}},
                         samples=3)
    (entry,) = result["processes"]
    assert entry["samples"] == 3 and entry["gil_active_samples"] == gil_active
    assert entry["line_moved"] is False  # one hot line, or one C call: the innermost line stays
    assert entry["locals_moved"] is None  # no --locals asked
    assert slept == [stacks.SAMPLE_SPACING] * 2


def test_one_sample_says_nothing_about_movement(tmp_path):
    reader = stacks.StackReader(fake_py_spy(tmp_path), runner=recorded_runner("native-spin"), proc_root=str(tmp_path))
    (entry,) = reader.read({9: {"cmdline": "python3 x.py", "comm": "python3", "state": "R"}})["processes"]
    assert (entry["samples"], entry["owns_gil"], entry["active"], entry["line_moved"]) == (1, False, True, None)


def test_a_moved_line_and_changed_locals_are_seen():
    first = json.loads(json.dumps(RECORDED["hot-loop"][0]))
    second = json.loads(json.dumps(first))
    second[0]["frames"][0]["line"] += 1
    samples = [stacks.parse_sample(json.dumps(first)), stacks.parse_sample(json.dumps(second))]
    assert stacks.combine_samples(samples)["line_moved"] is True
    for dump, value in ((first, "657364"), (second, "965896")):
        dump[0]["frames"][0]["locals"] = [{"name": "x", "addr": 1, "arg": False, "repr": value}]
    samples = [stacks.parse_sample(json.dumps(first)), stacks.parse_sample(json.dumps(first)),
               stacks.parse_sample(json.dumps(second))]
    combined = stacks.combine_samples(samples)
    assert combined["locals_moved"] is True and "657364" not in json.dumps(samples)  # digests, never values
    assert stacks.combine_samples(samples[:2])["locals_moved"] is False


PY_SPY = stacks.find_py_spy("auto", {1: {"cmdline": sys.executable + " x"}})[0] or shutil.which("py-spy")


@pytest.mark.skipif(PY_SPY is None, reason="py-spy is not installed here")
def test_live_shapes_side_by_side():
    started = {}
    try:
        for shape, _gil, _active, _function in EXPECTED:
            proc = subprocess.Popen([sys.executable, os.path.join(HERE, "shapes.py"), shape],
                                    stdout=subprocess.PIPE, universal_newlines=True)
            started[proc.pid] = (shape, proc)
            assert proc.stdout.readline().strip() == "ready"
        processes = dict((pid, {"cmdline": "%s shapes.py %s" % (sys.executable, shape), "comm": "python3",
                                "state": "R", "own_ticks": 0}) for pid, (shape, _proc) in started.items())
        result = stacks.StackReader(PY_SPY).read(processes, samples=3, local_values=True)
        if result["unavailable"]:
            pytest.skip(result["unavailable"])
        seen = dict((started[entry["pid"]][0], entry) for entry in result["processes"])
        for shape, owns_gil, active, function in EXPECTED:
            entry = seen[shape]
            assert entry["frames"][0][0] == function and entry["samples"] == 3
            assert entry["gil_active_samples"] == (3 if owns_gil and active else 0), (shape, entry)
            assert entry["active"] is active
            # A native call holds its Python frame on the calling line; the hot loop's frame moves
            # between `while` and its body as the samples fall.
            assert entry["line_moved"] is False or shape == "hot-loop", (shape, entry)
        # What tells the hot loop from a C call that keeps the GIL: its locals change.
        assert seen["hot-loop"]["locals_moved"] is True
        assert [seen[shape]["locals_moved"] for shape in ("native-spin-gil", "regex", "native-spin")] == [False] * 3
    finally:
        for _shape, proc in started.values():
            proc.kill()
            proc.wait()
