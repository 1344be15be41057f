"""What the classifier says of one look, as plain JSON-serialisable data: the answer to a Snapshot.

The module returns it, the launcher's STATUS= and metrics are written from it, the progress lines
show it.
"""
import dataclasses
from typing import Any, Dict, List, Optional

# The span over which Verdict.read_rate is measured.
RATE_WINDOW = 60.0


def windowed(samples, t, total):
    """[t, total] samples with this one added, keeping one at or before the window's start so that
    the rate spans the whole RATE_WINDOW."""
    samples = samples + [[t, total]]
    while len(samples) > 2 and samples[1][0] <= t - RATE_WINDOW:
        samples.pop(0)
    return samples


def window_rate(samples):
    """Units per second across windowed() samples, or None before two distinct times."""
    if len(samples) >= 2 and samples[-1][0] > samples[0][0]:
        return (samples[-1][1] - samples[0][1]) / (samples[-1][0] - samples[0][0])
    return None


@dataclasses.dataclass
class Verdict(object):
    phase: str
    msg: str
    evidence: List[str] = dataclasses.field(default_factory=list)
    terminal: bool = False
    rule: str = ""  # the terminal rule that ended the wait (readiness/rules.py), "" for any other verdict
    since: float = 0.0  # when the current phase began (seconds since the wait began)
    bytes_read: Optional[int] = None
    read_rate: Optional[float] = None  # bytes/s over the last RATE_WINDOW seconds
    fraction: Optional[float] = None  # 0..1 of the weights loaded
    eta: Optional[float] = None  # seconds until loading ends, when it can be estimated
    shards: Optional[List[int]] = None  # [n, N] from the engine's progress bar
    gpu: List[Dict[str, Any]] = dataclasses.field(default_factory=list)
    restarts: int = 0
    pid: Optional[int] = None
    engine: str = "auto"
    last_progress: Optional[Dict[str, Any]] = None  # {"t", "what"}
    phases: List[Dict[str, Any]] = dataclasses.field(default_factory=list)
    # The ranks' stacks at the latest read, when it is recent: per process pid, name, rank, state,
    # thread, frames (innermost first) and same_for (seconds its stack has not changed).
    stacks: List[Dict[str, Any]] = dataclasses.field(default_factory=list)
    where: str = ""  # those stacks in one line (stack_summary.summarize)
    stacks_unavailable: str = ""  # why the latest read got no stacks (no py-spy, not permitted)
    # Where the weights come from while they arrive other than from the local disk (readiness/
    # transfers.py): {"kind": download | stream | infiniband, "bytes" (since the wait began),
    # "rate" (bytes/s), "file" (a download's repo and file), "expected" (bytes, when known)}.
    source: Optional[Dict[str, Any]] = None
    # What the host's earlier starts of this model say (readiness/start_memory.py; None/False without
    # them): the usual duration of each phase, the seconds left until ready for the whole start, and
    # whether the current phase runs past 1.5x its usual length (said, not a failure).
    # A load far below the disk's measured rate for a while, named with its likely cause and what to
    # try (readiness/bottleneck.py): "loading at 575 MiB/s, 12x below this disk's 7.0 GB/s: ..."; "" otherwise.
    bottleneck: str = ""
    usual: Optional[Dict[str, float]] = None
    start_eta: Optional[float] = None
    slower_than_usual: bool = False

    def to_dict(self):
        return dataclasses.asdict(self)
