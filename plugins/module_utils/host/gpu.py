"""GPU memory and utilisation, through NVML (the driver's library, host/nvml.py) or nvidia-smi.

NVML is used when libnvidia-ml.so.1 loads and initialises: one session per reader, the GPUs'
handles and UUIDs kept after the first read, so a look costs a few C calls per GPU. Otherwise
`nvidia-smi` answers the same questions (a fork and 15 to 17 ms of CPU each on an H200 host, against
under 0.1 ms for a look's NVML read of 8 GPUs: bench/REPORT.md, "On a real GPU"); with neither (no GPU at
all, which is normal for tests and CPU engines) the lists are empty. Memory is reported in MiB,
`used` as nvidia-smi shows it and `free` as what can still be allocated (the driver's reserved
memory, about 615 MiB of an H200, is in neither); utilisation in percent, or None when the driver
does not know.

No read can hang on the driver: a GPU fault can wedge the driver so that NVML calls and nvidia-smi
never return. Each NVML read runs in a daemon thread waited for NVML_TIMEOUT seconds (nvml.call_within),
each nvidia-smi for SMI_TIMEOUT (the runner kills it, and does not wait on one the kernel cannot
kill); once one does not answer, the reader is `wedged`: it says so in `error`, reads nothing more
and never calls the driver again in this process (each call would block behind the same fault).
"""
from ..common.command import TIMED_OUT, run_command
from ..common.units import MIB
from .nvml import Nvml, NvmlTimeout, call_within

# An NVML read of every watched GPU answers in well under a millisecond per GPU on a healthy driver.
NVML_TIMEOUT = 5.0
# nvmlInit opens every GPU: seconds on an 8-GPU host without persistence mode (getainode/ainode#238).
NVML_INIT_TIMEOUT = 20.0
# nvidia-smi takes 15 to 17 ms of CPU on an H200, a few seconds where persistence mode is off.
SMI_TIMEOUT = 10


SMI_GPU_QUERY = ["nvidia-smi", "--query-gpu=index,uuid,memory.used,memory.total,utilization.gpu,memory.free",
                 "--format=csv,noheader,nounits"]
SMI_APPS_QUERY = ["nvidia-smi", "--query-compute-apps=gpu_uuid,pid,used_memory",
                  "--format=csv,noheader,nounits"]
SMI_PCI_QUERY = ["nvidia-smi", "--query-gpu=index,pci.bus_id", "--format=csv,noheader"]


def _mib_up(size):
    return int(-(-size // MIB))


def _bus_id(text):
    """'0000:41:00' from nvidia-smi's '00000000:41:00.0', or None."""
    parts = text.strip().lower().split(":")
    if len(parts) != 3 or not all(parts):
        return None
    try:
        return "%04x:%02x:%02x" % (int(parts[0], 16) & 0xFFFF, int(parts[1], 16), int(parts[2].split(".")[0], 16))
    except ValueError:
        return None


def _number(text):
    """nvidia-smi prints '[N/A]' or '[Not Supported]' for unknown values."""
    text = text.strip()
    try:
        return int(float(text))
    except ValueError:
        return None


class GpuReader(object):
    """Reads the watched GPUs. `gpus` is a list of indices (None = all).

    The backend is chosen on the first read and kept: "nvml", "nvidia-smi" or "none". `nvml` is
    an object with host/nvml.Nvml's calls (tests pass a fake); by default the driver's library.
    """

    def __init__(self, gpus=None, nvml=None, runner=run_command, timeout=NVML_TIMEOUT):
        self.gpus = None if gpus is None else set(gpus)
        self.runner = runner
        self._nvml = nvml
        self._devices = None  # [(index, handle, uuid)] of the watched GPUs, read once per session
        self._bus_ids = None  # {index: "0000:41:00"} of every GPU, read once
        self.backend = None
        self.error = None
        self.no_gpu_tools = False
        self.timeout = timeout  # seconds an NVML read may take
        self.init_timeout = max(timeout, NVML_INIT_TIMEOUT)
        self.smi_timeout = SMI_TIMEOUT
        # Why the driver is not asked again, once a call did not answer: "NVML did not answer in 5 s (GPU 3)".
        self.wedged = None
        self._calling = None  # (NVML function, GPU index or None) of the call in progress
        # The answer of the nvidia-smi run that chose the backend, kept for the first read: each
        # run costs the host a fork and milliseconds of CPU, and the first look needs the same answer.
        self._unread_smi = None

    def _choose(self):
        if self.backend is not None:
            return self.backend
        try:
            nvml = self._nvml if self._nvml is not None else Nvml()
            self._nvml = nvml
            self._bounded(lambda: self._call("nvmlInit"), self.init_timeout)
            self.backend = "nvml"
            return self.backend
        except NvmlTimeout:
            # The driver is there and wedged: nvidia-smi would hang on it as well.
            self.backend = "nvml"
            return self.backend
        except Exception as exc:  # NvmlError (no driver, no GPU), or a fake's own error class
            self.error = "NVML unavailable: %s" % exc
        rc, out, err = self._smi(SMI_GPU_QUERY)
        if self.wedged:
            self.backend = "nvidia-smi"  # there, and hung on the driver
            return self.backend
        if rc == 0:
            self.backend = "nvidia-smi"
            self.error = None
            self._unread_smi = (rc, out, err)
        else:
            self.backend = "none"
            # No usable NVML and no nvidia-smi: a host without GPUs, which is normal; `error`
            # still tells a preflight why NVML did not answer.
            self.no_gpu_tools = rc == 127
            if rc != 127:
                self.error = "nvidia-smi failed (rc %d): %s" % (rc, err.strip()[:200])
        return self.backend

    def _watched(self, index):
        return self.gpus is None or index in self.gpus

    def _call(self, function, *args, gpu=None):
        """One NVML call, named for the message should it not return."""
        self._calling = (function, gpu)
        return getattr(self._nvml, function)(*args)

    def _bounded(self, work, seconds=None):
        """work() (NVML calls through _call) within `seconds` (self.timeout); NvmlTimeout, and the
        reader wedged, when it does not return."""
        seconds = self.timeout if seconds is None else seconds
        try:
            return call_within(seconds, work)
        except NvmlTimeout:
            function, gpu = self._calling or ("NVML", None)
            self.wedged = "NVML did not answer in %g s (%s%s); the GPUs are not read again by this process" % (
                seconds, "" if gpu is None else "GPU %d, " % gpu, function)
            self.error = self.wedged
            raise

    def _smi(self, argv):
        """An nvidia-smi run, bounded; one that does not answer wedges the reader."""
        rc, out, err = self.runner(argv, self.smi_timeout)
        if rc == TIMED_OUT:
            self.wedged = "nvidia-smi did not answer in %d s; the GPUs are not read again by this process" % (
                self.smi_timeout)
            self.error = self.wedged
        return rc, out, err

    def read(self):
        """[{index, uuid, memory_used_mib, memory_total_mib, memory_free_mib, utilization}] of the
        watched GPUs; [] once the driver did not answer (`wedged`, `error` say so)."""
        backend = self._choose()
        if self.wedged:
            return []
        try:
            if backend == "nvml":
                return self._bounded(self._read_nvml)
            if backend == "nvidia-smi":
                return self._read_smi()
        except NvmlTimeout:
            return []
        return []

    def pci_bus_ids(self):
        """{index: "0000:41:00"} of every GPU (watched or not), as the kernel's Xid lines name them;
        read once, {} when the driver cannot tell."""
        if self._bus_ids is not None:
            return self._bus_ids
        backend = self._choose()
        if self.wedged or backend == "none":
            return {}
        found = {}
        try:
            if backend == "nvml":
                found = self._bounded(self._nvml_bus_ids)
            else:
                rc, out, _err = self._smi(SMI_PCI_QUERY)
                for line in out.splitlines() if rc == 0 else []:
                    cols = [c.strip() for c in line.split(",")]
                    if len(cols) == 2 and _number(cols[0]) is not None and _bus_id(cols[1]):
                        found[_number(cols[0])] = _bus_id(cols[1])
        except NvmlTimeout:
            return {}
        except Exception:  # NvmlError, where the call is missing: an Xid is then named by its PCI id alone
            found = {}
        self._bus_ids = found
        return found

    def _nvml_bus_ids(self):
        found = {}
        for index in range(self._call("nvmlDeviceGetCount")):
            info = self._call("nvmlDeviceGetPciInfo", self._call("nvmlDeviceGetHandleByIndex", index, gpu=index),
                              gpu=index)
            found[index] = "%04x:%02x:%02x" % (info.domain & 0xFFFF, info.bus, info.device)
        return found

    def _nvml_devices(self):
        """[(index, handle, uuid)] of the watched GPUs: a GPU cannot appear while a driver session
        lasts, so they are read once."""
        if self._devices is None:
            devices = []
            for index in range(self._call("nvmlDeviceGetCount")):
                if self._watched(index):
                    handle = self._call("nvmlDeviceGetHandleByIndex", index, gpu=index)
                    uuid = self._call("nvmlDeviceGetUUID", handle, gpu=index)
                    devices.append((index, handle, uuid.decode() if isinstance(uuid, bytes) else uuid))
            self._devices = devices
        return self._devices

    def _read_nvml(self):
        found = []
        for index, handle, uuid in self._nvml_devices():
            mem = self._call("nvmlDeviceGetMemoryInfo", handle, gpu=index)
            try:
                util = self._call("nvmlDeviceGetUtilizationRates", handle, gpu=index).gpu
            except Exception:  # "Not Supported" on some SKUs and in containers
                util = None
            found.append({
                "index": index,
                "uuid": uuid,
                # Rounded up, as nvidia-smi rounds (on an H200 615.06 MiB reserved is its 616 MiB):
                # both backends give the operator's figures.
                "memory_used_mib": _mib_up(mem.used),
                "memory_total_mib": _mib_up(mem.total),
                "memory_free_mib": _mib_up(mem.free),
                "utilization": util,
            })
        return found

    def _read_smi(self):
        answer, self._unread_smi = self._unread_smi, None
        rc, out, err = answer or self._smi(SMI_GPU_QUERY)
        if self.wedged:
            return []
        if rc != 0:
            self.error = "nvidia-smi failed (rc %d): %s" % (rc, err.strip()[:200])
            return []
        found = []
        for line in out.splitlines():
            cols = [c.strip() for c in line.split(",")]
            if len(cols) < 5 or _number(cols[0]) is None:
                continue
            index = _number(cols[0])
            if self._watched(index):
                found.append({
                    "index": index,
                    "uuid": cols[1],
                    "memory_used_mib": _number(cols[2]),
                    "memory_total_mib": _number(cols[3]),
                    "memory_free_mib": _number(cols[5]) if len(cols) > 5 else None,
                    "utilization": _number(cols[4]),
                })
        return found

    def compute_processes(self):
        """[{index, pid, used_memory_mib}]: processes holding memory on the watched GPUs."""
        backend = self._choose()
        if self.wedged:
            return []
        if backend == "nvml":
            try:
                return self._bounded(self._nvml_processes)
            except NvmlTimeout:
                return []
        if backend == "nvidia-smi":
            by_uuid = dict((gpu["uuid"], gpu["index"]) for gpu in self._read_smi())
            if self.wedged:
                return []
            rc, out, _err = self._smi(SMI_APPS_QUERY)
            if rc != 0:
                return []
            found = []
            for line in out.splitlines():
                cols = [c.strip() for c in line.split(",")]
                if len(cols) < 3 or cols[0] not in by_uuid or _number(cols[1]) is None:
                    continue
                found.append({"index": by_uuid[cols[0]], "pid": _number(cols[1]),
                              "used_memory_mib": _number(cols[2])})
            return found
        return []

    def _nvml_processes(self):
        found = []
        for index, handle, _uuid in self._nvml_devices():
            for proc in self._call("nvmlDeviceGetComputeRunningProcesses", handle, gpu=index):
                used = proc.usedGpuMemory  # None when NVML cannot tell (NVML_VALUE_NOT_AVAILABLE)
                found.append({"index": index, "pid": int(proc.pid),
                              "used_memory_mib": None if used is None else int(used // MIB)})
        return found

    def nvml_devices(self):
        """(nvml, [(index, handle, uuid)]) of the watched GPUs when NVML is the backend, else
        (None, []): for reads built on the same session (host/gpu_health.py). Every call made
        through that `nvml` is bounded as the reader's own are; once one does not answer, the
        others fail at once with the same NvmlTimeout."""
        if self._choose() != "nvml" or self.wedged:
            return None, []
        try:
            devices = self._bounded(self._nvml_devices)
        except NvmlTimeout:
            return None, []
        return _BoundedNvml(self), devices


class _BoundedNvml(object):
    """The reader's NVML session seen through GpuReader._bounded: `nvml.nvmlDeviceGetX(handle)` runs
    within the reader's bound, and raises at once when the driver already did not answer."""

    def __init__(self, reader):
        self._reader = reader

    def __getattr__(self, function):
        reader = self._reader

        def call(*args):
            if reader.wedged:
                raise NvmlTimeout(function, reader.timeout)
            return reader._bounded(lambda: reader._call(function, *args))
        return call
