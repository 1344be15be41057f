"""The wait's settings, validated up front: bad input fails before anything is observed."""
import dataclasses
import glob
import ipaddress
import os
import re
import socket
from typing import Dict, List, Optional

from urllib.parse import urlparse

from ..common.addresses import is_local
from ..common.errors import InputError

ENGINES = ("sglang", "vllm", "auto")
READY_CHECKS = ("completion", "health", "models")
WEIGHT_PATTERNS = ("*.safetensors", "*.bin", "*.pt", "*.gguf")
UNIT_NAME = re.compile(r"^[A-Za-z0-9:_.\\@-]+$")
# stall_timeout and timeout may be `auto`: derived from the host's record of earlier starts when the
# wait begins (readiness/start_memory.py resolve_budgets); these defaults stand until then.
AUTO = "auto"
DEFAULT_TIMEOUT = 3600
DEFAULT_STALL_TIMEOUT = 600
# systemd's start budget (TimeoutStartSec=, renewed by EXTEND_TIMEOUT_USEC) over the stall bound: the
# launcher must have said why a start hangs before systemd ends it.
STALL_BUDGET_MARGIN = 30


def stall_budget_minimum(stall_timeout, poll_interval, stacks_interval=0):
    """The least start budget that lets a hang be declared: a spinning one is declared at most a stack
    read (stacks_interval) and two looks later than the stall bound. `auto` counts as the default."""
    stall = DEFAULT_STALL_TIMEOUT if str(stall_timeout) == "auto" else float(stall_timeout)
    return stall + float(stacks_interval) + 2 * float(poll_interval)


def stall_budget(stall_timeout, poll_interval, stacks_interval=0):
    """The start budget systemd gives a notify unit and the launcher renews at every sign of progress (s):
    one formula for the role's TimeoutStartSec= and --extend-timeout and the launcher's default."""
    return stall_budget_minimum(stall_timeout, poll_interval, stacks_interval) + STALL_BUDGET_MARGIN


@dataclasses.dataclass
class WaitConfig(object):
    url: str
    engine: str = "auto"
    unit: Optional[str] = None
    pid: Optional[int] = None
    log_path: Optional[str] = None
    # The engine's output reaches the classifier by another way than unit/log_path (the
    # launcher's pipe): reads before its first line are imports, not silent loading.
    follows_log: bool = False
    ready_check: str = "completion"
    model: Optional[str] = None
    api_key: Optional[str] = dataclasses.field(default=None, repr=False)
    timeout: float = DEFAULT_TIMEOUT
    stall_timeout: float = DEFAULT_STALL_TIMEOUT
    poll_interval: float = 5
    model_path: Optional[str] = None
    expected_bytes: Optional[int] = None
    gpus: Optional[List[int]] = None
    progress_path: Optional[str] = None
    # Progress thresholds: above them a signal counts as "the server is doing something".
    # Idle Python threads burn a little CPU; a SIGSTOPped or deadlocked tree burns none.
    cpu_threshold: float = 0.05  # cores, averaged since the previous poll
    read_threshold: int = 1024 * 1024  # bytes read from disk since the previous poll
    gpu_memory_threshold: int = 64  # MiB change on any watched GPU
    # Reading stopped this long while the CPU works: loading is over, initialisation runs.
    load_quiet_window: float = 60
    completion_timeout: float = 30
    # The ranks' Python stacks (host/stacks.py): py-spy's path, "auto" (the engine venv's bin/,
    # then PATH) or "off"; read during silent looks, at most every stacks_interval seconds (0:
    # every silent look). A busy process whose stack has not moved and that faulted in fewer than
    # fault_threshold pages since is spinning, not working (classifier.py).
    py_spy: str = "auto"
    stacks_interval: float = 0
    fault_threshold: int = 256  # pages (1 MiB): a layer's fresh buffer is thousands
    # A multi-node server: the other nodes of the group (name -> its IP addresses) and the
    # dist-init port their engines keep connected to node 0 (torch's TCPStore). A node whose
    # connections close has left the group; one never seen has not joined it.
    peers: Optional[Dict[str, List[str]]] = None
    peer_port: Optional[int] = None
    # The disk's cold sequential read rate under the model, bytes/s (the GPU preflight's measure,
    # host/storage.py), and the ranks on this host: a load far below that rate is named, with its
    # likely cause (readiness/bottleneck.py). None: not measured, no such line.
    disk_rate: Optional[float] = None
    tensor_parallel: int = 1
    # `auto` budgets not resolved yet (start_memory.resolve_budgets): stall_timeout / timeout hold the defaults.
    stall_timeout_auto: bool = False
    timeout_auto: bool = False
    # The launcher's engine runs in a container (runtime podman): its processes are found in the launcher's
    # cgroup, outside its session, not only below its child (host/container_engine.py).
    engine_in_cgroup: bool = False
    # Or in a Docker container of this name (runtime docker): its processes are the container's cgroup's,
    # outside the unit's (host/container_engine.py's DockerContainer).
    engine_container: Optional[str] = None
    # Pid mode with log_path: the process had already exited when the wait began (set by the probe, which
    # reads the process; it refuses instead when another process serves the URL: a stale pid, not a crash).
    # The wait judges it from its log.
    pid_exited_before_wait: bool = False

    def for_started_server(self, pid):
        """This config for the server the caller has just started as `pid` (the launcher's engine):
        build_config(..., starts_server=True) validated everything else before it ran."""
        if not self.follows_log or self.unit is not None or self.pid is not None:
            raise ValueError("for_started_server: only a config built with starts_server=True takes the pid later")
        return dataclasses.replace(self, pid=pid)

    def port(self):
        parsed = urlparse(self.url)
        return parsed.port or (443 if parsed.scheme == "https" else 80)

    def url_is_local(self):
        """The URL names this host's loopback or wildcard address: its port's owner is visible here."""
        return is_local(urlparse(self.url).hostname)


def weights_size(model_path):
    """Total bytes of the weight files in model_path (the first pattern that matches any)."""
    for pattern in WEIGHT_PATTERNS:
        files = glob.glob(os.path.join(model_path, pattern))
        if files:
            return sum(os.path.getsize(f) for f in files)
    return 0


def _number(params, name, minimum, strict=False):
    value = params.get(name)
    if value is None:
        return None
    if strict and value <= minimum:
        raise InputError(name, "must be greater than %s, got %s" % (minimum, value))
    if value < minimum:
        raise InputError(name, "must be %s or more, got %s" % (minimum, value))
    return value


def _seconds_or_auto(params, name, minimum, default, strict=False):
    """(seconds, is_auto) of a budget that may be `auto`; a number may come as text (templated)."""
    value = params.get(name)
    if value is None:
        return default, False
    if isinstance(value, str):
        if value.strip() == AUTO:
            return default, True
        try:
            value = float(value)
        except ValueError:
            raise InputError(name, "must be a number of seconds or auto, got %r" % value)
        value = int(value) if value.is_integer() else value
    return _number({name: value}, name, minimum, strict=strict), False


def _peers(peers, peer_port):
    """The module's peers ([{name, address}]) resolved to {name: [IP addresses]}, and the port."""
    if not peers:
        return None, None
    if peer_port is None or not 0 < peer_port < 65536:
        raise InputError("peer_port", "the dist-init port (1-65535) is required with peers, got %s" % peer_port)
    resolved = {}
    for index, peer in enumerate(peers):
        name, address = (peer or {}).get("name"), (peer or {}).get("address")
        if not name or not address:
            raise InputError("peers", "entry %d needs a name and an address, got %r" % (index, peer))
        try:
            infos = socket.getaddrinfo(address, None, proto=socket.IPPROTO_TCP)
        except socket.gaierror as exc:
            raise InputError("peers", "the address %r of node %s cannot be resolved (%s)" % (address, name, exc.strerror))
        resolved[name] = sorted(set(str(ipaddress.ip_address(info[4][0].split("%")[0])) for info in infos))
    return resolved, peer_port


def build_config(params, proc_root="/proc", starts_server=False):
    """A WaitConfig from the module's parameters; raises InputError naming the bad field.

    The module waits for a running server: its params name it by exactly one of unit and pid. The
    launcher checks its options before it starts the engine (starts_server=True): its params name
    neither, the engine's output comes through the launcher's pipe (follows_log), and the pid is
    given by for_started_server() once the engine runs.
    """
    url = params.get("url") or ""
    parsed = urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise InputError("url", "must be an http:// or https:// base URL with a host, such as "
                                "http://127.0.0.1:30001; got %r" % url)
    try:
        parsed.port
    except ValueError:
        raise InputError("url", "has an invalid port: %r" % url)
    try:
        socket.getaddrinfo(parsed.hostname, None)
    except socket.gaierror as exc:
        raise InputError("url", "host %r cannot be resolved (%s): fix the URL or the host's DNS"
                         % (parsed.hostname, exc.strerror))
    unit, pid = params.get("unit"), params.get("pid")
    if starts_server:
        if unit is not None or pid is not None:
            raise InputError("unit", "a server the caller starts has neither a unit nor a pid yet")
    elif (unit is None) == (pid is None):
        raise InputError("unit", "give exactly one of unit (a systemd unit) and pid (a process id)")
    if unit is not None and not UNIT_NAME.match(unit):
        raise InputError("unit", "%r is not a systemd unit name" % unit)
    if pid is not None:
        if pid <= 0:
            raise InputError("pid", "must be a positive process id, got %s" % pid)
        if not os.path.exists(os.path.join(proc_root, str(pid))) and not params.get("log_path"):
            raise InputError("pid", "no process with pid %d is running on this host; give the server's "
                                    "current pid or use unit, or log_path to learn why it exited" % pid)
    timeout, timeout_auto = _seconds_or_auto(params, "timeout", 0, DEFAULT_TIMEOUT)
    stall_timeout, stall_timeout_auto = _seconds_or_auto(params, "stall_timeout", 0, DEFAULT_STALL_TIMEOUT, strict=True)
    config = WaitConfig(
        url=url,
        engine=params.get("engine") or "auto",
        unit=unit,
        pid=pid,
        log_path=params.get("log_path"),
        follows_log=starts_server,
        ready_check=params.get("ready_check") or "completion",
        model=params.get("model"),
        api_key=params.get("api_key"),
        timeout=timeout,
        timeout_auto=timeout_auto,
        stall_timeout=stall_timeout,
        stall_timeout_auto=stall_timeout_auto,
        poll_interval=_number(params, "poll_interval", 0, strict=True) or 5,
        model_path=params.get("model_path"),
        expected_bytes=_number(params, "expected_bytes", 0),
        gpus=params.get("gpus"),
        progress_path=params.get("progress_path"),
        completion_timeout=_number(params, "completion_timeout", 0, strict=True) or 30,
        py_spy=params.get("py_spy") or "auto",
        stacks_interval=_number(params, "stacks_interval", 0) or 0,
        # 0 is "not measured" (the preflight's fact when it read warm or not at all).
        disk_rate=_number(params, "disk_read_rate", 0) or None,
        tensor_parallel=_number(params, "tensor_parallel", 1) or 1,
    )
    if config.engine not in ENGINES:
        raise InputError("engine", "must be one of %s, got %r" % (", ".join(ENGINES), config.engine))
    if config.ready_check not in READY_CHECKS:
        raise InputError("ready_check", "must be one of %s, got %r" % (", ".join(READY_CHECKS), config.ready_check))
    for index in config.gpus or []:
        if index < 0:
            raise InputError("gpus", "GPU indices are 0 or more, got %s" % index)
    if config.model_path is not None:
        if not os.path.isdir(config.model_path):
            raise InputError("model_path", "directory %s does not exist on this host" % config.model_path)
        size = weights_size(config.model_path)
        if size == 0:
            raise InputError("model_path", "%s holds no weight files (%s)" % (config.model_path, ", ".join(WEIGHT_PATTERNS)))
        if config.expected_bytes is None:
            config.expected_bytes = size
    if config.py_spy not in ("auto", "off") and not os.path.isabs(config.py_spy):
        raise InputError("py_spy", "must be auto, off or the absolute path of py-spy, got %r" % config.py_spy)
    config.peers, config.peer_port = _peers(params.get("peers"), params.get("peer_port"))
    for field in ("log_path", "progress_path"):
        path = getattr(config, field)
        if path is not None and not os.path.isdir(os.path.dirname(os.path.abspath(path))):
            raise InputError(field, "the directory of %s does not exist" % path)
    return config
