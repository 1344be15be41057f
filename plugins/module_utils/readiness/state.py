"""What the classifier remembers from one look to the next (ClassifierState), and the record of a rank
that is gone (RankGone). Times (`*_t`, `start`) are the wait's: seconds since its first look; t0 and
t_prev are snapshot clocks."""
import dataclasses
from typing import Any, Dict, List, Optional

from . import bottleneck
from .peers import PeerTracker
from .phases import STARTING
from .spin import SpinTracker
from .transfers import TransferTracker

# The run's last log lines kept (a failure's evidence is read from them).
TAIL_LINES = 200


@dataclasses.dataclass
class RankGone(object):
    """A rank seen alive at an earlier look and gone (or a zombie) now."""
    pid: str
    rank: int
    t: float  # the look that found it gone
    status: Optional[int] = None  # its waitpid() status, read while it was a zombie; None: reaped unseen
    # The start made progress after it ended: an end that proves no death is then only a note, for good.
    went_on: bool = False

    def hard(self):
        """It ended by a signal or a non-zero exit: a death. An exit 0, or an end nobody saw, proves none."""
        return self.status is not None and self.status != 0


@dataclasses.dataclass
class ClassifierState(object):
    """What the classifier remembers from one look to the next. Times (`*_t`, `start`) are the wait's:
    seconds since its first look; t0 and t_prev are snapshot clocks."""
    engine: str  # sglang or vllm; auto until a log line tells which
    t0: Optional[float] = None  # the first look's snapshot clock
    t_prev: Optional[float] = None  # the previous look's snapshot clock
    phase: Optional[str] = None  # the latest verdict's phase
    phases: List[Dict[str, Any]] = dataclasses.field(default_factory=list)  # [{phase, start, duration}]

    # The current run's log: lines before a run-start marker belong to an earlier run.
    marker_phase: Optional[str] = None  # the furthest phase the run's log markers reached
    marker_line: Optional[str] = None  # the line of the latest marker (a verdict's evidence)
    ready_hint: bool = False  # the engine logged that it is ready (the ready check still decides)
    tail: List[str] = dataclasses.field(default_factory=list)  # the run's last TAIL_LINES lines
    fatal: Optional[str] = None  # the run's first crash line
    fatal_waited: bool = False  # one more look was given to the traceback that names its cause
    # The crash line was found only in the first read, which may hold earlier runs (a file appended to
    # across restarts): its run-start line may be an earlier run's, and this run's may still come.
    fatal_in_context: bool = False
    rank_death_waited: bool = False  # one more look was given to the engine's own word on a dead rank
    listen_url: Optional[str] = None  # where the server logged that it listens
    status_phase: Optional[str] = None  # the phase a notify unit's launcher names in its STATUS=
    launcher_waiting: Optional[str] = None  # what the launcher waits for before it starts the engine (its turn)

    # Loading.
    shards: Optional[List[int]] = None  # [n, N] from the engine's progress bar
    load_t: Optional[float] = None  # when loading began
    load_read0: Optional[int] = None  # read_bytes before loading began (imports, libraries: no weights)
    read_samples: List[List[float]] = dataclasses.field(default_factory=list)  # [t, read_bytes] over RATE_WINDOW
    last_read_t: Optional[float] = None  # the latest look that read at least read_threshold bytes
    rchar_samples: List[List[float]] = dataclasses.field(default_factory=list)  # [t, rchar] over RATE_WINDOW
    # Since when the load has run far below the disk's measured rate (readiness/bottleneck.py).
    slow_load: bottleneck.SlowLoadWindow = dataclasses.field(default_factory=bottleneck.SlowLoadWindow)
    disk_loading_seen: bool = False  # some look did

    # The previous look's signals, to tell what changed.
    cpu_prev: Optional[float] = None  # the tree's CPU seconds
    read_prev: Optional[int] = None  # the tree's read_bytes
    gpu_prev: Dict[str, int] = dataclasses.field(default_factory=dict)  # str(GPU index) -> memory used, MiB
    http_prev: Optional[str] = None  # the HTTP answers in short (_http_signature)
    status_prev: Optional[str] = None  # the news in systemd's StatusText (status_news)
    pids_prev: Optional[List[int]] = None  # the server's processes

    # Progress.
    last_progress_t: Optional[float] = None  # the latest look that saw progress
    last_progress: Optional[str] = None  # what it saw, in words
    noncpu_progress_t: Optional[float] = None  # the latest look that saw progress other than CPU
    noncpu_progress: Optional[str] = None  # what it saw
    silent: bool = False  # the last look saw nothing move but (maybe) CPU: time to read the stacks
    spin_note: Optional[str] = None  # the busy-wait found at the last look, for messages
    completion_hung: bool = False  # the last look's completion timed out (see Classifier.completion_hung)

    # A systemd unit.
    main_pid: Optional[int] = None  # its MainPID once seen running
    nrestarts: Optional[int] = None  # its NRestarts at the first look
    seen_running: bool = False  # seen active, activating or reloading

    stacks: SpinTracker = dataclasses.field(default_factory=SpinTracker)  # the ranks' stacks
    transfers: TransferTracker = dataclasses.field(default_factory=TransferTracker)  # downloads, streams, RDMA
    # The ranks seen alive, by str(pid) -> TP index, and those gone since (events.py), to name the one that dies.
    ranks_seen: Dict[str, int] = dataclasses.field(default_factory=dict)
    ranks_gone: List[RankGone] = dataclasses.field(default_factory=list)
    peers: PeerTracker = dataclasses.field(default_factory=PeerTracker)  # a multi-node group's other nodes
    xids: List[Dict[str, Any]] = dataclasses.field(default_factory=list)  # the kernel's Xid lines seen (Snapshot.xids)

    def phase_start(self, phase, t):
        """When the latest stretch of `phase` began, or `t` when it is new."""
        for entry in reversed(self.phases):
            if entry["phase"] == phase:
                return entry["start"]
        return t

    def new_run(self, line):
        """A run-start marker (`line`): what the log said of an earlier run no longer counts."""
        self.tail = []
        self.fatal = None
        self.fatal_waited = False
        self.fatal_in_context = False
        self.shards = None
        self.marker_phase = STARTING
        self.marker_line = line
        self.ready_hint = False
