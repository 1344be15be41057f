#!/usr/bin/python3
"""Run ON a test host by bench/containers.py (`python3 - SPEC` over SSH): starts and stops the same simulated
engine's units, one at a time, and reads from systemd and the journal when each start and stop happened.

SPEC is JSON: {"rounds": N, "marker": "<the engine's first line>", "creates": M,
"units": [{"runtime", "unit", "container", "image" (a container's)}]}.
Every unit is stopped first; then N rounds, each unit in turn (interleaved, so that a busy minute of the
machine falls on every runtime alike): `systemctl start --no-block`, until the new run is no longer
activating, then `systemctl stop` (and when the launcher saw the process it started end: the rest of the
stop is the unit's cleanup, a container's removal included). Last, M times each image's `create` and `rm`
alone, without the unit: how much of a start is the container's creation. All times are CLOCK_MONOTONIC,
the clock of systemd's *TimestampMonotonic properties and of the journal's __MONOTONIC_TIMESTAMP, in
seconds from the command. Prints one JSON object: {"trials": [...], "creates": {runtime: ...}}.
Standard library only (the host's own Python).
"""
import json
import subprocess
import sys
import time

START_TIMEOUT = 300
# The launcher's line when the process it started (the engine, or `podman run` / `docker run`) has ended.
ENGINE_STOPPED = "modelwake: engine stopped"


def sh(*argv):
    return subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True).stdout


def show(unit, *properties):
    out = sh("systemctl", "show", unit, *["--property=" + name for name in properties])
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def since(props, name, t0_us):
    """A *TimestampMonotonic property in seconds after t0 (µs), or None when systemd has none (0)."""
    value = int(props.get(name) or 0)
    return round((value - t0_us) / 1e6, 3) if value else None


def first_line(journal_json, marker, t0_us):
    """The monotonic time (µs) of the first journal entry after t0 whose message holds `marker`, or None.
    journal_json: `journalctl -o json` output, one entry per line."""
    for line in journal_json.splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        message = entry.get("MESSAGE")
        if isinstance(message, list):  # journald gives a message that is not UTF-8 as its bytes
            message = bytes(message).decode("utf-8", "replace")
        stamp = int(entry.get("__MONOTONIC_TIMESTAMP") or 0)
        if stamp >= t0_us and marker in (message or ""):
            return stamp
    return None


def monotonic_us():
    return int(time.clock_gettime(time.CLOCK_MONOTONIC) * 1e6)


def containers(runtime):
    if runtime == "venv":
        return []
    return sh(runtime, "ps", "--all", "--format", "{{.Names}}").split()


def start(unit, marker):
    before = show(unit, "InvocationID")["InvocationID"]
    t0 = monotonic_us()
    sh("systemctl", "start", "--no-block", unit)
    deadline = time.monotonic() + START_TIMEOUT
    state = {}
    while time.monotonic() < deadline:
        state = show(unit, "InvocationID", "ActiveState")
        if state["InvocationID"] not in ("", before) and state["ActiveState"] != "activating":
            break
        time.sleep(0.2)
    props = show(unit, "ActiveState", "InvocationID", "InactiveExitTimestampMonotonic",
                 "ExecMainStartTimestampMonotonic", "ActiveEnterTimestampMonotonic")
    journal = sh("journalctl", "-u", unit, "-o", "json", "--output-fields=MESSAGE")
    line = first_line(journal, marker, t0)
    return {"state": props["ActiveState"], "main_start_s": since(props, "ExecMainStartTimestampMonotonic", t0),
            "first_line_s": None if line is None else round((line - t0) / 1e6, 3),
            "active_s": since(props, "ActiveEnterTimestampMonotonic", t0) if props["ActiveState"] == "active" else None}


def stop(unit, runtime, container):
    t0 = monotonic_us()
    sh("systemctl", "stop", unit)
    returned = round((monotonic_us() - t0) / 1e6, 3)
    props = show(unit, "ActiveState", "InactiveEnterTimestampMonotonic")
    ended = first_line(sh("journalctl", "-u", unit, "-o", "json", "--output-fields=MESSAGE"), ENGINE_STOPPED, t0)
    return {"state": props["ActiveState"], "returned_s": returned,
            "engine_ended_s": None if ended is None else round((ended - t0) / 1e6, 3),
            "inactive_s": since(props, "InactiveEnterTimestampMonotonic", t0),
            "containers_left": [name for name in containers(runtime) if name == container],
            "engines_left": sh("pgrep", "-f", "modelwake_sim serve").split()}


def create_times(runtime, image, count):
    """`podman|docker create` of the image (as the unit's run creates its container: the image's root filesystem
    set up for it, vfs's copy on a test host) and its removal, `count` times: {"create_s": [...], "remove_s": [...]}."""
    name = "modelwake-bench-create"
    options = ["--network=host"] + (["--pull=never", "--cgroups=disabled"] if runtime == "podman" else [])
    times = {"create_s": [], "remove_s": []}
    for _ in range(count):
        t0 = time.monotonic()
        sh(runtime, "create", "--name", name, *(options + [image, "true"]))
        t1 = time.monotonic()
        sh(runtime, "rm", "--force", name)
        times["create_s"].append(round(t1 - t0, 3))
        times["remove_s"].append(round(time.monotonic() - t1, 3))
    return times


def main(spec):
    for unit in spec["units"]:
        sh("systemctl", "stop", unit["unit"])
    trials = []
    for number in range(1, spec["rounds"] + 1):
        for unit in spec["units"]:
            began = start(unit["unit"], spec["marker"])
            ended = stop(unit["unit"], unit["runtime"], unit["container"])
            trials.append({"runtime": unit["runtime"], "round": number, "start": began, "stop": ended})
    creates = dict((unit["runtime"], create_times(unit["runtime"], unit["image"], spec.get("creates", 3)))
                   for unit in spec["units"] if unit.get("image"))
    return {"trials": trials, "creates": creates}


if __name__ == "__main__":
    print(json.dumps(main(json.loads(sys.argv[1]))))
