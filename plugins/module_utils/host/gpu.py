"""GPU memory and utilisation, through NVML (the driver's library, host/nvml.py) or nvidia-smi.

NVML is used when libnvidia-ml.so.1 loads and initialises: one session per reader, the GPUs'
handles and UUIDs kept after the first read, so a look costs a few C calls per GPU. Otherwise
`nvidia-smi` answers the same questions (a fork and 15 to 17 ms of CPU each on an H200 host, against
under 0.1 ms for a look's NVML read of 8 GPUs: bench/REPORT.md, "On a real GPU"); with neither (no GPU at
all, which is normal for tests and CPU engines) the lists are empty. Memory is reported in MiB,
`used` as nvidia-smi shows it and `free` as what can still be allocated (the driver's reserved
memory, about 615 MiB of an H200, is in neither); utilisation in percent, or None when the driver
does not know.
"""
from ..common.command import run_command
from ..common.units import MIB
from .nvml import Nvml


SMI_GPU_QUERY = ["nvidia-smi", "--query-gpu=index,uuid,memory.used,memory.total,utilization.gpu,memory.free",
                 "--format=csv,noheader,nounits"]
SMI_APPS_QUERY = ["nvidia-smi", "--query-compute-apps=gpu_uuid,pid,used_memory",
                  "--format=csv,noheader,nounits"]


def _mib_up(size):
    return int(-(-size // MIB))


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

    def __init__(self, gpus=None, nvml=None, runner=run_command):
        self.gpus = None if gpus is None else set(gpus)
        self.runner = runner
        self._nvml = nvml
        self._devices = None  # [(index, handle, uuid)] of the watched GPUs, read once per session
        self.backend = None
        self.error = None
        self.no_gpu_tools = False
        # The answer of the nvidia-smi run that chose the backend, kept for the first read: each
        # run costs the host a fork and milliseconds of CPU, and the first look needs the same answer.
        self._unread_smi = None

    def _choose(self):
        if self.backend is not None:
            return self.backend
        try:
            nvml = self._nvml if self._nvml is not None else Nvml()
            nvml.nvmlInit()
            self._nvml = nvml
            self.backend = "nvml"
            return self.backend
        except Exception as exc:  # NvmlError (no driver, no GPU), or a fake's own error class
            self.error = "NVML unavailable: %s" % exc
        rc, out, err = self.runner(SMI_GPU_QUERY, 20)
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

    def read(self):
        """[{index, uuid, memory_used_mib, memory_total_mib, memory_free_mib, utilization}] of the
        watched GPUs."""
        backend = self._choose()
        if backend == "nvml":
            return self._read_nvml()
        if backend == "nvidia-smi":
            return self._read_smi()
        return []

    def _nvml_devices(self):
        """[(index, handle, uuid)] of the watched GPUs: a GPU cannot appear while a driver session
        lasts, so they are read once."""
        if self._devices is None:
            nvml = self._nvml
            devices = []
            for index in range(nvml.nvmlDeviceGetCount()):
                if self._watched(index):
                    handle = nvml.nvmlDeviceGetHandleByIndex(index)
                    uuid = nvml.nvmlDeviceGetUUID(handle)
                    devices.append((index, handle, uuid.decode() if isinstance(uuid, bytes) else uuid))
            self._devices = devices
        return self._devices

    def _read_nvml(self):
        nvml = self._nvml
        found = []
        for index, handle, uuid in self._nvml_devices():
            mem = nvml.nvmlDeviceGetMemoryInfo(handle)
            try:
                util = nvml.nvmlDeviceGetUtilizationRates(handle).gpu
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
        rc, out, err = answer or self.runner(SMI_GPU_QUERY, 20)
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
        if backend == "nvml":
            found = []
            for index, handle, _uuid in self._nvml_devices():
                for proc in self._nvml.nvmlDeviceGetComputeRunningProcesses(handle):
                    used = proc.usedGpuMemory  # None when NVML cannot tell (NVML_VALUE_NOT_AVAILABLE)
                    found.append({"index": index, "pid": int(proc.pid),
                                  "used_memory_mib": None if used is None else int(used // MIB)})
            return found
        if backend == "nvidia-smi":
            by_uuid = dict((gpu["uuid"], gpu["index"]) for gpu in self._read_smi())
            rc, out, _err = self.runner(SMI_APPS_QUERY, 20)
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

    def nvml_devices(self):
        """(nvml, [(index, handle, uuid)]) of the watched GPUs when NVML is the backend, else
        (None, []): for reads built on the same session (host/gpu_health.py)."""
        if self._choose() != "nvml":
            return None, []
        return self._nvml, self._nvml_devices()
