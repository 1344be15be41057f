"""What the launcher's wait knows of the disk and the ranks, for the slow-load line (readiness/bottleneck.py).

The disk's cold read rate is the GPU preflight's measure, which the model_service role writes into the
unit's state directory (`disk-rate`, bytes/s) rather than into the unit: a re-measured rate moves a
little at every deploy, and a changed unit would restart a model that takes minutes to load. The
ranks on this host are the engine command's own tensor-parallel size.
"""
import os

DISK_RATE_FILE = "disk-rate"
# The engines' spellings of the tensor-parallel size (SGLang: --tp / --tp-size, vLLM: --tensor-parallel-size / -tp).
TP_OPTIONS = ("--tp", "--tp-size", "--tensor-parallel-size", "-tp")


def read_disk_rate(state_dir):
    """The disk's cold read rate in bytes/s from `<state_dir>/disk-rate`, or None when there is none
    (no preflight measure, a warm one, no state directory) or it is not a positive whole number: the
    wait then says nothing of the disk, as without the file."""
    if not state_dir:
        return None
    try:
        with open(os.path.join(state_dir, DISK_RATE_FILE)) as handle:
            words = handle.read().split()
    except OSError:
        return None
    if len(words) != 1 or not words[0].isdigit() or int(words[0]) <= 0:
        return None
    return int(words[0])


def tensor_parallel(command):
    """The tensor-parallel size the engine command gives (`--tp 8`, `--tensor-parallel-size=8`), else 1."""
    for index, word in enumerate(command):
        name, equals, value = word.partition("=")
        if name not in TP_OPTIONS:
            continue
        if not equals:
            value = command[index + 1] if index + 1 < len(command) else ""
        if value.isdigit() and int(value) > 0:
            return int(value)
    return 1
