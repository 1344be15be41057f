"""What a verdict carries beside its words: bytes read and the rate, the fraction loaded and the ETA,
the GPUs, the restarts, the phases so far, the ranks' stacks, where the weights come from, a slow
load's likely cause, the Xid lines and the ranks that ended without proving a death."""
import copy

from . import bottleneck
from .phases import FAILED, LOADING, STARTING, order
from .rules import rank_notes
from .stack_summary import summarize
from .transfers import DOWNLOAD
from .verdict import window_rate
from .wording import download_name, xid_quotes


def fill(verdict, state, config, t, snap, entries, where_note):
    """verdict with its details filled from the state at this look; entries: the recent stacks."""
    proc = snap.process
    verdict.since = state.phase_start(verdict.phase, t)
    verdict.bytes_read = proc.read_bytes
    rate = window_rate(state.read_samples)
    if rate is not None:
        verdict.read_rate = round(rate, 1)
    verdict.shards = state.shards
    loaded = order(state.phase) > order(LOADING)
    if state.shards:
        verdict.fraction = round(float(state.shards[0]) / state.shards[1], 4) if state.shards[1] else None
    elif config.expected_bytes and verdict.bytes_read is not None:
        verdict.fraction = round(min(float(verdict.bytes_read) / config.expected_bytes, 0.99), 4)
    if loaded and verdict.fraction is not None:
        verdict.fraction = 1.0
    if state.phase == LOADING:
        verdict.eta = _eta(state, config, t, verdict)
    verdict.gpu = [{"index": g["index"], "memory_used_mib": g.get("memory_used_mib"),
                    "utilization": g.get("utilization")} for g in snap.gpus]
    unit = snap.unit or {}
    if unit.get("NRestarts") is not None and state.nrestarts is not None:
        verdict.restarts = unit["NRestarts"] - state.nrestarts
    verdict.pid = unit.get("MainPID") or proc.root_pid or config.pid
    verdict.engine = state.engine
    if state.last_progress_t is not None:
        verdict.last_progress = {"t": round(state.last_progress_t, 1), "what": state.last_progress}
    verdict.phases = copy.deepcopy(state.phases)
    verdict.stacks = state.stacks.shown(entries)
    verdict.where = summarize(entries, state.stacks.read_t, seconds=False, short=True) if entries else ""
    verdict.stacks_unavailable = state.stacks.unavailable or ""
    verdict.source = _source(state, config, snap, t)
    verdict.bottleneck = _bottleneck(state, config, t, verdict)
    if verdict.bottleneck:
        verdict.msg += "; " + verdict.bottleneck
    if verdict.phase == FAILED and entries and "; the ranks' stacks: " not in verdict.msg:
        verdict.msg += where_note
    extra = xid_quotes(state, config) + ([] if verdict.terminal else rank_notes(state))
    verdict.evidence = verdict.evidence + [quote for quote in extra if quote not in verdict.evidence]
    return verdict


def _eta(state, config, t, verdict):
    if config.expected_bytes and verdict.read_rate and verdict.bytes_read is not None:
        return round(max(0.0, config.expected_bytes - verdict.bytes_read) / verdict.read_rate, 1)
    shards = state.shards
    if shards and shards[0] > 0 and state.load_t is not None and t > state.load_t:
        return round((t - state.load_t) / shards[0] * (shards[1] - shards[0]), 1)
    return None


def _source(state, config, snap, t):
    """The network source of the weights while they arrive (a verdict's `source`), else None."""
    transfers = state.transfers
    if transfers.source is None or state.phase not in (STARTING, LOADING):
        return None
    if config.poll_interval and transfers.source_t is not None and t - transfers.source_t > 2 * config.poll_interval + 1:
        return None  # nothing came that way lately: it is not where the weights come from now
    if transfers.source == DOWNLOAD and not (snap.downloads or {}).get("files"):
        return None  # downloaded: what loads now comes from the cache's files
    source = {"kind": transfers.source, "bytes": transfers.totals[transfers.source],
              "rate": None if transfers.rate() is None else round(transfers.rate(), 1),
              "file": None, "expected": None}
    if transfers.source == DOWNLOAD:
        source["file"] = download_name(transfers.download or {})
        source["expected"] = (snap.downloads or {}).get("expected")
    return source


def _bottleneck(state, config, t, verdict):
    """The slow-load line while loading runs far below the disk's measured rate for a while, else "".

    The load's rate is what the tree reads: from the disk (read_bytes) or with read() calls
    (rchar, which also counts reads served by the page cache), whichever is more. Which of the
    two moves tells the cause (bottleneck.cause); weights from the network are not the disk's.
    """
    # Rates over the window since loading began: the imports before it are no part of the load.
    began = state.load_t if state.load_t is not None else t
    read_bytes_rate = window_rate([sample for sample in state.read_samples if sample[0] >= began])
    rchar_rate = window_rate([sample for sample in state.rchar_samples if sample[0] >= began])
    loading = verdict.phase == LOADING and verdict.source is None and read_bytes_rate is not None
    load_rate = max(read_bytes_rate or 0.0, rchar_rate or 0.0) if loading else None
    slow_for = state.slow_load.observe(t, load_rate, config.disk_rate)
    if not loading:
        return ""
    return bottleneck.diagnose(load_rate, config.disk_rate, state.engine, read_bytes_rate=read_bytes_rate,
                               rchar_rate=rchar_rate, slow_for=slow_for, tensor_parallel=config.tensor_parallel) or ""
