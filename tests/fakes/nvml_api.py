"""NVML's calls as plugins/module_utils/host/nvml.Nvml exposes them, faked in Python, for unit
tests of what is built on them (the probe, the preflight's holders): pass it as the `nvml`
argument of GpuReader and describe the GPUs with `configure()`. Values are in bytes like NVML's.

The binding itself is tested through ctypes against tests/fakes/fake_nvml.c, a fake
libnvidia-ml.so.1 (tests/unit/test_gpu.py).
"""
import threading
import types

_STATE = {"devices": [], "init_error": None, "initialised": 0, "block": None}


class NVMLError(Exception):
    """Stands for nvml.NvmlError."""


def configure(devices=None, init_error=None, block=None):
    """devices: [{"uuid", "memory_used_mib", "memory_total_mib", "utilization" (None = Not
    Supported), "bus_id" ("00000000:41:00.0"), "processes": [{"pid", "used_mib" (None = not
    available)}]}]. block: the name of a call that never returns (a wedged driver)."""
    _STATE["devices"] = list(devices or [])
    _STATE["init_error"] = init_error
    _STATE["initialised"] = 0
    _STATE["block"] = block


def _block_if_asked(name):
    if _STATE["block"] == name:
        threading.Event().wait()  # for good, as a call into a wedged driver


def nvmlInit():
    _block_if_asked("nvmlInit")
    if _STATE["init_error"]:
        raise NVMLError(_STATE["init_error"])
    _STATE["initialised"] += 1


def nvmlShutdown():
    _STATE["initialised"] -= 1


def _check():
    if _STATE["initialised"] <= 0:
        raise NVMLError("Uninitialized")


def nvmlDeviceGetCount():
    _check()
    return len(_STATE["devices"])


def nvmlDeviceGetHandleByIndex(index):
    _check()
    if not 0 <= index < len(_STATE["devices"]):
        raise NVMLError("Invalid Argument")
    return _STATE["devices"][index]


def nvmlDeviceGetUUID(handle):
    return handle.get("uuid", "GPU-fake")


def nvmlDeviceGetMemoryInfo(handle):
    _block_if_asked("nvmlDeviceGetMemoryInfo")
    mib = 1024 * 1024
    used = handle["memory_used_mib"] * mib
    total = handle["memory_total_mib"] * mib
    return types.SimpleNamespace(used=used, total=total, free=total - used)


def nvmlDeviceGetUtilizationRates(handle):
    if handle.get("utilization") is None:
        raise NVMLError("Not Supported")
    return types.SimpleNamespace(gpu=handle["utilization"], memory=0)


def nvmlDeviceGetComputeRunningProcesses(handle):
    mib = 1024 * 1024
    return [types.SimpleNamespace(pid=p["pid"],
                                  usedGpuMemory=None if p.get("used_mib") is None else p["used_mib"] * mib)
            for p in handle.get("processes", [])]


def nvmlDeviceGetPciInfo(handle):
    _block_if_asked("nvmlDeviceGetPciInfo")
    index = _STATE["devices"].index(handle)
    domain, bus, device = handle.get("bus_id", "00000000:%02X:00.0" % (0x18 + index)).split(".")[0].split(":")
    return types.SimpleNamespace(domain=int(domain, 16), bus=int(bus, 16), device=int(device, 16))
# The GPU health preflight's calls: a device is healthy unless its dict says otherwise
# ("persistence_mode": False; "remapped_rows": None for a GPU before Ampere, or {"correctable",
# "uncorrectable", "pending", "failure"}; "fabric": {"state": 1..3, "status"}, absent: no fabric).
_SYSTEM = {"driver_version": "580.95.05", "cuda_driver_version": 13000}


class NVMLNotSupported(NVMLError):
    """NVML_ERROR_NOT_SUPPORTED, with its code as nvml.NvmlError carries it."""
    code = 3

    def __init__(self):
        super().__init__("Not Supported")


def configure_system(driver_version="580.95.05", cuda_driver_version=13000):
    _SYSTEM.update(driver_version=driver_version, cuda_driver_version=cuda_driver_version)


def nvmlSystemGetDriverVersion():
    _check()
    return _SYSTEM["driver_version"]


def nvmlSystemGetCudaDriverVersion():
    _check()
    return _SYSTEM["cuda_driver_version"]


def nvmlDeviceGetPersistenceMode(handle):
    return handle.get("persistence_mode", True)


def nvmlDeviceGetRemappedRows(handle):
    rows = handle.get("remapped_rows", {})
    if rows is None:
        raise NVMLNotSupported()
    return types.SimpleNamespace(corrRows=rows.get("correctable", 0), uncRows=rows.get("uncorrectable", 0),
                                 isPending=rows.get("pending", False), failureOccurred=rows.get("failure", False))


def nvmlDeviceGetGpuFabricInfo(handle):
    fabric = handle.get("fabric")
    if fabric is None:
        raise NVMLNotSupported()
    return types.SimpleNamespace(state=fabric["state"], status=fabric.get("status", 0))
