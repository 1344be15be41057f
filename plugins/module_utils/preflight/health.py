"""The GPU health preflight's judgement: which of host/gpu_health.read_health()'s answers refuse a
deployment, each with the GPU and the fix named, and the CUDA version the engine's torch was built for.

Pure except for torch_cuda_build(), which reads one file of the engine's venv. A check turned off by
the role (the `require` flags) still reports what it found, as a waived problem that refuses nothing.
"""
import glob
import os
import re

PERSISTENCE = "persistence"
FABRIC_MANAGER = "fabric_manager"
REMAPPED_ROWS = "remapped_rows"
DRIVER_FOR_CUDA = "driver_for_cuda"
CHECKS = (PERSISTENCE, FABRIC_MANAGER, REMAPPED_ROWS, DRIVER_FOR_CUDA)

# The oldest Linux x86_64 driver of each CUDA release: NVIDIA's CUDA Toolkit Release Notes, table
# "CUDA Toolkit and Corresponding Driver Versions" (docs.nvidia.com/cuda/cuda-toolkit-release-notes,
# the GA row of each release). A driver supports the CUDA versions up to the one nvidia-smi prints;
# this table only names the driver to upgrade to.
MIN_DRIVER_FOR_CUDA = {
    (11, 8): "520.61.05",
    (12, 0): "525.60.13",
    (12, 1): "530.30.02",
    (12, 2): "535.54.03",
    (12, 3): "545.23.06",
    (12, 4): "550.54.14",
    (12, 5): "555.42.02",
    (12, 6): "560.28.03",
    (12, 8): "570.26",
    (12, 9): "575.51.03",
    (13, 0): "580.65.06",
}

# torch/version.py, as the wheels write it: `cuda = '12.8'` (older), `cuda: Optional[str] = '12.8'`
# (newer), None in CPU and ROCm builds.
TORCH_CUDA_LINE = re.compile(r"""^cuda\s*(?::[^=]*)?=\s*(?:['"]([^'"]*)['"]|None)\s*$""", re.MULTILINE)
TORCH_VERSION_LINE = re.compile(r"""^__version__\s*(?::[^=]*)?=\s*['"]([^'"]*)['"]""", re.MULTILINE)


def version_tuple(text):
    """'12.8' -> (12, 8), '570.124.06' -> (570, 124, 6); None for what is not a version."""
    if not text or not re.match(r"^\d+(\.\d+)*$", text.strip()):
        return None
    return tuple(int(part) for part in text.strip().split("."))


def torch_cuda_build(venv):
    """{torch_version, cuda, path, note}: the CUDA version the venv's torch was built for (None in
    a CPU build, without torch or without the venv; `note` says which)."""
    result = {"torch_version": None, "cuda": None, "path": None, "note": None}
    if not venv:
        result["note"] = "no engine venv given: the driver's CUDA version is not compared"
        return result
    found = sorted(glob.glob(os.path.join(venv, "lib", "python3*", "site-packages", "torch", "version.py")))
    if not found:
        result["note"] = ("no torch in %s (not installed yet, or an engine without it): the driver's CUDA version "
                          "is not compared" % venv)
        return result
    result["path"] = found[-1]
    try:
        with open(found[-1]) as handle:
            text = handle.read()
    except OSError as exc:
        result["note"] = "%s not read: %s" % (found[-1], exc)
        return result
    version = TORCH_VERSION_LINE.search(text)
    result["torch_version"] = version.group(1) if version else None
    cuda = TORCH_CUDA_LINE.search(text)
    result["cuda"] = cuda.group(1) if cuda and cuda.group(1) else None
    if result["cuda"] is None:
        result["note"] = "torch %s in %s is not a CUDA build: the driver's CUDA version is not compared" % (
            result["torch_version"] or "?", venv)
    return result


def minimum_driver(cuda):
    """The oldest driver for CUDA `cuda` ('12.8'), or None when the table has no such release."""
    wanted = version_tuple(cuda)
    return MIN_DRIVER_FOR_CUDA.get(wanted[:2]) if wanted and len(wanted) >= 2 else None


def _gpu_name(gpu):
    return "GPU %d (%s)" % (gpu["index"], gpu["uuid"]) if gpu.get("uuid") else "GPU %d" % gpu["index"]


def _persistence_problems(health):
    return [(PERSISTENCE, "%s has persistence mode off: enable it: nvidia-smi -pm 1 (until the next reboot) or "
                          "the nvidia-persistenced service (systemctl enable --now nvidia-persistenced); without it "
                          "the driver tears the GPU down between processes and every start and NVML read pays "
                          "its initialisation again." % _gpu_name(gpu))
            for gpu in health["gpus"] if gpu["persistence_mode"] is False]


def _remap_problems(health):
    found = []
    for gpu in health["gpus"]:
        rows = gpu["remapped_rows"]
        if rows is None:
            continue
        if rows["failure"]:
            found.append((REMAPPED_ROWS, "%s has a row-remapping failure (%d rows remapped for uncorrectable errors, "
                                         "%d for correctable ones): its memory has a fault it can no longer hide: "
                                         "drain the node and have the GPU replaced."
                          % (_gpu_name(gpu), rows["uncorrectable"], rows["correctable"])))
        elif rows["pending"]:
            found.append((REMAPPED_ROWS, "%s has a pending row remap: reset the GPU (nvidia-smi -r -i %d, with no "
                                         "process on it) or reboot to apply the pending remap."
                          % (_gpu_name(gpu), gpu["index"])))
    return found


def _fabric_manager_fix(health):
    driver = health.get("driver_version")
    return ("install and start nvidia-fabricmanager matching driver %s (the package of the same version, e.g. "
            "nvidia-fabricmanager-%s; systemctl enable --now nvidia-fabricmanager)"
            % (driver or "the installed driver", (driver or "<branch>").split(".")[0]))


def _fabric_problems(health):
    """From the GPUs' fabric registration when NVML reports it (Hopper and later); else, on a host
    with NVSwitches, from the fabric manager's unit."""
    found = []
    on_fabric = [gpu for gpu in health["gpus"] if gpu["fabric"] is not None]
    for gpu in on_fabric:
        state, status = gpu["fabric"]["state"], gpu["fabric"]["status"]
        if state == "not_started":
            found.append((FABRIC_MANAGER, "%s has not joined the NVSwitch fabric (fabric manager not running): %s; "
                                          "until then CUDA fails with error 802 (system not yet initialized)."
                          % (_gpu_name(gpu), _fabric_manager_fix(health))))
        elif state == "in_progress":
            found.append((FABRIC_MANAGER, "%s is still joining the NVSwitch fabric: wait for nvidia-fabricmanager to "
                                          "finish (journalctl -u nvidia-fabricmanager) and run again."
                          % _gpu_name(gpu)))
        elif state != "completed" or status != 0:
            found.append((FABRIC_MANAGER, "%s failed to join the NVSwitch fabric (state %s, NVML status %d): read "
                                          "journalctl -u nvidia-fabricmanager; %s."
                          % (_gpu_name(gpu), state, status, _fabric_manager_fix(health))))
    if on_fabric or not health["nvswitch_devices"]:
        return found
    unit = health["fabric_manager"]
    switches = "%d NVSwitches" % len(health["nvswitch_devices"])
    if unit is None:
        return found  # no systemctl to ask; noted by read_health
    if unit["load_state"] == "not-found":
        found.append((FABRIC_MANAGER, "This host has %s and no nvidia-fabricmanager.service: %s; without it CUDA "
                                      "fails with error 802 (system not yet initialized)."
                      % (switches, _fabric_manager_fix(health))))
    elif unit["active_state"] != "active":
        found.append((FABRIC_MANAGER, "This host has %s and nvidia-fabricmanager.service is %s: %s; without it CUDA "
                                      "fails with error 802 (system not yet initialized)."
                      % (switches, unit["active_state"], _fabric_manager_fix(health))))
    return found


def _driver_problems(health, torch):
    have, need = version_tuple(health.get("cuda_version")), version_tuple((torch or {}).get("cuda"))
    if have is None or need is None or have[:2] >= need[:2]:
        return []
    minimum = minimum_driver(torch["cuda"])
    return [(DRIVER_FOR_CUDA, "GPU driver %s supports CUDA %s, the engine's torch%s is built for CUDA %s: upgrade "
                              "the driver to >= %s (or install a torch built for cu%d%d)."
             % (health.get("driver_version") or "?", health["cuda_version"],
                " " + torch["torch_version"] if torch.get("torch_version") else "", torch["cuda"],
                minimum or "a release that supports CUDA %s" % torch["cuda"], have[0], have[1]))]


def judge(health, torch=None, require=None):
    """{problems, waived}: the messages of the checks that refuse (`require[check]` true, the
    default) and of those turned off. `torch` is torch_cuda_build()'s answer, or None."""
    require = dict((check, True) for check in CHECKS) if require is None else require
    found = (_persistence_problems(health) + _fabric_problems(health) + _remap_problems(health)
             + _driver_problems(health, torch))
    return {
        "problems": [message for check, message in found if require.get(check, True)],
        "waived": [message for check, message in found if not require.get(check, True)],
    }


def health_table(health, torch=None):
    """Readable lines: the driver, then one line per GPU."""
    lines = ["driver %s (CUDA %s)%s%s" % (
        health.get("driver_version") or "?", health.get("cuda_version") or "?",
        "; engine torch %s built for CUDA %s" % (torch.get("torch_version") or "?", torch["cuda"])
        if torch and torch.get("cuda") else "",
        "; %d NVSwitches, %s %s" % (len(health["nvswitch_devices"]), "nvidia-fabricmanager",
                                    (health["fabric_manager"] or {}).get("active_state", "not asked"))
        if health["nvswitch_devices"] else "")]
    for gpu in health["gpus"]:
        rows = gpu["remapped_rows"]
        lines.append("GPU %d  persistence %s  remapped rows %s%s" % (
            gpu["index"], {True: "on", False: "off", None: "?"}[gpu["persistence_mode"]],
            "n/a" if rows is None else "%d correctable, %d uncorrectable%s%s" % (
                rows["correctable"], rows["uncorrectable"], ", pending" if rows["pending"] else "",
                ", FAILURE" if rows["failure"] else ""),
            "  fabric %s" % gpu["fabric"]["state"] if gpu["fabric"] else ""))
    return lines
