"""`make bench`'s containers step: the time a container start adds (issue #33).

One systemd test host (tools/testhosts) with both Podman and Docker from Debian's packages
(tools/guest_runtime.py) serves the same simulated engine three ways, one catalog
entry each with the same model size and the same simulator arguments, own unit and port: the venv unit,
`runtime: podman` and `runtime: docker`, deployed by deploy-k26.yml one entry after the other (each image
loaded from its archive by inference_env, as on an air-gapped host). Then bench/container_probe.py, on the
host, starts and stops each unit ROUNDS times, one unit at a time, the runtimes interleaved, and reads from
systemd and the journal

- the engine's first output line (its `server_args=` line, printed as soon as its Python runs): what the
  runtime itself costs before the engine runs (the container's creation, its root filesystem, namespaces);
- the unit active: ready, a completion answered (the launcher's READY=1);
- the stop: `systemctl stop` to the launcher's engine ended (the engine, or `podman run` / `docker run`), and
  to inactive (after the unit's cleanup: a container's removal), and whether a container or an engine
  process was left;
- and, last, each image's `create` and `rm` alone: how much of a start is the container's creation.

The difference of each median to the venv's is the time a container start adds. The pure parts (the
summary, the image load's time from the deploy's events) are tested in tests/unit/test_bench_containers.py;
the measurement runs only in `make bench`.
"""
import json
import os
import shlex
import subprocess
import tempfile
import time

from bench import disk
from modelwake_runner.cli import run_playbook
from tests.helpers import container_guest
from tests.helpers.guesthost import guest_sh, guest_vars, host_tool
from tools import guest_runtime

HERE = os.path.dirname(os.path.abspath(__file__))
GUEST = "bench-ctr"
ROUNDS = 5
CREATES = 3  # each image's `create` alone, after the rounds
RUNTIMES = ("venv", "podman", "docker")
# One catalog entry per runtime: the same engine, model size and arguments; their own unit, port and model
# directory (made alike by playbooks/demo-model.yml).
ENTRIES = {"venv": ("bench-venv", "sglang-bvenv", 30031), "podman": ("bench-pod", "sglang-bpod", 30032),
           "docker": ("bench-dock", "sglang-bdock", 30033)}
# The simulator's start of a few seconds (container_guest.FAST) without its first pause, so that its first
# line marks the engine's own Python running.
SIM_ARGS = ["--disable-cuda-graph", "--load-rate-mib", "16", "--start-seconds", "0", "--init-seconds", "2",
            "--warmup-seconds", "1"]
MARKER = "server_args="  # SGLang's first line, which the simulator prints first too
LOAD_TASK = "Load the image from its archive"
COPY_TASK = "Copy the image archive to the host"
METRICS = ("first_line_s", "active_s", "stop_engine_s", "stop_s")


def entry(runtime):
    model, unit, port = ENTRIES[runtime]
    return {"engine": "sglang", "engine_package": "modelwake-sim", "engine_version": "0.1.0", "unit": unit,
            "port": port, "model_path": "/srv/models/%s-sim" % model, "tp": 1, "extra_args": SIM_ARGS,
            "ready_timeout": 300, "stall_timeout": 60, "runtime": runtime}


def task_seconds(objects, task):
    """Seconds from the first `task_start` to its `task_end` of `task` among a play's objects stamped with
    their arrival (`at`, monotonic s): the task's time as the controller saw it, or None if it did not run."""
    started = None
    for obj in objects:
        if obj.get("task") != task:
            continue
        if obj["event"] == "task_start" and started is None:
            started = obj["at"]
        elif obj["event"] == "task_end" and started is not None:
            if obj.get("status") == "skipped":
                return None
            return round(obj["at"] - started, 1)
    return None


def _spread(values):
    values = [v for v in values if v is not None]
    middle = disk.median(values)
    return {"median": None if middle is None else round(middle, 2), "min": min(values) if values else None,
            "max": max(values) if values else None, "values": values}


def summarise(trials, creates=None):
    """Per runtime: each metric's median, min, max and values; and each median's difference to the venv's
    ({"runtimes": {runtime: {metric: {...}}}, "added": {runtime: {metric: s}}, "left": [...], "creates": {...}}).
    `creates`: the probe's {runtime: {"create_s": [...], "remove_s": [...]}}, summarised alike.
    `left`: the trials whose stop left a container or an engine process, or whose start did not end active."""
    runtimes = {}
    for runtime in [r for r in RUNTIMES if any(t["runtime"] == r for t in trials)]:
        mine = [t for t in trials if t["runtime"] == runtime]
        # A start that did not end active has no time to ready, and its stop stopped nothing: neither counts.
        ran = [t for t in mine if t["start"]["state"] == "active"]
        runtimes[runtime] = {"first_line_s": _spread([t["start"]["first_line_s"] for t in ran]),
                             "active_s": _spread([t["start"]["active_s"] for t in ran]),
                             "stop_engine_s": _spread([t["stop"].get("engine_ended_s") for t in ran]),
                             "stop_s": _spread([t["stop"]["inactive_s"] for t in ran]),
                             "trials": len(mine)}
    added = {}
    venv = runtimes.get("venv")
    for runtime, figures in runtimes.items():
        if runtime == "venv" or not venv:
            continue
        added[runtime] = dict((metric, None if figures[metric]["median"] is None or venv[metric]["median"] is None
                               else round(figures[metric]["median"] - venv[metric]["median"], 2))
                              for metric in METRICS)
    left = ["%s round %d: %s" % (t["runtime"], t["round"], "; ".join(
        part for part in ("start ended %s" % t["start"]["state"] if t["start"]["state"] != "active" else "",
                          "containers left %s" % t["stop"]["containers_left"] if t["stop"]["containers_left"] else "",
                          "engine processes left %s" % t["stop"]["engines_left"] if t["stop"]["engines_left"] else "")
        if part)) for t in trials
        if t["start"]["state"] != "active" or t["stop"]["containers_left"] or t["stop"]["engines_left"]]
    creates = dict((runtime, {"create_s": _spread(times["create_s"]), "remove_s": _spread(times["remove_s"])})
                   for runtime, times in (creates or {}).items())
    return {"runtimes": runtimes, "added": added, "left": left, "creates": creates}


def _play(inventory, playbook, extra=None):
    """A playbook of the repository on the guest; (rc, text, objects stamped with their arrival `at`)."""
    objects = []
    private = tempfile.mkdtemp(prefix="bench-ctr-play-")
    runner, _events = run_playbook(playbook, private, [inventory], extra, timeout=900,
                                   on_object=lambda obj: objects.append(dict(obj, at=time.monotonic())))
    return runner.rc, runner.stdout.read(), objects


def _write_inventory(path, guest, images):
    """The guest's inventory: the three entries (the containers' with their image and archive), as
    ContainerGuest.deployed writes one."""
    models = {}
    for runtime in RUNTIMES:
        item = entry(runtime)
        if runtime in images:
            item.update(image_id=images[runtime]["id"], image_archive=images[runtime]["archive"],
                        container_command=container_guest.SIM_CONTAINER_COMMAND)
        models[ENTRIES[runtime][0]] = item
    variables = dict(guest_vars(host_tool("key")), **{
        "modelwake_host_models": [ENTRIES[runtime][0] for runtime in RUNTIMES], "modelwake_models": models,
        "modelwake_gpus_required": False, "modelwake_demo_model_size_mib": 64, "modelwake_demo_model_shards": 8,
        "model_service_poll_interval": 1,
        # Every round starts each unit again: more starts than the usual crash-loop limit (5 in 600 s) allows.
        "model_service_start_limit_burst": 100,
        # The guests' cgroup v1 controllers are read-only: Podman keeps the container in the unit's own cgroup.
        "model_service_container_cgroups": "disabled"})
    with open(path, "w") as handle:
        json.dump({"all": {"children": {"model_hosts": {"hosts": {guest: {"ansible_host": host_tool("addr", guest)}}}},
                           "vars": variables}}, handle)
    return path


def _tail(text):
    return (text or "")[-600:]


def measure(work, rounds=ROUNDS, guest=GUEST):
    result = {"status": "not measured", "guest": guest, "rounds": rounds, "sim_args": SIM_ARGS, "timings": {}}
    timings = result["timings"]
    started = time.monotonic()
    try:
        host_tool("up", guest)
        mark = time.monotonic()
        guest_runtime.install_podman(guest)
        guest_runtime.install_docker(guest)
        timings["install podman and docker"] = round(time.monotonic() - mark, 1)
        result["versions"] = {"podman": guest_sh(guest, "podman --version"),
                              "docker": guest_sh(guest, "docker version --format '{{.Server.Version}}'"),
                              "kernel": guest_sh(guest, "uname -r"),
                              "podman storage": guest_sh(guest, "podman info --format '{{.Store.GraphDriverName}}'"),
                              "docker storage": guest_sh(guest, "docker info --format '{{.Driver}}'")}
        inventory = _write_inventory(os.path.join(work, "containers-hosts.json"), guest, {})
        rc, text, _objects = _play(inventory, "playbooks/demo-model.yml")
        if rc != 0:
            result["why"] = "playbooks/demo-model.yml failed: %s" % _tail(text)
            return result
        images = {}
        for runtime in ("podman", "docker"):
            mark = time.monotonic()
            archive, image_id = guest_runtime.sim_image(guest, runtime)
            timings["%s image (built or cached)" % runtime] = round(time.monotonic() - mark, 1)
            images[runtime] = {"archive": archive, "id": image_id, "archive_bytes": os.path.getsize(archive)}
        _write_inventory(inventory, guest, images)
        result["deploys"] = {}
        for runtime in RUNTIMES:
            mark = time.monotonic()
            rc, text, objects = _play(inventory, "deploy-k26.yml", {"modelwake_deploy_model": ENTRIES[runtime][0]})
            result["deploys"][runtime] = {"rc": rc, "wall_s": round(time.monotonic() - mark, 1),
                                          "copy_s": task_seconds(objects, COPY_TASK),
                                          "load_s": task_seconds(objects, LOAD_TASK)}
            if rc != 0:
                result["why"] = "deploy-k26.yml of the %s entry failed: %s" % (runtime, _tail(text))
                return result
        for runtime in images:
            images[runtime]["bytes"] = int(guest_sh(guest, "%s image inspect --format '{{.Size}}' %s"
                                                    % (runtime, images[runtime]["id"])))
        result["images"] = images
        spec = {"rounds": rounds, "marker": MARKER, "creates": CREATES,
                "units": [{"runtime": runtime, "unit": ENTRIES[runtime][1],
                           "image": images[runtime]["id"] if runtime in images else "",
                           "container": container_guest.ContainerGuest(guest, ENTRIES[runtime][0], ENTRIES[runtime][1],
                                                                       runtime, ENTRIES[runtime][2]).container}
                          for runtime in RUNTIMES]}
        with open(os.path.join(HERE, "container_probe.py")) as handle:
            probe = handle.read()
        mark = time.monotonic()
        out = guest_sh(guest, "python3 - %s" % shlex.quote(json.dumps(spec)), stdin=probe,
                       timeout=rounds * len(RUNTIMES) * 240)
        timings["the starts and stops"] = round(time.monotonic() - mark, 1)
        result["load_average"] = guest_sh(guest, "cat /proc/loadavg").split()[:3]
        probed = json.loads(out.splitlines()[-1])
        result["trials"] = probed["trials"]
        result["summary"] = summarise(result["trials"], probed.get("creates"))
        result["status"] = "measured"
        result["date"] = time.strftime("%Y-%m-%d", time.gmtime())
        return result
    except (AssertionError, OSError, ValueError, subprocess.SubprocessError) as exc:
        result["why"] = str(exc)[-600:]
        return result
    finally:
        host_tool("down", guest, check=False)
        timings["total"] = round(time.monotonic() - started, 1)
