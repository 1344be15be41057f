"""The ranks' stacks from one read to the next: which busy processes stand still.

A process whose every Python frame is where it was at the previous read, and which faulted in
fewer than fault_threshold pages since, stands still: CPU it burns goes to a busy-wait (a hung
collective spins one core per rank and touches no memory). Legitimate silent work from one call
site (a layer-by-layer repack) looks the same from one read to the next but works on fresh buffers:
its page faults keep it moving. So does Python executing on one hot line: it holds the GIL and
its locals change between a read's quick samples (python_at_work). What follows from a process standing still (its CPU is no progress,
the stall clock runs from when it last moved) is the classifier's rule; this module keeps the record.
"""
import dataclasses
from typing import Any, Dict, Optional

# The ranks' stacks cost the host a py-spy run per Python process (~10-30 ms of CPU each, more for a
# large engine's ranks). Reads are spaced so that they take at most this share of one core, measured
# from the last read's own cost, but never more than STACKS_GAP_OF_STALL x stall_timeout apart, so a
# busy-spinning hang is still declared within a quarter of stall_timeout of its silent-hang bound.
STACKS_CPU_SHARE = 0.0025
STACKS_GAP_OF_STALL = 0.25


def python_at_work(proc):
    """Whether a read's process (host/stacks.py) is executing Python, not waiting in a native call.

    Python at work holds the GIL while it runs, and its innermost frame's line or locals change
    from one quick sample to the next, even on one hot line. A native call that busy-waits (NCCL's
    collectives, reached through torch, release the GIL) has neither; one that keeps the GIL (a
    regular expression backtracking in C) holds it, but its Python frame's locals stand still. One
    sample, or samples without the locals, cannot tell: then the process is not taken for work."""
    samples = proc.get("samples") or 0
    if samples < 2:
        return False
    held = (proc.get("gil_active_samples") or 0) * 2 > samples
    return bool(held and (proc.get("line_moved") or proc.get("locals_moved")))


@dataclasses.dataclass
class SpinTracker(object):
    """What the stack reads saw, per process. Times are the wait's (seconds since its first look).

    An entry (keyed by str(pid)) is the read's record of the process - pid, name, rank, state, thread,
    frames (innermost first, each [function, file, line]), sig (the stack's signature), faults (pages
    faulted in so far) - plus, across reads:
      function     the innermost frame's [function, file]
      in_since     since when it has been in that function (what `for 40s` says in a summary)
      since        since when its stack has not changed
      still_since  since when its stack has not changed and it faulted in no fresh memory
      faults0      its page faults at still_since
      python_at_work  the read found it executing Python (python_at_work()): never still
      still        its stack and memory stood still since the previous read
    The entries stay plain dicts: stack_summary.summarize reads the same shape.
    """
    entries: Dict[str, Dict[str, Any]] = dataclasses.field(default_factory=dict)
    read_t: Optional[float] = None  # when the latest read was
    read_cpu_s: float = 0.0  # what the latest read cost the host, in CPU seconds
    unavailable: Optional[str] = None  # why the latest read got no stacks (no py-spy, not permitted)
    # Each process's own CPU seconds at the previous look, to know what the standing ones burnt since.
    cpu_prev: Dict[str, float] = dataclasses.field(default_factory=dict)

    def fold(self, t, sample, alive_pids, fault_threshold):
        """Fold one read (host/stacks.py StackReader.read) made at `t` into the entries."""
        self.read_t = t
        self.read_cpu_s = sample.get("cpu_s") or 0.0
        self.unavailable = sample.get("unavailable")
        seen = {}
        for proc in sample.get("processes") or []:
            key = str(proc["pid"])
            prev = self.entries.get(key)
            faults = proc.get("faults") or 0
            entry = {"name": proc.get("name"), "rank": proc.get("rank"), "state": proc.get("state"),
                     "thread": proc.get("thread"), "frames": proc.get("frames") or [], "sig": proc.get("signature"),
                     "faults": faults, "pid": proc["pid"]}
            entry["python_at_work"] = python_at_work(proc)
            function = entry["frames"][0][:2] if entry["frames"] else None
            entry["in_since"] = prev["in_since"] if prev is not None and prev.get("function") == function else t
            entry["function"] = function
            if prev is None or prev["sig"] != entry["sig"]:
                entry.update(since=t, still_since=t, faults0=faults, still=False)
            elif faults - prev["faults0"] >= fault_threshold or entry["python_at_work"]:
                # The same frames, on fresh memory (a loop of long native calls at work), or Python
                # executing on one hot line: work, not a busy-wait.
                entry.update(since=prev["since"], still_since=t, faults0=faults, still=False)
            else:
                entry.update(since=prev["since"], still_since=prev["still_since"], faults0=prev["faults0"], still=True)
            seen[key] = entry
        # A live process whose read failed this time (py-spy timed out, the read raced a change)
        # keeps what the last read saw: a missed read is not a moved stack.
        alive = set(str(pid) for pid in alive_pids)
        for key, prev in self.entries.items():
            if key not in seen and key in alive:
                seen[key] = prev
        self.entries = seen

    def moved(self):
        """When the processes that stand still were last seen moving (their latest still_since)."""
        return max(entry["still_since"] for entry in self.entries.values() if entry["still"])

    def spinning_cpu_rate(self, cpu, elapsed):
        """Cores burnt over the last `elapsed` seconds by the processes that stand still, from each
        process's own CPU seconds now (`cpu`, by str(pid)); 0.0 without a previous look."""
        prev = self.cpu_prev
        self.cpu_prev = dict(cpu)
        if elapsed is None or elapsed <= 0:
            return 0.0
        spun = sum(max(0.0, cpu[key] - prev[key]) for key, entry in self.entries.items()
                   if entry["still"] and key in cpu and key in prev)
        return spun / elapsed

    def gap(self, stacks_interval, stall_timeout):
        """Seconds between two reads: stacks_interval, or more where the last read cost enough CPU
        (STACKS_CPU_SHARE), never more than STACKS_GAP_OF_STALL x stall_timeout."""
        return max(stacks_interval, min(self.read_cpu_s / STACKS_CPU_SHARE, stall_timeout * STACKS_GAP_OF_STALL))

    def shown(self, entries):
        """The entries as a verdict's `stacks`: by pid, each with how long its stack and its innermost
        function have not changed at the latest read."""
        return [{"pid": e["pid"], "name": e["name"], "rank": e["rank"], "state": e["state"],
                 "thread": e["thread"], "same_for": round(self.read_t - e["since"], 1),
                 "in_function_for": round(self.read_t - e["in_since"], 1),
                 "frames": [{"function": f[0], "file": f[1], "line": f[2]} for f in e["frames"]]}
                for e in sorted(entries, key=lambda e: e["pid"])]
