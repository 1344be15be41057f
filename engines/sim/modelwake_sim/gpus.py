"""The scripted GPU picture: the simulated engine's side of tests/fakes/nvidia-smi.

Directory `${MODELWAKE_FAKE_GPU_DIR:-/run/modelwake-fake-gpu}` holds `gpus.json` (the GPUs) and
one `holder-<pid namespace>-<pid>.json` per process that "holds" GPU memory. Each rank process writes its
own holder, so nvidia-smi's compute-apps list shows the scheduler/worker PIDs, as on a real host (by their
host PIDs also when the engine runs in a container, which mounts this directory).
"""
import json
import os
import uuid

DEFAULT_DIR = "/run/modelwake-fake-gpu"
DEFAULT_NAME = "NVIDIA RTX PRO 6000 Blackwell Server Edition"
DEFAULT_TOTAL_MIB = 97887


def fake_gpu_dir():
    return os.environ.get("MODELWAKE_FAKE_GPU_DIR") or DEFAULT_DIR


def pid_namespace():
    """This process's PID namespace, as its link reads (pid:[4026531836]). A process in a container (Podman's
    or Docker's own PID namespace) knows only the PID it has there; with the namespace, the scripted
    nvidia-smi on the host finds the host PID that NVML would report."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def holder_path(directory, pid, namespace):
    """One file per process: PIDs of two containers' namespaces may be equal, their namespaces are not."""
    inode = "".join(char for char in namespace if char.isdigit())
    return os.path.join(directory, "holder-%s-%d.json" % (inode, pid) if inode else "holder-%d.json" % pid)


def _write_json_atomic(path, data):
    tmp = "%s.tmp-%d" % (path, os.getpid())
    with open(tmp, "w") as fileobj:
        json.dump(data, fileobj, sort_keys=True)
    os.replace(tmp, path)


def ensure_gpus(directory, count, total_mib=DEFAULT_TOTAL_MIB, name=DEFAULT_NAME):
    """Create gpus.json with `count` idle GPUs unless it exists (another engine may share it)."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, "gpus.json")
    if os.path.exists(path):
        return False
    gpus = [{"index": i, "name": name,
             "uuid": "GPU-" + str(uuid.uuid5(uuid.NAMESPACE_DNS, "modelwake-fake-gpu-%d" % i)),
             "memory_total_mib": total_mib, "memory_used_mib": 0, "utilization_gpu": 0}
            for i in range(count)]
    tmp = "%s.tmp-%d" % (path, os.getpid())
    with open(tmp, "w") as fileobj:
        json.dump({"gpus": gpus}, fileobj, indent=2)
    try:
        # link() fails if a concurrent engine created it first: never overwrite its picture.
        os.link(tmp, path)
    except FileExistsError:
        pass
    finally:
        os.unlink(tmp)
    return True


def visible_gpu(rank):
    """The physical GPU index of a TP rank, honouring CUDA_VISIBLE_DEVICES like CUDA does."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").strip()
    if visible:
        ids = [v.strip() for v in visible.split(",") if v.strip()]
        if rank < len(ids) and ids[rank].isdigit():
            return int(ids[rank])
    return rank


class Holder:
    """One process's holder file; `update()` rewrites it, `remove()` deletes it on clean exit."""

    def __init__(self, directory, name, gpu_index, pid=None):
        self.pid = pid if pid is not None else os.getpid()
        self.namespace = pid_namespace()
        self.path = holder_path(directory, self.pid, self.namespace)
        self.name = name
        self.gpu_index = gpu_index
        self.last = None

    def update(self, memory_mib, utilization):
        state = (int(memory_mib), int(utilization))
        if state == self.last:
            return
        self.last = state
        _write_json_atomic(self.path, {"pid": self.pid, "pid_namespace": self.namespace, "name": self.name,
                                       "gpus": {str(self.gpu_index): {"memory_mib": state[0],
                                                                      "utilization": state[1]}}})

    def remove(self):
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
