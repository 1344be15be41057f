"""The Python stacks of a server's processes, read with py-spy: what each rank is doing.

Why py-spy, and how:
- `py-spy dump --pid N --json --nonblocking` reads the interpreter's frames from outside the
  process (process_vm_readv): nothing runs inside the engine, nothing is installed into it, and
  with --nonblocking the process is never paused, so a SIGSTOPped rank stays stopped and a busy
  one keeps its pace. It costs some tens of ms of CPU per process (bench/REPORT.md, "The ranks' stacks").
- It needs ptrace permission over the target: root, or the same user where Yama's ptrace_scope
  is 0, or CAP_SYS_PTRACE (the launcher's unit grants it where Yama asks for it).
- Where py-spy is: the `py_spy` option (a path, or "off"); by default next to the engine's
  interpreter (the venv's bin/, where inference_env installs it), then PATH. An interpreter named
  without a directory (a container's `python3 -m ...`) is found as the process found it: along its own
  PATH (/proc/<pid>/environ), in its own root (/proc/<pid>/root, the container's filesystem).
A process that is not Python (a compiler child, the launcher's nvidia-smi) is skipped.

GIL and activity: py-spy reports per thread `owns_gil` (the thread is the GIL's current holder,
read from the interpreter) and `active` (the OS shows the thread running; on Python 3.11+ it has
the native thread id even with --nonblocking; else a heuristic on the innermost frame). On live
processes (tests/fixtures/stacks/shapes.json, py-spy 0.4.1, CPython 3.11) a Python hot loop is
active with the GIL; a busy-wait inside one C call that released the GIL (as torch does around
c10d collectives) is active without it; a C call that sleeps is neither. A C call that keeps the
GIL (a regex backtrack) looks like a hot loop to these two flags: with `--locals`, the hot loop's
locals change between samples and the C call's do not. StackReader.read(samples=N) takes N dumps
~50 ms apart and says how many found the busiest thread active with the GIL, and whether its
innermost line (and, with locals=True, its innermost frame's locals) changed between them.
"""
import hashlib
import json
import os
import shutil
import time

from ..common.command import run_command
from . import ranks
from .procfs import CLK_TCK

# The release inference_env installs into the engine venv (roles/inference_env/defaults); its
# `dump --json` output is what parse_threads() reads.
PY_SPY_VERSION = "0.4.1"
DUMP_TIMEOUT = 2.0  # seconds per process: a dump takes ~60 ms; a wedged read must not hold the wait
SHOWN_FRAMES = 3  # innermost frames kept per process for messages
SAMPLE_SPACING = 0.05  # seconds between two dumps of one read: apart enough for a hot loop to move
NOT_PERMITTED = ("Permission denied", "Operation not permitted", "EPERM")


def process_name(info):
    """A process title when it set one (`sglang::scheduler_TP0`), the module a `python -m` runs
    (`api_server` for vLLM's `-m vllm.entrypoints.openai.api_server`), else its comm."""
    own = ranks.title(info)
    if own:
        return own
    words = (info.get("cmdline") or "").split()
    if len(words) > 2 and words[1] == "-m":
        return words[2].rsplit(".", 1)[-1]
    return info.get("comm") or "?"


def interpreter_dirs(processes, proc_root="/proc"):
    """The bin/ directories of the tree's interpreters (a venv's bin/), in pid order: as the command line
    names them, or, for a bare `python3`, where the process's own PATH finds it in its own root."""
    dirs = []
    for pid in sorted(processes):
        words = (processes[pid].get("cmdline") or "").split()
        if not words or not os.path.basename(words[0]).startswith("python"):
            continue
        if os.path.isabs(words[0]):
            directory = os.path.dirname(words[0])
        else:
            directory = _found_on_own_path(pid, words[0], proc_root)
        if directory and directory not in dirs:
            dirs.append(directory)
    return dirs


def _found_on_own_path(pid, command, proc_root):
    """The directory, seen from here through /proc/<pid>/root, in which the process's PATH finds
    `command`; None when its environment cannot be read (another user's process) or nothing matches."""
    try:
        with open(os.path.join(proc_root, str(pid), "environ"), "rb") as handle:
            environ = handle.read().split(b"\0")
    except OSError:
        return None
    path = [entry[len(b"PATH="):].decode("utf-8", "replace") for entry in environ if entry.startswith(b"PATH=")]
    root = os.path.join(proc_root, str(pid), "root")
    for directory in (path[0].split(":") if path else []):
        if not os.path.isabs(directory):
            continue
        seen_from_here = os.path.join(root, directory.lstrip("/"))
        if os.path.exists(os.path.join(seen_from_here, command)):
            return seen_from_here
    return None


def _executable(path):
    return os.path.isfile(path) and os.access(path, os.X_OK)


def find_py_spy(option, processes, proc_root="/proc", helpers=None):
    """(path, None) or (None, why there is none). helpers: other processes of the server's unit (its
    launcher, which runs from the host's venv where inference_env installs py-spy for an engine in a
    container), looked beside after the engine's own interpreters."""
    if option == "off":
        return None, "stacks are off (py_spy: off)"
    if option and option != "auto":
        if _executable(option):
            return option, None
        return None, "py_spy %s is not an executable file" % option
    looked = interpreter_dirs(processes, proc_root)
    looked += [directory for directory in interpreter_dirs(helpers or {}, proc_root) if directory not in looked]
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


def _digest(value):
    return hashlib.sha1(json.dumps(value).encode("utf-8")).hexdigest()[:16]  # kept between looks: short


def parse_sample(text):
    """py-spy's `dump --json` output -> {"signature", "thread", "frames", "owns_gil", "active",
    "locals"} of the process (a process without Python threads: an empty signature and no frames).

    The signature covers every frame of every thread: it changes whenever any Python code of the
    process moved. thread, frames (innermost first), owns_gil and active are those of the busiest
    thread: the one that holds the GIL or runs, else the main thread, where the process's work is.
    locals: a digest of its innermost frame's local values when the dump has them (--locals),
    else None; the values themselves are never kept (they may hold secrets).
    """
    threads = json.loads(text)
    if not threads:
        return {"signature": "", "thread": None, "frames": [], "owns_gil": False, "active": False, "locals": None}
    ordered = sorted(threads, key=lambda th: th.get("thread_id") or 0)

    def weight(th):
        return (bool(th.get("owns_gil")), bool(th.get("active")), th.get("thread_name") == "MainThread")

    shown = max(ordered, key=weight)
    frames = shown.get("frames") or []
    local_values = frames[0].get("locals") if frames else None
    return {"signature": _digest([[_frame(f) for f in th.get("frames") or []] for th in ordered]),
            "thread": shown.get("thread_name"),
            "frames": [_frame(f) for f in frames[:SHOWN_FRAMES]],
            "owns_gil": bool(shown.get("owns_gil")),
            "active": bool(shown.get("active")),
            "locals": None if local_values is None else _digest([[v.get("name"), v.get("repr")] for v in local_values])}


def parse_threads(text):
    """py-spy's `dump --json` output -> (signature, thread name, innermost frames of the busiest thread)."""
    sample = parse_sample(text)
    return sample["signature"], sample["thread"], sample["frames"]


def combine_samples(samples):
    """Several parse_sample() results of one process, oldest first -> what they say together:
    owns_gil/active of the last, gil_active_samples (how many found the busiest thread active
    with the GIL), line_moved (its innermost frame changed between samples; None with one sample)
    and locals_moved (its innermost frame's locals changed; None without --locals or with one)."""
    last = samples[-1]
    tops = [tuple(sample["frames"][0]) if sample["frames"] else None for sample in samples]
    local_digests = [sample["locals"] for sample in samples]
    several = len(samples) > 1
    return {"owns_gil": last["owns_gil"], "active": last["active"], "samples": len(samples),
            "gil_active_samples": sum(1 for sample in samples if sample["owns_gil"] and sample["active"]),
            "line_moved": len(set(tops)) > 1 if several else None,
            "locals_moved": (len(set(local_digests)) > 1
                             if several and None not in local_digests else None)}


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

    def __init__(self, option="auto", runner=run_command, proc_root="/proc", sleep=time.sleep):
        self.option = option or "auto"
        self.runner = runner
        self.proc_root = proc_root
        self.sleep = sleep

    def read(self, processes, samples=1, local_values=False, helpers=None):
        """{pid: info} -> {"processes": [...], "unavailable": None or why}.

        Each process: pid, name, rank, state, thread, frames (innermost first: [function, file,
        line]), signature (of the last sample), cpu_seconds and faults (from `info`, for the
        classifier's rule), and combine_samples()'s owns_gil, active, samples, gil_active_samples,
        line_moved, locals_moved. samples: dumps per process, SAMPLE_SPACING apart (every process
        is dumped once per round); local_values: dump with --locals, for locals_moved; helpers: see find_py_spy.
        """
        py_spy, why = find_py_spy(self.option, processes, self.proc_root, helpers)
        if py_spy is None:
            return {"processes": [], "unavailable": why}
        taken = {}
        refused = None
        pids = [pid for pid in sorted(processes)
                if processes[pid].get("state") not in ("Z", "X") and is_python(pid, processes[pid], self.proc_root)]
        argv_tail = ["--json", "--nonblocking"] + (["--locals"] if local_values else [])
        for round_number in range(max(1, samples)):
            if round_number:
                self.sleep(SAMPLE_SPACING)
            for pid in pids:
                rc, out, err = self.runner([py_spy, "dump", "--pid", str(pid)] + argv_tail, timeout=DUMP_TIMEOUT)
                if rc != 0:
                    text = " ".join((err or out or "").split())
                    if any(word in text for word in NOT_PERMITTED):
                        refused = "py-spy may not read process %d: %s" % (pid, text[:200])
                    continue  # gone meanwhile, not Python after all, or a read that timed out
                try:
                    sample = parse_sample(out)
                except (ValueError, TypeError, AttributeError):
                    continue
                taken.setdefault(pid, []).append(sample)
        found = []
        rank_of = ranks.engine_ranks(processes)
        for pid in pids:
            if pid not in taken:
                continue
            info = processes[pid]
            last = taken[pid][-1]
            name = process_name(info)
            entry = {"pid": pid, "name": name, "rank": rank_of.get(pid),
                     "state": info.get("state"), "thread": last["thread"], "frames": last["frames"],
                     "signature": last["signature"],
                     "cpu_seconds": round(info.get("own_ticks", 0) / float(CLK_TCK), 2),
                     "faults": info.get("faults")}
            entry.update(combine_samples(taken[pid]))
            found.append(entry)
        unavailable = None
        if not found and refused:
            unavailable = "%s (run as root, or grant CAP_SYS_PTRACE where Yama's ptrace_scope is 1 or 2)" % refused
        return {"processes": found, "unavailable": unavailable}
