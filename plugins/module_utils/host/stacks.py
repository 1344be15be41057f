"""The Python stacks of a server's processes, read with py-spy: what each rank is doing.

Why py-spy, and how:
- `py-spy dump --pid N --json --nonblocking` reads the interpreter's frames from outside the
  process (process_vm_readv): nothing runs inside the engine, nothing is installed into it, and
  with --nonblocking the process is never paused, so a SIGSTOPped rank stays stopped and a busy
  one keeps its pace. It costs some tens of ms of CPU per process (bench/REPORT.md, "The ranks' stacks").
- It needs ptrace permission over the target: root, or the same user where Yama's ptrace_scope
  is 0, or CAP_SYS_PTRACE (the launcher's unit grants it where Yama asks for it).
- Where py-spy is: the `py_spy` option (a path, or "off"); by default next to the engine's
  interpreter (the venv's bin/, where inference_env installs it), then PATH.
A process that is not Python (a compiler child, the launcher's nvidia-smi) is skipped.
"""
import hashlib
import json
import os
import re
import shutil

from ..common.command import run_command
from .procfs import CLK_TCK

# The release inference_env installs into the engine venv (roles/inference_env/defaults); its
# `dump --json` output is what parse_threads() reads.
PY_SPY_VERSION = "0.4.1"
DUMP_TIMEOUT = 2.0  # seconds per process: a dump takes ~60 ms; a wedged read must not hold the wait
SHOWN_FRAMES = 3  # innermost frames kept per process for messages
# The rank a process serves, from its title: SGLang's `sglang::scheduler_TP3` (or DP0_TP3_EP0),
# vLLM's `VLLM::Worker_TP3` and its log prefix `VllmWorker-3`, the simulator's `sim-TP3`.
RANK_PATTERNS = (re.compile(r"TP(\d+)"), re.compile(r"VllmWorker-(\d+)"), re.compile(r"\brank[ =]?(\d+)"))
NOT_PERMITTED = ("Permission denied", "Operation not permitted", "EPERM")


def rank_of(*names):
    for name in names:
        for pattern in RANK_PATTERNS:
            match = pattern.search(name or "")
            if match:
                return int(match.group(1))
    return None


def process_name(info):
    """A process title when it set one (`sglang::scheduler_TP0`), the module a `python -m` runs
    (`api_server` for vLLM's `-m vllm.entrypoints.openai.api_server`), else its comm."""
    words = (info.get("cmdline") or "").split()
    if words and "::" in words[0]:
        return words[0]
    if len(words) > 2 and words[1] == "-m":
        return words[2].rsplit(".", 1)[-1]
    return info.get("comm") or "?"


def interpreter_dirs(processes):
    """The bin/ directories of the tree's interpreters (a venv's bin/), in pid order."""
    dirs = []
    for pid in sorted(processes):
        words = (processes[pid].get("cmdline") or "").split()
        if words and os.path.isabs(words[0]) and os.path.basename(words[0]).startswith("python"):
            if os.path.dirname(words[0]) not in dirs:
                dirs.append(os.path.dirname(words[0]))
    return dirs


def _executable(path):
    return os.path.isfile(path) and os.access(path, os.X_OK)


def find_py_spy(option, processes):
    """(path, None) or (None, why there is none)."""
    if option == "off":
        return None, "stacks are off (py_spy: off)"
    if option and option != "auto":
        if _executable(option):
            return option, None
        return None, "py_spy %s is not an executable file" % option
    looked = interpreter_dirs(processes)
    for directory in looked:
        candidate = os.path.join(directory, "py-spy")
        if _executable(candidate):
            return candidate, None
    on_path = shutil.which("py-spy")
    if on_path:
        return on_path, None
    where = "next to the engine's interpreter (%s) and " % ", ".join(looked) if looked else ""
    return None, ("py-spy is not installed (looked %son PATH): install py-spy==%s into the engine venv "
                  "(inference_env does by default) or set py_spy" % (where, PY_SPY_VERSION))


def _frame(frame):
    return [frame.get("name") or "?", frame.get("short_filename") or os.path.basename(frame.get("filename") or "?"),
            int(frame.get("line") or 0)]


def parse_threads(text):
    """py-spy's `dump --json` output -> (signature, thread name, innermost frames of the busiest thread).

    The signature covers every frame of every thread: it changes whenever any Python code of the
    process moved. The frames shown are those of the thread that holds the GIL or runs, else of
    the main thread: where the process's work is.
    """
    threads = json.loads(text)
    if not threads:
        return "", None, []
    ordered = sorted(threads, key=lambda th: th.get("thread_id") or 0)
    frames = json.dumps([[_frame(f) for f in th.get("frames") or []] for th in ordered])
    signature = hashlib.sha1(frames.encode("utf-8")).hexdigest()[:16]  # kept between looks: short

    def weight(th):
        return (bool(th.get("owns_gil")), bool(th.get("active")), th.get("thread_name") == "MainThread")

    shown = max(ordered, key=weight)
    return signature, shown.get("thread_name"), [_frame(f) for f in (shown.get("frames") or [])[:SHOWN_FRAMES]]


def is_python(pid, info, proc_root="/proc"):
    """Whether a process runs a Python interpreter (its executable, else its command line says so)."""
    try:
        exe = os.readlink(os.path.join(proc_root, str(pid), "exe"))
        return "python" in os.path.basename(exe)
    except OSError:
        words = (info.get("cmdline") or "").split()
        return bool(words) and ("python" in os.path.basename(words[0]) or "::" in words[0])


class StackReader(object):
    """Reads the stacks of a tree's Python processes. `runner(argv, timeout)` as common.command."""

    def __init__(self, option="auto", runner=run_command, proc_root="/proc"):
        self.option = option or "auto"
        self.runner = runner
        self.proc_root = proc_root

    def read(self, processes):
        """{pid: info} -> {"processes": [...], "unavailable": None or why}.

        Each process: pid, name, rank, state, thread, frames (innermost first: [function, file,
        line]), signature, cpu_seconds and faults (from `info`, for the classifier's rule).
        """
        py_spy, why = find_py_spy(self.option, processes)
        if py_spy is None:
            return {"processes": [], "unavailable": why}
        found = []
        refused = None
        for pid in sorted(processes):
            info = processes[pid]
            if info.get("state") in ("Z", "X") or not is_python(pid, info, self.proc_root):
                continue
            rc, out, err = self.runner([py_spy, "dump", "--pid", str(pid), "--json", "--nonblocking"],
                                       timeout=DUMP_TIMEOUT)
            if rc != 0:
                text = " ".join((err or out or "").split())
                if any(word in text for word in NOT_PERMITTED):
                    refused = "py-spy may not read process %d: %s" % (pid, text[:200])
                continue  # gone meanwhile, not Python after all, or a read that timed out
            try:
                signature, thread, frames = parse_threads(out)
            except (ValueError, TypeError, AttributeError):
                continue
            name = process_name(info)
            found.append({"pid": pid, "name": name, "rank": rank_of(name, info.get("comm"), info.get("cmdline")),
                          "state": info.get("state"), "thread": thread, "frames": frames, "signature": signature,
                          "cpu_seconds": round(info.get("own_ticks", 0) / float(CLK_TCK), 2),
                          "faults": info.get("faults")})
        unavailable = None
        if not found and refused:
            unavailable = "%s (run as root, or grant CAP_SYS_PTRACE where Yama's ptrace_scope is 1 or 2)" % refused
        return {"processes": found, "unavailable": unavailable}
