"""One poll's observations, as plain JSON-serialisable data: what the classifier judges.

A Snapshot is built by HostProbe on a real host, or replayed from a recorded trace in tests.
"""
import dataclasses
from typing import Any, Dict, List, Optional


@dataclasses.dataclass
class Snapshot(object):
    t: float  # seconds since the wait began (monotonic clock)
    # Process tree: {"root_pid", "alive", "pids", "cpu_seconds", "read_bytes", "write_bytes", "rchar",
    # "wchar", "states", "comms", "cpu", "ranks", "exits", "weight_files_open"}; ranks: str(pid) -> TP
    # index by title; exits: str(pid) -> a zombie's waitpid() status; weight_files_open: how many weight
    # files the tree holds open, read only at a look whose rchar outgrew read_bytes (else None). states/comms/cpu (own CPU seconds) map str(pid) -> value;
    # the byte totals (host/procfs.py IO_COUNTERS) are None when /proc/<pid>/io is unreadable, and
    # absent from traces recorded before they were read.
    process: Dict[str, Any] = dataclasses.field(default_factory=dict)
    unit: Optional[Dict[str, Any]] = None  # systemctl show properties (unit mode only)
    gpus: List[Dict[str, Any]] = dataclasses.field(default_factory=list)
    log_lines: List[str] = dataclasses.field(default_factory=list)  # new lines since last poll
    log_context: List[str] = dataclasses.field(default_factory=list)  # first read, maybe an earlier run
    http: Optional[Dict[str, Any]] = None  # http_probe.probe_ready() result
    listeners: Optional[List[Dict[str, Any]]] = None  # owners of the URL's port when it listens
    errors: List[str] = dataclasses.field(default_factory=list)  # signals that could not be read
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
    # Unit mode, a look taken while the run a restart replaces still stops (the wait began during its
    # drain): {"invocation", "state", "pid"} of that run; nothing else of this look is read. Else None.
    earlier_run: Optional[Dict[str, Any]] = None

    def to_dict(self):
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data):
        names = set(f.name for f in dataclasses.fields(cls))
        return cls(**dict((k, v) for k, v in data.items() if k in names))
