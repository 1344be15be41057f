"""Two looks in, events out: what changed since the previous look (readiness/state.py remembers it).

Events are facts, not judgements: bytes read or arriving, GPU memory moved, the process tree changed,
an HTTP answer changed, the launcher's news, a node joined, a log line (a marker, a crash line), a
rank gone and how it ended. The terminal rules (rules.py) and the phase machine (classifier.py) judge
them.
"""
import dataclasses
from typing import Dict, List, Optional

from ..common.formatting import mib
from . import engines
from .phases import INITIALIZING, LOADING, STARTING, later
from .state import TAIL_LINES, RankGone
from .status import status_news, status_phase, status_waiting
from .transfers import DOWNLOAD, INFINIBAND, STREAM, WRITTEN
from .verdict import windowed
from .wording import download_name, http_signature

# The kernel's Xid lines kept across looks.
XIDS_KEPT = 50
# Looks in a row of reads beyond the disk with no weight file open before they are called a stream.
STREAM_LOOKS = 2


@dataclasses.dataclass
class LookEvents(object):
    """What one look saw change. None: the signal could not be compared (first look, unreadable)."""
    log_lines: int = 0  # new log lines other than heartbeats and our own probes
    cpu_rate: Optional[float] = None  # the tree's cores since the previous look
    read_delta: Optional[int] = None  # the tree's read_bytes since the previous look
    transfers: List[str] = dataclasses.field(default_factory=list)  # weights arriving by the network, in words
    arriving: bool = False  # bytes of the weights arrived (a download, a stream, RDMA)
    gpu_changes: Dict[str, int] = dataclasses.field(default_factory=dict)  # str(GPU index) -> MiB changed
    tree_size: Optional[int] = None  # the process tree changed: its new size
    http_now: Optional[str] = None  # the HTTP answers changed: what they are now
    status_text: Optional[str] = None  # systemd's StatusText brought news
    launcher_waiting: Optional[str] = None  # what the launcher waits for before it starts the engine
    peers_joined: List[str] = dataclasses.field(default_factory=list)

    def gpu_rising(self):
        return any(change > 0 for change in self.gpu_changes.values())

    def progress(self, config, work_rate):
        """The events that count as progress, in words, in a fixed order; CPU only as `work_rate`
        (the tree's CPU less what spinning processes burnt: classifier.py)."""
        words = []
        if self.log_lines:
            words.append("%d new log line%s" % (self.log_lines, "" if self.log_lines == 1 else "s"))
        if work_rate is not None and work_rate >= config.cpu_threshold:
            words.append("CPU %.2f cores" % work_rate)
        if self.read_delta is not None and self.read_delta >= config.read_threshold:
            words.append("read_bytes +%s" % mib(self.read_delta))
        words += self.transfers
        if self.gpu_changes:
            biggest = max(self.gpu_changes.values(), key=abs)
            words.append("GPU memory %+d MiB on GPU %s" % (biggest, ",".join(sorted(self.gpu_changes, key=int))))
        if self.tree_size is not None:
            words.append("process tree changed (%d processes)" % self.tree_size)
        if self.http_now is not None:
            words.append("HTTP now %s" % self.http_now)
        if self.status_text is not None:
            words.append("systemd status %r" % self.status_text)
        if self.launcher_waiting:
            words.append("the launcher is %s" % self.launcher_waiting)
        words += ["node %s joined" % name for name in self.peers_joined]
        return words


def read_logs(state, lines, context):
    """Fold log lines into the state (markers, the crash line, the tail); return how many are news."""
    # In a first read that may hold earlier runs, a crash line counts only after the
    # marker that starts a run (the current one, as far as the read shows).
    run_seen = not context
    news = 0
    for line in lines:
        if state.engine == "auto":
            state.engine = engines.detect_engine(line) or "auto"
        kind, hint = engines.classify_line(state.engine, line)
        if kind == "probe":
            continue
        if kind == "run_start":
            run_seen = True
            state.new_run(line)
        state.tail = (state.tail + [line])[-TAIL_LINES:]
        if engines.listen_url(line):
            state.listen_url = engines.listen_url(line)
        if kind == "fatal" and run_seen and state.fatal is None:
            state.fatal = line
            state.fatal_in_context = context
        if kind == "heartbeat":
            continue
        shards = engines.shard_progress(line)
        if shards is not None:
            if list(shards) != state.shards and not context:
                news += 1  # a redraw of the same n/N is no news
            state.shards = list(shards)
            hint = LOADING
            kind = "marker"
        elif not context:
            news += 1
        if kind == "marker":
            if hint == engines.READY_HINT:
                state.ready_hint = True
                hint = INITIALIZING
            state.marker_phase = later(hint, state.marker_phase or STARTING)
            state.marker_line = line
    return news


def read(state, config, snap, t):
    """The events of this look against the previous one; the state keeps this look for the next."""
    proc = snap.process
    events = LookEvents()
    state.xids = (state.xids + list(snap.xids or []))[-XIDS_KEPT:]
    read_logs(state, snap.log_context, context=True)
    events.log_lines = read_logs(state, snap.log_lines, context=False)

    if proc.cpu_seconds is not None and state.cpu_prev is not None and state.t_prev is not None and snap.t > state.t_prev:
        events.cpu_rate = max(0.0, proc.cpu_seconds - state.cpu_prev) / (snap.t - state.t_prev)
    if proc.cpu_seconds is not None:
        state.cpu_prev = proc.cpu_seconds
    if proc.read_bytes is not None and state.read_prev is not None:
        events.read_delta = max(0, proc.read_bytes - state.read_prev)
    if proc.read_bytes is not None:
        state.read_prev = proc.read_bytes
    if events.read_delta is not None and events.read_delta >= config.read_threshold:
        state.last_read_t = t
        state.disk_loading_seen = True
    _transfers(state, config, snap, t, events)

    for gpu in snap.gpus:
        key = str(gpu["index"])
        prev = state.gpu_prev.get(key)
        used = gpu.get("memory_used_mib")
        if prev is not None and used is not None and abs(used - prev) >= config.gpu_memory_threshold:
            events.gpu_changes[key] = used - prev
        if used is not None:
            state.gpu_prev[key] = used
    pids = sorted(proc.pids)
    if state.pids_prev is not None and pids != state.pids_prev:
        events.tree_size = len(pids)
    state.pids_prev = pids
    http_sig = http_signature(snap.http)
    if state.http_prev is not None and http_sig != state.http_prev:
        events.http_now = http_sig
    state.http_prev = http_sig

    status_text = (snap.unit or {}).get("StatusText")
    # Only the launcher's news is progress, not its stacks' age ("| TP0-7 in f (x.py:1) for 40s").
    news = status_news(status_text)
    if state.status_prev is not None and news != state.status_prev:
        events.status_text = status_text
    state.status_prev = news
    state.status_phase = status_phase(status_text)
    # A launcher that waits for its turn on the GPUs (or a stopped instance's memory) has no engine
    # yet: its own clock bounds that wait, the other start's verdict ends it. Not a stall.
    starting_unit = (snap.unit or {}).get("ActiveState") == "activating"
    state.launcher_waiting = status_waiting(status_text) if starting_unit else None
    events.launcher_waiting = state.launcher_waiting

    if config.peers and snap.peers is not None:
        events.peers_joined = state.peers.observe(t, config.peers, snap.peers)
    if proc.rchar is not None:
        state.rchar_samples = windowed(state.rchar_samples, t, proc.rchar)
    if proc.read_bytes is not None:
        state.read_samples = windowed(state.read_samples, t, proc.read_bytes)
    _ranks_gone(state, proc, t)
    if config.unit and snap.unit is not None:
        _remember_unit(state, snap.unit)
    return events


def _remember_unit(state, unit):
    """The unit's first NRestarts and MainPID, and whether it was seen running: a restart is told by them."""
    if state.nrestarts is None and unit.get("NRestarts") is not None:
        state.nrestarts = unit["NRestarts"]
    if unit.get("ActiveState") in ("active", "activating", "reloading"):
        state.seen_running = True
        if unit.get("MainPID") and not state.main_pid:
            state.main_pid = unit["MainPID"]


def _ranks_gone(state, proc, t):
    """Record in state.ranks_gone the ranks seen alive at an earlier look that are gone now or zombies,
    each with how it ended when that can be read (a zombie's status)."""
    living = proc.living()
    gone = [RankGone(pid=key, rank=rank, t=t, status=proc.exits.get(key))
            for key, rank in sorted(state.ranks_seen.items()) if key not in living]
    for record in gone:
        del state.ranks_seen[record.pid]
    for key, rank in proc.ranks.items():
        if key in living:
            state.ranks_seen[key] = rank
    state.ranks_gone += gone


def _transfers(state, config, snap, t, events):
    """Weights arriving by the network (a hub download, a streamed or an RDMA load)."""
    proc = snap.process
    threshold = config.read_threshold
    transfers = state.transfers
    growth = transfers.fold(t, proc, snap.downloads, snap.ib_rcv_bytes)
    arriving = False
    # Any byte landing in a partial download is progress: a slow link must not look hung.
    if growth[DOWNLOAD]:
        events.transfers.append("download +%s (%s)" % (mib(growth[DOWNLOAD]), download_name(transfers.download or {})))
        transfers.arrived(t, DOWNLOAD)
        arriving = True
    elif growth[WRITTEN] is not None and growth[WRITTEN] >= threshold:
        events.transfers.append("written +%s" % mib(growth[WRITTEN]))
    beyond_disk = growth[STREAM] is not None and growth[STREAM] >= threshold
    no_weight_file = proc.weight_files_open == 0 and not transfers.downloaded()
    transfers.socket_looks = transfers.socket_looks + 1 if beyond_disk and no_weight_file else 0
    if beyond_disk:
        # A stream reads a socket, look after look, with no weight file open. Weight files open
        # (or just downloaded), or a burst such as Python's imports: the page cache.
        if transfers.socket_looks >= STREAM_LOOKS:
            events.transfers.append("socket reads +%s (rchar beyond read_bytes)" % mib(growth[STREAM]))
            transfers.arrived(t, STREAM)
            arriving = True
        else:
            events.transfers.append("reads +%s from the page cache (rchar beyond read_bytes)" % mib(growth[STREAM]))
            # Weights read back from the cache are loading; with no weight file open it may be
            # Python's imports: progress, but no sign of loading.
            arriving = arriving or bool(proc.weight_files_open) or transfers.downloaded()
    # Received over InfiniBand: the host's ports count for every job, so only while loading.
    if growth[INFINIBAND] is not None and growth[INFINIBAND] >= threshold and state.phase in (STARTING, LOADING):
        events.transfers.append("InfiniBand received +%s" % mib(growth[INFINIBAND]))
        transfers.arrived(t, INFINIBAND)
        arriving = True
    if arriving:
        state.last_read_t = t
        state.disk_loading_seen = True
    events.arriving = arriving
