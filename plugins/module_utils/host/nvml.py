"""NVML through ctypes: the driver's own libnvidia-ml.so.1, with nothing installed on the host.

Why not pynvml: Debian 12 has no package for it, and `nvidia-ml-py` would have to be installed on
every GPU host (or the module run in the engine's venv, tying the wait to the engine's Python).
The library itself ships with every NVIDIA driver, and the handful of calls a wait makes are a few
C functions with plain structs. This binding exposes those calls under NVML's own names, so a
reader of the NVML docs recognises them, and raises NvmlError with NVML's return code and text.

One Nvml object is one NVML session (init() ... shutdown()). The calls cost microseconds (a
fork of nvidia-smi 15 ms of CPU, on an H200); handles are cheap to keep, and GpuReader keeps them.

A call into the driver cannot be interrupted: a GPU with an uncorrectable ECC error has wedged NVML
so that every call hung (bradrlaw/ai-server PR #27). call_within() runs calls in a daemon thread and
waits a bounded time for them; a caller that gets NvmlTimeout must not call NVML again (the
thread stays blocked in the driver, and a next call would block behind the same fault).
"""
import ctypes
import threading

from ..common.errors import ModelWakeError

LIBRARY = "libnvidia-ml.so.1"

SUCCESS = 0
ERROR_NOT_SUPPORTED = 3
ERROR_INSUFFICIENT_SIZE = 7
ERROR_FUNCTION_NOT_FOUND = 13
ERROR_ARGUMENT_VERSION_MISMATCH = 25
# usedGpuMemory when the driver cannot tell (NVML_VALUE_NOT_AVAILABLE, as an unsigned long long).
VALUE_NOT_AVAILABLE = 2 ** 64 - 1
UUID_BUFFER_SIZE = 96  # NVML_DEVICE_UUID_V2_BUFFER_SIZE


class NvmlError(ModelWakeError):
    """An NVML call failed: `code` is its nvmlReturn_t (3: Not Supported, 9: Driver Not Loaded),
    None when the library itself did not load."""

    def __init__(self, function, code, text):
        self.function = function
        self.code = code
        super().__init__("%s: %s" % (function, text) if code is None else
                         "%s: %s (NVML error %d)" % (function, text, code))


class NvmlTimeout(NvmlError):
    """An NVML call did not return within its bound: the driver is wedged."""

    def __init__(self, function, seconds):
        self.seconds = seconds
        super().__init__(function, None, "did not answer in %g s" % seconds)


def call_within(seconds, function, *args):
    """function(*args) in a daemon thread, waited for `seconds` at most: its result, its exception,
    or NvmlTimeout. The thread of a call that does not return stays behind, blocked in the driver;
    being a daemon, it does not keep the process from exiting."""
    outcome = {}

    def run():
        try:
            outcome["value"] = function(*args)
        except BaseException as exc:  # handed to the caller, whatever it is
            outcome["error"] = exc

    worker = threading.Thread(target=run, name="modelwake-nvml", daemon=True)
    worker.start()
    worker.join(seconds)
    if worker.is_alive():
        raise NvmlTimeout(getattr(function, "__name__", "NVML"), seconds)
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")


class Memory(ctypes.Structure):
    """nvmlMemory_t: `used` counts the driver's reserved memory (about 615 MiB on an idle H200)."""
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


class MemoryV2(ctypes.Structure):
    """nvmlMemory_v2_t (drivers 510 and later): `used` without the reserved memory, as nvidia-smi
    shows it; `free` is what can still be allocated in both versions."""
    _fields_ = [("version", ctypes.c_uint), ("total", ctypes.c_ulonglong), ("reserved", ctypes.c_ulonglong),
                ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


MEMORY_V2_VERSION = ctypes.sizeof(MemoryV2) | (2 << 24)  # NVML_STRUCT_VERSION(Memory, 2): nvmlMemory_v2


class Utilization(ctypes.Structure):
    _fields_ = [("gpu", ctypes.c_uint), ("memory", ctypes.c_uint)]


class PciInfo(ctypes.Structure):
    """nvmlPciInfo_t (the _v3 and _v2 calls; the first version fills the same leading fields).
    domain, bus and device are read rather than the strings, whose size changed between versions."""
    _fields_ = [("busIdLegacy", ctypes.c_char * 16), ("domain", ctypes.c_uint), ("bus", ctypes.c_uint),
                ("device", ctypes.c_uint), ("pciDeviceId", ctypes.c_uint), ("pciSubSystemId", ctypes.c_uint),
                ("busId", ctypes.c_char * 32)]


class ProcessInfo(ctypes.Structure):
    """nvmlProcessInfo_t of the _v2 and _v3 calls (the same layout)."""
    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong),
                ("gpuInstanceId", ctypes.c_uint), ("computeInstanceId", ctypes.c_uint)]


class ProcessInfoV1(ctypes.Structure):
    """nvmlProcessInfo_t of the unversioned call, on drivers older than 450."""
    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong)]


class ComputeProcess(object):
    """One entry of nvmlDeviceGetComputeRunningProcesses: pid, usedGpuMemory (bytes, or None)."""

    def __init__(self, pid, used):
        self.pid = pid
        self.usedGpuMemory = None if used == VALUE_NOT_AVAILABLE else used


# The GPU health preflight's structs and constants (nvml.h).
FEATURE_ENABLED = 1  # nvmlEnableState_t
SYSTEM_DRIVER_VERSION_BUFFER_SIZE = 80  # NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE
# nvmlGpuFabricState_t: where a GPU is in registering with the fabric manager.
FABRIC_STATE_NOT_SUPPORTED = 0
FABRIC_STATE_NOT_STARTED = 1
FABRIC_STATE_IN_PROGRESS = 2
FABRIC_STATE_COMPLETED = 3


class RemappedRows(object):
    """nvmlDeviceGetRemappedRows' four answers, under NVML's names."""

    def __init__(self, corrRows, uncRows, isPending, failureOccurred):
        self.corrRows = corrRows
        self.uncRows = uncRows
        self.isPending = bool(isPending)
        self.failureOccurred = bool(failureOccurred)


class GpuFabricInfo(ctypes.Structure):
    """nvmlGpuFabricInfo_t: `state` an nvmlGpuFabricState_t (an unsigned char), `status` the
    nvmlReturn_t of the registration once it completed."""
    _fields_ = [("clusterUuid", ctypes.c_ubyte * 16), ("status", ctypes.c_int), ("cliqueId", ctypes.c_uint),
                ("state", ctypes.c_ubyte)]


class Nvml(object):
    """The NVML calls modelwake makes. Loading the library raises NvmlError (code None) when the
    host has no driver; `library` is a path or a name for the dynamic loader."""

    def __init__(self, library=LIBRARY):
        try:
            self._lib = ctypes.CDLL(library)
        except OSError as exc:
            raise NvmlError("dlopen", None, "%s (no NVIDIA driver on this host?)" % exc)
        self._lib.nvmlErrorString.restype = ctypes.c_char_p
        self._functions = {}
        self._memory_v2 = True  # nvmlDeviceGetMemoryInfo_v2 is asked until the driver shows it has none

    def _function(self, *names):
        """The first of `names` the library exports (newer drivers add versioned symbols)."""
        for name in names:
            if name not in self._functions:
                try:
                    function = getattr(self._lib, name)
                except AttributeError:
                    function = None
                if function is not None:
                    function.restype = ctypes.c_int
                self._functions[name] = function
            if self._functions[name] is not None:
                return name, self._functions[name]
        raise NvmlError(names[0], ERROR_FUNCTION_NOT_FOUND, "not exported by this driver's library")

    def _call(self, names, *args):
        name, function = self._function(*names)
        code = function(*args)
        if code != SUCCESS:
            raise NvmlError(name, code, self._lib.nvmlErrorString(code).decode("utf-8", "replace"))
        return code

    def nvmlInit(self):
        self._call(("nvmlInit_v2", "nvmlInit"))

    def nvmlShutdown(self):
        self._call(("nvmlShutdown",))

    def nvmlDeviceGetCount(self):
        count = ctypes.c_uint(0)
        self._call(("nvmlDeviceGetCount_v2", "nvmlDeviceGetCount"), ctypes.byref(count))
        return count.value

    def nvmlDeviceGetHandleByIndex(self, index):
        handle = ctypes.c_void_p()
        self._call(("nvmlDeviceGetHandleByIndex_v2", "nvmlDeviceGetHandleByIndex"),
                   ctypes.c_uint(index), ctypes.byref(handle))
        return handle

    def nvmlDeviceGetMemoryInfo(self, handle):
        """total, free and used bytes; used as nvidia-smi shows it (without the driver's reserved
        memory) where the driver has nvmlDeviceGetMemoryInfo_v2, else as the first version counts it."""
        if self._memory_v2:
            memory = MemoryV2(version=MEMORY_V2_VERSION)
            try:
                self._call(("nvmlDeviceGetMemoryInfo_v2",), handle, ctypes.byref(memory))
                return memory
            except NvmlError as exc:
                if exc.code not in (ERROR_FUNCTION_NOT_FOUND, ERROR_ARGUMENT_VERSION_MISMATCH):
                    raise
                self._memory_v2 = False  # a driver before 510: its answer will not change
        memory = Memory()
        self._call(("nvmlDeviceGetMemoryInfo",), handle, ctypes.byref(memory))
        return memory

    def nvmlDeviceGetUtilizationRates(self, handle):
        utilization = Utilization()
        self._call(("nvmlDeviceGetUtilizationRates",), handle, ctypes.byref(utilization))
        return utilization

    def nvmlDeviceGetUUID(self, handle):
        buffer = ctypes.create_string_buffer(UUID_BUFFER_SIZE)
        self._call(("nvmlDeviceGetUUID",), handle, buffer, ctypes.c_uint(UUID_BUFFER_SIZE))
        return buffer.value.decode("ascii", "replace")

    def nvmlDeviceGetPciInfo(self, handle):
        """The GPU's PCI address (domain, bus, device): what the kernel's Xid lines name it by."""
        info = PciInfo()
        self._call(("nvmlDeviceGetPciInfo_v3", "nvmlDeviceGetPciInfo_v2", "nvmlDeviceGetPciInfo"),
                   handle, ctypes.byref(info))
        return info

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        """[ComputeProcess]: asked for the count first, then with room for a few more that may
        have started in between (as pynvml does)."""
        name, function = self._function("nvmlDeviceGetComputeRunningProcesses_v3",
                                        "nvmlDeviceGetComputeRunningProcesses_v2",
                                        "nvmlDeviceGetComputeRunningProcesses")
        struct = ProcessInfoV1 if name == "nvmlDeviceGetComputeRunningProcesses" else ProcessInfo
        count = ctypes.c_uint(0)
        code = function(handle, ctypes.byref(count), None)
        if code == SUCCESS:
            return []
        if code == ERROR_INSUFFICIENT_SIZE:
            count.value = count.value * 2 + 5
            infos = (struct * count.value)()
            code = function(handle, ctypes.byref(count), infos)
        if code != SUCCESS:
            raise NvmlError(name, code, self._lib.nvmlErrorString(code).decode("utf-8", "replace"))
        return [ComputeProcess(int(infos[i].pid), int(infos[i].usedGpuMemory)) for i in range(count.value)]

    # The GPU health preflight's reads (host/gpu_health.py): persistence mode, row remapping, the
    # driver and the CUDA version it supports, and the NVSwitch fabric registration.

    def nvmlDeviceGetPersistenceMode(self, handle):
        """True when persistence mode is enabled (nvmlEnableState_t 1)."""
        mode = ctypes.c_int(0)
        self._call(("nvmlDeviceGetPersistenceMode",), handle, ctypes.byref(mode))
        return mode.value == FEATURE_ENABLED

    def nvmlDeviceGetRemappedRows(self, handle):
        """RemappedRows(corrRows, uncRows, isPending, failureOccurred); NvmlError 3 (Not Supported)
        before Ampere, which has no row remapping."""
        counts = [ctypes.c_uint(0), ctypes.c_uint(0), ctypes.c_uint(0), ctypes.c_uint(0)]
        self._call(("nvmlDeviceGetRemappedRows",), handle, *[ctypes.byref(c) for c in counts])
        return RemappedRows(*[c.value for c in counts])

    def nvmlSystemGetDriverVersion(self):
        buffer = ctypes.create_string_buffer(SYSTEM_DRIVER_VERSION_BUFFER_SIZE)
        self._call(("nvmlSystemGetDriverVersion",), buffer, ctypes.c_uint(SYSTEM_DRIVER_VERSION_BUFFER_SIZE))
        return buffer.value.decode("ascii", "replace")

    def nvmlSystemGetCudaDriverVersion(self):
        """The newest CUDA version the driver supports, as 1000 * major + 10 * minor (12080: 12.8)."""
        version = ctypes.c_int(0)
        self._call(("nvmlSystemGetCudaDriverVersion_v2", "nvmlSystemGetCudaDriverVersion"), ctypes.byref(version))
        return version.value

    def nvmlDeviceGetGpuFabricInfo(self, handle):
        """GpuFabricInfo (state, status) of a GPU on an NVSwitch fabric; NvmlError 3 (Not Supported)
        on GPUs without one or before Hopper, 13 (Function Not Found) on drivers before 530."""
        info = GpuFabricInfo()
        self._call(("nvmlDeviceGetGpuFabricInfo",), handle, ctypes.byref(info))
        return info
