"""One poll's observations, as plain JSON-serialisable data: what the classifier judges.

A Snapshot is built by HostProbe on a real host, or replayed from a recorded trace in tests.
"""
import dataclasses
from typing import Any, Dict, List, Optional


@dataclasses.dataclass
class ProcessTree(object):
    """The server's processes at one look (readiness/probe.py). Maps are keyed by str(pid) (JSON keys).
    The byte totals (host/procfs.py IO_COUNTERS) are None when /proc/<pid>/io is unreadable, and
    absent from traces recorded before they were read."""
    root_pid: Optional[int] = None  # the unit's MainPID, or the watched pid
    alive: Optional[bool] = None  # the server runs (None: not read, as in a unit look with no tree)
    pids: List[int] = dataclasses.field(default_factory=list)  # the living processes
    cpu_seconds: Optional[float] = None  # the tree's CPU, reaped children's included
    read_bytes: Optional[int] = None
    write_bytes: Optional[int] = None
    rchar: Optional[int] = None
    wchar: Optional[int] = None
    states: Dict[str, str] = dataclasses.field(default_factory=dict)  # pid -> /proc state letter
    comms: Dict[str, str] = dataclasses.field(default_factory=dict)  # pid -> comm
    cpu: Dict[str, float] = dataclasses.field(default_factory=dict)  # pid -> its own CPU seconds
    # pid -> TP index of the processes the engine made ranks (host/ranks.py: its own title, not a
    # title inherited by fork()).
    ranks: Dict[str, int] = dataclasses.field(default_factory=dict)
    # pid -> a zombie's waitpid() status: how a process that died unreaped ended.
    exits: Dict[str, int] = dataclasses.field(default_factory=dict)
    # How many weight files the tree holds open, read only at a look whose rchar outgrew read_bytes.
    weight_files_open: Optional[int] = None

    @classmethod
    def from_dict(cls, data):
        """From a recorded trace's dict; a key that is no field is an error, never read as None."""
        return cls(**data)

    def living(self):
        """The str(pid)s of the processes alive at this look (neither zombie nor dead)."""
        return set(key for key, state in self.states.items() if state not in ("Z", "X"))


@dataclasses.dataclass
class HttpResult(object):
    """One request's outcome (host/http_probe.py request()): kind is status, refused, timeout or error."""
    kind: str
    code: Optional[int] = None  # the HTTP status, for kind status
    body: Optional[str] = None
    error: Optional[str] = None  # why there is no status


@dataclasses.dataclass
class HttpAnswers(object):
    """The ready check's requests at one look (host/http_probe.py probe_ready()); a request not made is None."""
    health: Optional[HttpResult] = None
    models: Optional[HttpResult] = None
    completion: Optional[HttpResult] = None
    model: Optional[str] = None  # the model name the completion asked for
    ready: bool = False  # the ready check passed
    listening: bool = False  # something answers on the port (a status or a timeout, not a refusal)

    @classmethod
    def from_dict(cls, data):
        """From probe_ready()'s dict or a recorded trace's; a key that is no field is an error."""
        requests = dict((name, HttpResult(**data[name]) if data.get(name) else None)
                        for name in ("health", "models", "completion"))
        return cls(**dict(data, **requests))

    def status(self, name):
        """The HTTP status `name` (health, models, completion) answered, else None."""
        result = getattr(self, name)
        return result.code if result is not None and result.kind == "status" else None


@dataclasses.dataclass
class Snapshot(object):
    t: float  # seconds since the wait began (monotonic clock)
    process: ProcessTree = dataclasses.field(default_factory=ProcessTree)  # a dict is read as one
    unit: Optional[Dict[str, Any]] = None  # systemctl show properties (unit mode only)
    gpus: List[Dict[str, Any]] = dataclasses.field(default_factory=list)
    log_lines: List[str] = dataclasses.field(default_factory=list)  # new lines since last poll
    log_context: List[str] = dataclasses.field(default_factory=list)  # first read, maybe an earlier run
    http: Optional[HttpAnswers] = None  # the ready check's requests (a dict is read as one); None: none made
    listeners: Optional[List[Dict[str, Any]]] = None  # owners of the URL's port when it listens
    errors: List[str] = dataclasses.field(default_factory=list)  # signals that could not be read: warnings
    # What a look could not read because the host has no such thing (no kernel log in a container or
    # guest): normal, said once in the result's evidence, never as a warning.
    notes: List[str] = dataclasses.field(default_factory=list)
    # The Python stacks of the server's processes when this look read them (host/stacks.py
    # StackReader.read: {"processes": [...], "unavailable": None or why}), else None.
    stacks: Optional[Dict[str, Any]] = None
    # Multi-node: per other node, its established connections to the dist-init port, each
    # "remote_ip:remote_port>local_port" (the same string while the same connection lives).
    peers: Optional[Dict[str, List[str]]] = None
    # Hub downloads in progress (host/hub_cache.py downloads(): {"caches", "files": [{"repo",
    # "blob", "file", "bytes", "path"}], "bytes", "expected"}); None where not looked at.
    downloads: Optional[Dict[str, Any]] = None
    # Bytes received over the host's InfiniBand ports (host/infiniband.py, x4 applied); None
    # without an HCA. ib_ports: per "<device>/<port>", {"rcv_bytes", "xmit_bytes"}.
    ib_rcv_bytes: Optional[int] = None
    ib_ports: Optional[Dict[str, Dict[str, Optional[int]]]] = None
    # The host's CPU pressure (host/procfs.py load(): {"runnable", "load1", "cores"}): a stall on a
    # saturated host may be starvation, not a hang.
    load: Optional[Dict[str, Any]] = None
    # The kernel's NVIDIA Xid lines new at this look, since the server's start (readiness/xid.py
    # parse(), with "gpu": the GPU's index by its PCI id, None when the driver could not tell; and
    # "usec": the record's time since boot); None where the kernel log was not read.
    xids: Optional[List[Dict[str, Any]]] = None
    # Unit mode, a unit whose launcher stopped a crash loop (exit status EXIT_CRASH_LOOP): its record of
    # failed starts (host/failed_starts.py), or {"error": why it could not be read}; else None.
    crash_loop: Optional[Dict[str, Any]] = None
    # Unit mode: the failed start the unit's launcher recorded during this wait (host/failed_starts.py's
    # entry, {"cause", "started", "ended", "status"}, with the record's "evidence"), else None. It names
    # what a restarted run died of before its last lines reach the journal.
    failed_start: Optional[Dict[str, Any]] = None
    # Unit mode, a look taken while the run a restart replaces still stops (the wait began during its
    # drain): {"invocation", "state", "pid"} of that run; nothing else of this look is read. Else None.
    earlier_run: Optional[Dict[str, Any]] = None

    def __post_init__(self):
        if isinstance(self.process, dict):
            self.process = ProcessTree.from_dict(self.process)
        if isinstance(self.http, dict):
            self.http = HttpAnswers.from_dict(self.http) if self.http else None

    def to_dict(self):
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data):
        names = set(f.name for f in dataclasses.fields(cls))
        return cls(**dict((k, v) for k, v in data.items() if k in names))
