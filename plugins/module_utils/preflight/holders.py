"""Who holds the GPUs a deployment needs, and what may be done about it (the GPU preflight).

The GPU picture comes from gpu.GpuReader (NVML or nvidia-smi) and process details from
procfs.read_process; this file adds what the preflight needs on top: the owner of a PID, the
systemd unit it belongs to (from /proc/<pid>/cgroup), and a pure `plan()` that sorts holders into
the service's own processes, processes of units that may be stopped, and foreign processes.

A process is only ever attributed to a unit through its cgroup, or, in a container one of our units
started, through the container's `modelwake.unit` label: Docker's containers are containerd's, outside
the unit's cgroup (their cgroup names docker-<id>.scope), and without the label a running Docker
service's own engine would count as foreign at its re-run. The label is set by the unit's own `docker
run` / `podman run`, and the unit removes its container at every start and stop, so the unit stops what
the label names. A holder whose unit is not the service's and not in the stop list is foreign, and the
preflight fails rather than touch it. A holder in a container is named by its container too
(containers.py), beside its host PID.
"""
import os
import pwd

from ..common.units import MIB
from ..host import procfs
from ..host.gpu import GpuReader
from . import containers as container_names
from ..host.procfs import unit_from_cgroup  # the one reading of a cgroup's unit, shared with the launcher

OWN = "own"
STOPPABLE = "stoppable"
FOREIGN = "foreign"


def unit_name(name):
    """'sglang-k26' and 'sglang-k26.service' name the same unit."""
    return name if "." in name else name + ".service"


def process_owner(pid, proc_root="/proc"):
    """(user name, unit) of a pid; (None, None) for what cannot be read."""
    base = os.path.join(proc_root, str(pid))
    user = None
    try:
        with open(os.path.join(base, "status")) as handle:
            for line in handle:
                if line.startswith("Uid:"):
                    uid = int(line.split()[1])
                    try:
                        user = pwd.getpwuid(uid).pw_name
                    except KeyError:
                        user = str(uid)
                    break
    except (OSError, ValueError):
        pass
    try:
        with open(os.path.join(base, "cgroup")) as handle:
            unit = unit_from_cgroup(handle.read())
    except OSError:
        unit = None
    return user, unit


def read_holders(reader, proc_root="/proc", list_containers=container_names.runtime_containers):
    """[{pid, user, unit, cmdline, container, label, gpus: {index: mib or None}}] from the reader's
    compute processes (container: {id, name} or None; label: the PID, and the container it runs in)."""
    by_pid = {}
    for proc in reader.compute_processes():
        holder = by_pid.get(proc["pid"])
        if holder is None:
            info = procfs.read_process(proc["pid"], proc_root)
            user, unit = process_owner(proc["pid"], proc_root)
            holder = {
                "pid": proc["pid"],
                "user": user,
                "unit": unit,
                "cmdline": (info["cmdline"] or info["comm"]) if info else "",
                "gpus": {},
            }
            by_pid[proc["pid"]] = holder
        holder["gpus"][proc["index"]] = proc["used_memory_mib"]
    holders = container_names.attach_containers([by_pid[pid] for pid in sorted(by_pid)], proc_root, list_containers)
    for holder in holders:
        started_by = (holder.get("container") or {}).get("unit")
        if started_by:
            holder["unit"] = unit_name(started_by)
        holder["label"] = holder_label(holder)
    return holders


def holder_label(holder):
    """'1234', or '1234 in container NAME (SHORT ID)' for a holder in a container (NVML's host PID)."""
    where = container_names.describe(holder.get("container"))
    return "%s in %s" % (holder["pid"], where) if where else str(holder["pid"])


def _mib(value):
    return "?" if value is None else str(value)


def plan(gpus, holders, needed=None, service_unit=None, stop_units=(), max_foreign_mib=1024,
         min_free_mib=0, model_bytes=0):
    """Decide what the preflight does. Pure: takes what read() and read_holders() returned.

    needed: GPU indices the deployment uses (None or empty: every GPU found).
    Per needed GPU, memory held by processes outside service_unit counts as foreign. Holders of
    units in stop_units are `stoppable`; the rest are `foreign`. A GPU blocks when its foreign
    memory (unknown counts as too much) exceeds max_foreign_mib. Units to stop are those of
    stoppable holders on needed GPUs. A GPU is short when, once the service's own and the
    stoppable holders are gone, less than min_free_mib would be free; with min_free_mib 0 the
    need is the weights' even share per needed GPU (model_bytes / GPUs: a lower bound, since
    KV cache and activations come on top).
    """
    own_unit = unit_name(service_unit) if service_unit else None
    stoppable_units = set(unit_name(u) for u in stop_units)
    present = dict((gpu["index"], gpu) for gpu in gpus)
    wanted = sorted(needed) if needed else sorted(present)
    missing = [index for index in wanted if index not in present]
    result_holders = []
    to_stop = set()
    foreign_mib = dict((index, 0) for index in wanted)
    unknown = set()
    freed_mib = dict((index, 0) for index in wanted)
    for holder in holders:
        on_needed = dict((i, m) for i, m in holder["gpus"].items() if i in foreign_mib)
        if not on_needed:
            continue
        if own_unit is not None and holder["unit"] == own_unit:
            verdict = OWN
        elif holder["unit"] in stoppable_units:
            verdict = STOPPABLE
            to_stop.add(holder["unit"])
        else:
            verdict = FOREIGN
        for index, mib in on_needed.items():
            if verdict == FOREIGN:
                if mib is None:
                    unknown.add(index)
                else:
                    foreign_mib[index] += mib
            else:
                freed_mib[index] += mib or 0
        result_holders.append(dict(holder, verdict=verdict))
    blocking_gpus = sorted(i for i in wanted if i in unknown or foreign_mib[i] > max_foreign_mib)
    blocking = [h for h in result_holders if h["verdict"] == FOREIGN
                and any(i in blocking_gpus for i in h["gpus"])]
    short = []
    if not min_free_mib and model_bytes and wanted:
        min_free_mib = -(-model_bytes // (MIB * len(wanted)))
    if min_free_mib:
        for index in wanted:
            gpu = present.get(index)
            if gpu is None:
                continue
            free = gpu.get("memory_free_mib")
            if free is None and None not in (gpu.get("memory_total_mib"), gpu.get("memory_used_mib")):
                free = gpu["memory_total_mib"] - gpu["memory_used_mib"]  # a reader without the driver's own figure
            if free is None:
                continue
            free += freed_mib[index]
            if free < min_free_mib:
                short.append({"index": index, "free_mib": free, "needed_mib": min_free_mib})
    return {
        "needed": wanted,
        "missing_gpus": missing,
        "holders": result_holders,
        "blocking_gpus": blocking_gpus,
        "blocking": blocking,
        "stop_units": sorted(to_stop),
        "short_gpus": short,
        "min_free_mib": min_free_mib,
    }


def holder_table(holders):
    """Fixed-width lines: PID, user, unit, verdict, memory per GPU, command line (after the container
    it runs in, if any)."""
    rows = [("PID", "USER", "UNIT", "VERDICT", "GPU MEMORY (MiB)", "COMMAND")]
    for h in holders:
        memory = " ".join("%s:%s" % (i, _mib(m)) for i, m in sorted(h["gpus"].items()))
        rows.append((str(h["pid"]), h["user"] or "?", h["unit"] or "-", h.get("verdict", ""),
                     memory, _in_container(h) + (h["cmdline"] or "")[:120]))
    widths = [max(len(row[col]) for row in rows) for col in range(5)]
    return ["  ".join(row[col].ljust(widths[col]) for col in range(5)) + "  " + row[5] for row in rows]


def _in_container(holder):
    where = container_names.describe(holder.get("container"))
    return "[%s] " % where if where else ""


def gpu_table(gpus):
    lines = ["GPU  USED/TOTAL (MiB)"]
    for gpu in gpus:
        lines.append("%-3d  %s/%s" % (gpu["index"], _mib(gpu["memory_used_mib"]), _mib(gpu["memory_total_mib"])))
    return lines


def survey(needed=None, service_unit=None, stop_units=(), max_foreign_mib=1024, min_free_mib=0,
           model_bytes=0, reader=None, proc_root="/proc", list_containers=container_names.runtime_containers):
    """Read the GPUs and their holders and plan; returns plan() plus backend, gpus and tables."""
    reader = reader or GpuReader(gpus=None)
    gpus = reader.read()
    holders = read_holders(reader, proc_root, list_containers) if gpus else []
    result = plan(gpus, holders, needed, service_unit, stop_units, max_foreign_mib, min_free_mib, model_bytes)
    result.update({
        "backend": reader.backend,
        "backend_error": reader.error,
        "gpus": gpus,
        "gpu_table": gpu_table(gpus),
        "holder_table": holder_table(result["holders"]),
        "blocking_table": holder_table(result["blocking"]),
    })
    return result
