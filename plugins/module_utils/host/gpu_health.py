"""The GPUs' health as the preflight reads it: persistence mode, row remapping, the driver and the
CUDA version it supports, and, on NVSwitch hosts, the fabric manager.

Why these: with persistence mode off the driver tears the GPUs down whenever no process holds them,
so every NVML open costs ~22 ms per device and a start pays the initialisation again
(getainode/ainode#238); without the fabric manager on an NVSwitch host CUDA fails with error 802
("system not yet initialized"); a row-remapping failure is an HBM fault the GPU can no longer hide,
and a pending remap only applies after a GPU reset; a driver older than the CUDA the engine's torch
was built for fails at the engine's first CUDA call. All of them look like a hung or crashed start
once the engine runs, and each has one fix an operator can apply before anything is changed.

NVML is read through the GpuReader's own session (host/gpu.py, host/nvml.py), so the reads share
its handles and its bounds; nvidia-smi answers where the library is missing. Each value is None
where the driver cannot tell, with the reason in `notes`.
"""
import os
import re

from .nvml import (ERROR_NOT_SUPPORTED, ERROR_FUNCTION_NOT_FOUND, FABRIC_STATE_COMPLETED, FABRIC_STATE_IN_PROGRESS,
                   FABRIC_STATE_NOT_STARTED, FABRIC_STATE_NOT_SUPPORTED)

FABRIC_STATES = {
    FABRIC_STATE_NOT_STARTED: "not_started",
    FABRIC_STATE_IN_PROGRESS: "in_progress",
    FABRIC_STATE_COMPLETED: "completed",
}
# The kernel module lists each NVSwitch it drives here (one entry per switch, named by PCI address);
# HGX A100/H100 baseboards have 6 or 4. Read under `root`, so tests give a directory of their own.
NVSWITCH_DEVICES_DIR = "proc/driver/nvidia-nvswitch/devices"
FABRIC_MANAGER_UNIT = "nvidia-fabricmanager.service"

SMI_HEALTH_QUERY = ["nvidia-smi", "--query-gpu=index,uuid,persistence_mode,driver_version",
                    "--format=csv,noheader,nounits"]
SMI_REMAP_QUERY = ["nvidia-smi", "--query-remapped-rows=gpu_uuid,remapped_rows.correctable,remapped_rows.uncorrectable,"
                   "remapped_rows.pending,remapped_rows.failure", "--format=csv,noheader,nounits"]
SMI_SUMMARY = ["nvidia-smi"]
SMI_TIMEOUT = 20


def cuda_version_text(value):
    """NVML's 12080 as '12.8'; None stays None."""
    if value is None:
        return None
    return "%d.%d" % (value // 1000, (value % 1000) // 10)


def nvswitch_devices(root="/"):
    """Names of the NVSwitches the kernel module drives (empty on a host without them)."""
    try:
        return sorted(os.listdir(os.path.join(root, NVSWITCH_DEVICES_DIR)))
    except OSError:
        return []


def fabric_manager_unit(runner):
    """{load_state, active_state} of nvidia-fabricmanager.service, or None without systemctl."""
    rc, out, _err = runner(["systemctl", "show", "--property=LoadState,ActiveState", FABRIC_MANAGER_UNIT],
                           SMI_TIMEOUT)
    if rc != 0:
        return None
    values = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    return {"load_state": values.get("LoadState", "unknown"), "active_state": values.get("ActiveState", "unknown")}


def _gpu_entry(index, uuid):
    return {"index": index, "uuid": uuid, "persistence_mode": None, "remapped_rows": None, "fabric": None,
            "notes": []}


def _read_nvml(nvml, devices):
    """(driver_version, cuda_version, gpus, notes) from an initialised NVML session."""
    notes = []
    try:
        driver = nvml.nvmlSystemGetDriverVersion()
    except Exception as exc:  # NvmlError, or a fake's own class
        driver = None
        notes.append("driver version not read: %s" % exc)
    try:
        cuda = cuda_version_text(nvml.nvmlSystemGetCudaDriverVersion())
    except Exception as exc:
        cuda = None
        notes.append("the driver's CUDA version not read: %s" % exc)
    gpus = []
    for index, handle, uuid in devices:
        gpu = _gpu_entry(index, uuid)
        try:
            gpu["persistence_mode"] = bool(nvml.nvmlDeviceGetPersistenceMode(handle))
        except Exception as exc:
            gpu["notes"].append("persistence mode not read: %s" % exc)
        try:
            rows = nvml.nvmlDeviceGetRemappedRows(handle)
            gpu["remapped_rows"] = {"correctable": int(rows.corrRows), "uncorrectable": int(rows.uncRows),
                                    "pending": bool(rows.isPending), "failure": bool(rows.failureOccurred)}
        except Exception as exc:
            if getattr(exc, "code", None) == ERROR_NOT_SUPPORTED:
                gpu["notes"].append("no row remapping on this GPU (before Ampere): not checked")
            else:
                gpu["notes"].append("remapped rows not read: %s" % exc)
        try:
            info = nvml.nvmlDeviceGetGpuFabricInfo(handle)
            if info.state != FABRIC_STATE_NOT_SUPPORTED:
                gpu["fabric"] = {"state": FABRIC_STATES.get(info.state, "unknown (%d)" % info.state),
                                 "status": int(info.status)}
        except Exception as exc:
            if getattr(exc, "code", None) not in (ERROR_NOT_SUPPORTED, ERROR_FUNCTION_NOT_FOUND):
                gpu["notes"].append("fabric state not read: %s" % exc)
        gpus.append(gpu)
    return driver, cuda, gpus, notes


def _smi_flag(text):
    """nvidia-smi's Enabled/Disabled, Yes/No, 1/0; None for [N/A] and the like."""
    text = text.strip().lower()
    if text in ("enabled", "yes", "1"):
        return True
    if text in ("disabled", "no", "0"):
        return False
    return None


def _smi_count(text):
    try:
        return int(text.strip())
    except ValueError:
        return None


def _read_smi(runner, watched):
    """(driver_version, cuda_version, gpus, notes) from nvidia-smi."""
    notes = []
    rc, out, err = runner(SMI_HEALTH_QUERY, SMI_TIMEOUT)
    if rc != 0:
        return None, None, [], ["nvidia-smi failed (rc %d): %s" % (rc, (err or out).strip()[:200])]
    driver = None
    gpus = []
    for line in out.splitlines():
        cols = [c.strip() for c in line.split(",")]
        if len(cols) < 4 or _smi_count(cols[0]) is None or not watched(_smi_count(cols[0])):
            continue
        gpu = _gpu_entry(_smi_count(cols[0]), cols[1])
        gpu["persistence_mode"] = _smi_flag(cols[2])
        if gpu["persistence_mode"] is None:
            gpu["notes"].append("persistence mode not read: nvidia-smi says %s" % cols[2])
        driver = cols[3]
        gpus.append(gpu)
    by_uuid = dict((gpu["uuid"], gpu) for gpu in gpus)
    rc, out, err = runner(SMI_REMAP_QUERY, SMI_TIMEOUT)
    if rc == 0:
        for line in out.splitlines():
            cols = [c.strip() for c in line.split(",")]
            if len(cols) < 5 or cols[0] not in by_uuid:
                continue
            values = [_smi_count(cols[1]), _smi_count(cols[2]), _smi_flag(cols[3]), _smi_flag(cols[4])]
            if None in values:  # [N/A]: a GPU before Ampere
                by_uuid[cols[0]]["notes"].append("no row remapping on this GPU (before Ampere): not checked")
                continue
            by_uuid[cols[0]]["remapped_rows"] = {"correctable": values[0], "uncorrectable": values[1],
                                                 "pending": values[2], "failure": values[3]}
    else:
        for gpu in gpus:
            gpu["notes"].append("remapped rows not read: nvidia-smi rc %d: %s" % (rc, (err or out).strip()[:120]))
    cuda = None
    rc, out, _err = runner(SMI_SUMMARY, SMI_TIMEOUT)
    match = re.search(r"CUDA Version:\s*(\d+\.\d+)", out) if rc == 0 else None
    if match:
        cuda = match.group(1)
    else:
        notes.append("the driver's CUDA version not read from nvidia-smi's summary")
    notes.append("fabric state not read without NVML: the fabric manager is judged from its unit")
    return driver, cuda, gpus, notes


def read_health(reader, root="/"):
    """The health of the reader's watched GPUs and of the host's driver and fabric:

    {backend, driver_version, cuda_version ("12.8"), gpus: [{index, uuid, persistence_mode,
     remapped_rows: {correctable, uncorrectable, pending, failure} or None, fabric: {state, status}
     or None, notes}], nvswitch_devices, fabric_manager: {load_state, active_state} or None, notes}

    `reader` is a host/gpu.GpuReader (its NVML session, or its runner for nvidia-smi); the fabric
    manager's unit is asked only on an NVSwitch host.
    """
    nvml, devices = reader.nvml_devices()
    if nvml is not None:
        driver, cuda, gpus, notes = _read_nvml(nvml, devices)
    elif reader.backend == "nvidia-smi":
        driver, cuda, gpus, notes = _read_smi(reader.runner, lambda index: reader.gpus is None or index in reader.gpus)
    else:
        driver, cuda, gpus, notes = None, None, [], []
    switches = nvswitch_devices(root)
    unit = fabric_manager_unit(reader.runner) if switches else None
    if switches and unit is None:
        notes.append("%s not read (no systemctl)" % FABRIC_MANAGER_UNIT)
    return {
        "backend": reader.backend,
        "driver_version": driver,
        "cuda_version": cuda,
        "gpus": gpus,
        "nvswitch_devices": switches,
        "fabric_manager": unit,
        "notes": notes,
    }
