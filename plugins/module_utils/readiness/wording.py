"""The words of a verdict: what the signals show, why a check cannot pass, what a failure quotes.

Pure functions of the classifier's state (readiness/state.py), its settings and the look: no judgement
is made here, only said.
"""
from urllib.parse import urlparse

from ..common.formatting import exit_words, http_result, mib
from . import engines, xid

STATE_WORDS = {"T": "stopped", "t": "stopped by a tracer", "D": "in uninterruptible disk sleep", "Z": "a zombie"}
# The kernel's Xid lines quoted in a verdict's evidence.
XIDS_QUOTED = 5
# A host whose run queue holds this many runnable processes per core, or whose 1-minute load is
# that high, is saturated: its ranks wait for a CPU, which the stacks cannot tell from a spin.
SATURATED_PER_CORE = 2.0


def secs(seconds):
    return "%d s" % round(seconds)


def http_signature(http):
    """The HTTP answers in short: `/health 200, /models refused`; None before any probe."""
    if http is None:
        return None
    parts = []
    for name in ("health", "models", "completion"):
        result = getattr(http, name)
        if result is not None:
            parts.append("/%s %s" % (name, result.code if result.kind == "status" else result.kind))
    return ", ".join(parts)


def picture(state, snap, proc, cpu_rate):
    """What the signals show now, in words, for messages."""
    parts = []
    if cpu_rate is not None:
        parts.append("CPU %.2f cores" % cpu_rate)
    if proc.read_bytes is not None:
        parts.append("read_bytes %s" % mib(proc.read_bytes))
    if state.shards:
        parts.append("shards %d/%d" % tuple(state.shards))
    if snap.gpus:
        parts.append("GPU memory %s MiB, utilisation %s %%" % (
            "/".join(str(g.get("memory_used_mib")) for g in snap.gpus),
            "/".join(str(g.get("utilization")) for g in snap.gpus)))
    sig = http_signature(snap.http)
    if sig:
        parts.append("HTTP " + sig)
    odd = ["process %s state %s (%s)" % (pid, letter, STATE_WORDS[letter])
           for pid, letter in sorted(proc.states.items()) if letter in STATE_WORDS]
    parts.extend(odd[:4])
    return ", ".join(parts) or "no signals"


def http_notes(state, config, http):
    """Why the HTTP answers cannot pass, when the reason is plain: a wrong port, a missing key."""
    if http is None:
        return ""
    notes = []
    logged = state.listen_url
    if logged and http.health is not None and http.health.kind == "refused":
        try:
            logged_port = urlparse(logged).port
        except ValueError:
            logged_port = None
        if logged_port and logged_port != config.port():
            notes.append("the server logged that it listens on %s, not on port %d of the url: fix the url"
                         % (logged, config.port()))
    denied = [name for name in ("models", "completion") if http.status(name) in (401, 403)]
    if denied:
        notes.append("/%s answers %d: %s" % (denied[0], http.status(denied[0]),
                                             "the api_key was refused" if config.api_key
                                             else "the server wants an api_key"))
    return "".join("; " + note for note in notes)


def ready_reason(config, http):
    if config.ready_check == "completion":
        return "a completion for model %r answered 200 with choices" % http.model
    return "GET /%s answered 200" % ("health" if config.ready_check == "health" else "v1/models")


def crash_evidence(state):
    return engines.crash_evidence(state.tail)


def hang_evidence(state, http):
    """The last log lines, after a hung request's own account: a hung vLLM still answers /health."""
    evidence = state.tail[-10:]
    completion = http.completion if http is not None else None
    if completion is not None and completion.kind == "timeout":
        evidence = ["POST /v1/completions (model %r): %s, while GET /health answered %s"
                    % (http.model, completion.error, http_result(http.health))] + evidence
    elif http is not None and http.health is not None and http.health.kind == "timeout":
        evidence = ["GET /health: %s: the server accepts connections and answers nothing" % http.health.error] + evidence
    return evidence


# -- the ranks ---------------------------------------------------------------------------------------
def rank_gone(gone):
    """`rank TP2 (pid 4242) died (killed by signal 9 (SIGKILL))`, or for an end that proves no death
    `rank TP2 (pid 4242) ended (exit status 0)` / `... is gone (exit status unknown: reaped)`."""
    if gone.hard():
        how = "died"
    else:
        how = "ended" if gone.status is not None else "is gone"
    return "rank TP%s (pid %s) %s (%s)" % (gone.rank, gone.pid, how, exit_words(gone.status))


def survivors(proc):
    """`TP0 (pid 101), pid 100 (python3)`: the server's living processes, its ranks by rank."""
    living = proc.living()
    return ["TP%s (pid %s)" % (proc.ranks[key], key) if key in proc.ranks
            else "pid %s (%s)" % (key, proc.comms.get(key) or "?") for key in sorted(living, key=int)]


def rank_death_note(deaths, proc):
    """`; rank TP2 (pid 4242) died (exit status 1); still alive: ...`, or "" when no rank died."""
    if not deaths:
        return ""
    note = "; " + "; ".join("rank TP%s (pid %s) died (%s)" % (g.rank, g.pid, exit_words(g.status)) for g in deaths)
    alive = survivors(proc)
    if alive:
        note += "; still alive: %s: they wait for it and cannot go on without it" % ", ".join(alive[:12])
    return note


# -- the other nodes of a multi-node group ------------------------------------------------------------
def peer_name(config, name):
    return "node %s (%s)" % (name, ", ".join(config.peers[name]))


def peer_notes(state, config):
    """What keeps the group from completing, for any verdict's message ("" when nothing)."""
    notes = []
    for name, peer in sorted(state.peers.nodes.items()):
        if peer.left_t is not None:
            notes.append("%s left the group at +%s" % (peer_name(config, name), secs(peer.left_t)))
        elif peer.joined_t is None:
            notes.append("%s has not joined the group (no connection on the dist-init port %d)"
                         % (peer_name(config, name), config.peer_port))
    return "".join("; " + note for note in notes)


# -- the network and the host -------------------------------------------------------------------------
def download_name(download):
    """`org/name model-00003-of-00064.safetensors`, or where the file's name is not on disk yet (the hub
    cache links it only once complete) its blob, short: `org/name blob 4bed0b2e3919`."""
    what = download.get("file")
    if not what and download.get("blob"):
        what = "blob " + download["blob"].split(".")[0][:12]
    return " ".join(part for part in (download.get("repo"), what) if part) or "a file"


def network_note(state, snap, t):
    """Why a stall looks like the network's: a download that stopped, for which file."""
    transfers = state.transfers
    files = (snap.downloads or {}).get("files") or []
    if not files or transfers.download is None:
        return ""
    download = transfers.download
    return ("; waiting on the network: the download of %s stopped at %s, no byte for %s"
            % (download_name(download), mib(download.get("bytes") or 0), secs(t - (transfers.download_t or 0.0))))


def saturated(load):
    if not load or not load.get("cores"):
        return False
    limit = SATURATED_PER_CORE * load["cores"]
    return (load.get("runnable") or 0) > limit or (load.get("load1") or 0.0) > limit


def saturation_note(load):
    if not saturated(load):
        return ""
    return ("; the host's CPUs are saturated (%d runnable, load %.1f on %d cores): the ranks may be starved "
            "of CPU rather than hung" % (load.get("runnable") or 0, load.get("load1") or 0.0, load["cores"]))


# -- the kernel's Xid lines ---------------------------------------------------------------------------
def xid_gpu(record):
    """`GPU 3 (PCI 0000:41:00)`, or `the GPU at PCI 0000:41:00` when the driver could not say which."""
    if record.get("gpu") is None:
        return "the GPU at PCI %s" % record.get("pci")
    return "GPU %d (PCI %s)" % (record["gpu"], record.get("pci"))


def xid_watched(config, record):
    """Whether an Xid names a GPU of this wait: any GPU when all are watched; with `gpus` given,
    only those (another GPU of a shared host may be another model's)."""
    if config.gpus is None:
        return True
    return record.get("gpu") is not None and record["gpu"] in config.gpus


def xid_quotes(state, config):
    """The Xid lines that did not fail the wait, in words, for any verdict's evidence."""
    quotes = []
    for record in state.xids:
        meaning, severity, _action = xid.describe(record["code"])
        if severity == xid.FATAL and xid_watched(config, record):
            continue  # the failure's own evidence
        why = "not a watched GPU" if severity == xid.FATAL else severity
        quotes.append("kernel: %s [Xid %d on %s: %s; %s]" % (record["line"], record["code"], xid_gpu(record), meaning, why))
    return quotes[-XIDS_QUOTED:]
