"""The launcher's command line and environment: its options, checked into the wait's config before
the engine starts, and what of its environment is its own (kept from the engine)."""
import argparse
import os

from ..common.errors import ModelWakeError
from ..host.hold import HOLD_DIR
from ..readiness.config import DEFAULT_STALL_TIMEOUT, build_config, stall_budget, stall_budget_minimum
from .disk_rate import read_disk_rate, tensor_parallel
from .exit_codes import EXIT_CRASH_LOOP
from .liveness import LIVENESS_CHECKS
from .notify import watchdog_interval
from .prefetch_step import MODES as PREFETCH_MODES, check_mode as check_prefetch
from .start_record import launch_memory, seconds_or_auto

# The launcher's own key variable: removed from the engine's environment (the engine reads its own).
API_KEY_ENV = "MODELWAKE_LAUNCHER_API_KEY"
# Variables meant for the launcher alone: the engine must not notify systemd or feed its watchdog.
PRIVATE_ENV = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", API_KEY_ENV)


def parse_args(argv):
    parser = argparse.ArgumentParser(
        prog="python -m modelwake launch",
        description="Run an inference engine under systemd Type=notify: STATUS= phases, "
                    "EXTEND_TIMEOUT_USEC= while it progresses, READY=1 after a real completion.")
    parser.add_argument("--url", required=True, help="base URL of the server, e.g. http://127.0.0.1:30001")
    parser.add_argument("--engine", default="auto", help="sglang | vllm | auto (log markers, endpoint meanings)")
    parser.add_argument("--ready-check", default="completion", help="completion | health | models")
    parser.add_argument("--model", default=None, help="model name for the completion (default: first of /v1/models)")
    parser.add_argument("--model-path", default=None, help="model directory: size of the weights, for the fraction and ETA")
    parser.add_argument("--gpus", default=None, help="GPU indices to watch, comma-separated (default: all)")
    parser.add_argument("--timeout", type=seconds_or_auto, default=86400,
                        help="overall deadline in seconds, or auto: from the unit's earlier starts (default 86400)")
    parser.add_argument("--stall-timeout", type=seconds_or_auto, default=DEFAULT_STALL_TIMEOUT,
                        help="no progress this long = stalled, or auto: from the unit's earlier starts (default %d)"
                        % DEFAULT_STALL_TIMEOUT)
    parser.add_argument("--poll-interval", type=float, default=5, help="seconds between looks (default 5)")
    parser.add_argument("--py-spy", default="auto",
                        help="py-spy for the ranks' stacks during silent phases: auto (next to the engine's "
                             "interpreter, then PATH), a path, or off (default auto)")
    parser.add_argument("--stacks-interval", type=float, default=0,
                        help="least seconds between two stack reads (default 0: every silent look)")
    parser.add_argument("--extend-timeout", type=float, default=None,
                        help="seconds each EXTEND_TIMEOUT_USEC grants; the unit's TimeoutStartSec should equal it "
                             "(default: stall timeout + 2 polls + 30)")
    parser.add_argument("--stop-timeout", type=float, default=30,
                        help="seconds the engine gets after SIGTERM before SIGKILL, its drain included (keep "
                             "below TimeoutStopSec); after ready the requests in flight are followed meanwhile")
    parser.add_argument("--engine-in-cgroup", action="store_true",
                        help="the command runs the engine in a container (podman run): its processes are this "
                             "unit's cgroup's outside the launcher's session, not only the command's descendants")
    parser.add_argument("--engine-container", default=None, metavar="NAME",
                        help="the command runs the engine in this Docker container (docker run --name NAME): its "
                             "processes are the container's, found from its init's host PID (docker inspect)")
    parser.add_argument("--name", default="model",
                        help="the unit's full name (sglang-k26.service): the `name` label of the Prometheus "
                             "textfile, as node_exporter's systemd collector labels units")
    parser.add_argument("--textfile", default=None,
                        help="write Prometheus metrics here (node_exporter textfile collector, *.prom)")
    parser.add_argument("--expected-load-seconds", type=float, default=None,
                        help="expected load time (the preflight's), written to the textfile for the "
                             "slower-than-expected alert (default: unknown, left out)")
    parser.add_argument("--liveness-failures", type=int, default=0,
                        help="after ready, probe the engine before each WATCHDOG=1 and stop pinging after this many "
                             "failed probes in a row, so that the unit's WatchdogSec= restarts a hung engine "
                             "(default 0: off; needs WatchdogSec=)")
    parser.add_argument("--liveness-check", default="health", choices=LIVENESS_CHECKS,
                        help="what a liveness probe asks: health (GET /health 200), completion (a real one) or "
                             "work (the engine's /metrics: tokens processed while requests are in flight, a "
                             "1-token completion when idle, /health when /metrics cannot be read)")
    parser.add_argument("--state-dir", default=None,
                        help="the unit's state directory (StateDirectory=): where the failed starts are recorded "
                             "for crash-loop detection (default: none, no record)")
    parser.add_argument("--crash-loop-starts", type=int, default=3,
                        help="with --state-dir: after this many failed starts in a row with the same root cause, "
                             "exit %d to stop the loop (default 3; 0: record only)" % EXIT_CRASH_LOOP)
    parser.add_argument("--peer", action="append", default=[], metavar="NAME=ADDRESS",
                        help="another node of a multi-node group (repeatable): a node that leaves the group is "
                             "a failure that names it, and restarts this one (the group re-forms)")
    parser.add_argument("--peer-port", type=int, default=None, help="the group's dist-init port (with --peer)")
    parser.add_argument("--hold-dir", default=HOLD_DIR,
                        help="where the maintenance holds are (playbooks/hold.yml; default %(default)s): while "
                             "<dir>/<unit>.json exists (the unit from --name), a failed, stalled or exited engine ends "
                             "the launcher with status 8 (RestartPreventExitStatus=) instead of one Restart= acts on; "
                             "'' turns it off")
    parser.add_argument("--gpu-turns", default="", metavar="DIR",
                        help="take the start's turn on its GPUs (--gpus, default all) with lock files in DIR, shared "
                             "by every unit on the host, and wait for a stopped instance's GPU memory before the "
                             "engine starts (default: off)")
    parser.add_argument("--gpu-release-timeout", type=float, default=150,
                        help="seconds a stopped instance's GPU memory may take to be released before the start "
                             "fails naming its holders (with --gpu-turns; default 150)")
    parser.add_argument("--engine-version", default=None,
                        help="the engine's version, kept with each start: another version starts a new set of usual figures")
    parser.add_argument("--no-start-history", action="store_true",
                        help="neither read nor write the record of starts in --state-dir")
    parser.add_argument("--prefetch", default="off", choices=PREFETCH_MODES,
                        help="read the model (--model-path) into the page cache before the engine starts: on, off, or "
                             "auto (only when MemAvailable holds it with --prefetch-margin and the cache does not hold "
                             "it already); a read error exits 9 naming the shard (default off)")
    parser.add_argument("--prefetch-margin", type=float, default=1.2,
                        help="--prefetch auto reads only when MemAvailable >= this times the model's size (default 1.2)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- the engine command and its arguments")
    options = parser.parse_args(argv)
    command = options.command[1:] if options.command[:1] == ["--"] else options.command
    if not command:
        parser.error("command: give the engine command after --, e.g. -- python -m sglang.launch_server ...")
    options.command = command
    return options


def _gpus(text):
    if not text:
        return None
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ModelWakeError("gpus: must be comma-separated GPU indices such as 0,1,2,3, got %r" % text)


def _peers(values):
    """--peer NAME=ADDRESS values as the wait's peers ([{name, address}])."""
    peers = []
    for value in values:
        name, _sep, address = value.partition("=")
        if not name.strip() or not address.strip():
            raise ModelWakeError("peer: give NAME=ADDRESS (the node's inventory name and its address), got %r" % value)
        peers.append({"name": name.strip(), "address": address.strip()})
    return peers


def build_launch_config(options, environ):
    """The wait's validated config, before the engine runs (it gets the engine's pid from
    for_started_server); raises ModelWakeError."""
    params = {
        "url": options.url, "engine": options.engine, "ready_check": options.ready_check,
        "model": options.model, "api_key": environ.get(API_KEY_ENV) or None,
        "model_path": options.model_path, "gpus": _gpus(options.gpus),
        "timeout": options.timeout, "stall_timeout": options.stall_timeout,
        "poll_interval": options.poll_interval,
        "py_spy": options.py_spy, "stacks_interval": options.stacks_interval,
        "peers": _peers(options.peer), "peer_port": options.peer_port,
        # For the slow-load line: the preflight's disk rate (kept in the state directory) and the ranks.
        "disk_read_rate": read_disk_rate(options.state_dir), "tensor_parallel": tensor_parallel(options.command),
    }
    if options.timeout != "auto" and options.timeout <= 0:
        raise ModelWakeError("timeout: must be greater than 0 (the launcher always waits), got %s" % options.timeout)
    config = build_config(params, starts_server=True)
    config.engine_in_cgroup = options.engine_in_cgroup
    config.engine_container = options.engine_container
    # The record of the unit's starts: the usual figures, and the auto budgets resolved here, once.
    config, options.start_memory, options.budgets = launch_memory(options, config, environ)
    # A spinning hang is declared at most a stack read later than a silent one.
    minimum = stall_budget_minimum(config.stall_timeout, config.poll_interval, config.stacks_interval)
    if options.extend_timeout is None:
        options.extend_timeout = stall_budget(config.stall_timeout, config.poll_interval, config.stacks_interval)
    elif options.extend_timeout < minimum:
        # systemd would end the start before the launcher can say why.
        raise ModelWakeError("extend-timeout: must be at least stall timeout + stacks interval + 2 polls (%s s), "
                             "got %s" % (minimum, options.extend_timeout))
    if options.liveness_failures < 0:
        raise ModelWakeError("liveness-failures: must be 0 (off) or more, got %s" % options.liveness_failures)
    if options.liveness_failures and watchdog_interval(environ) is None:
        raise ModelWakeError("liveness-failures: needs systemd's watchdog (WatchdogSec= in the unit, which sets "
                             "WATCHDOG_USEC): without it nobody acts on the engine's silence. Set WatchdogSec= or "
                             "drop --liveness-failures")
    if options.textfile and not os.path.isdir(os.path.dirname(os.path.abspath(options.textfile))):
        raise ModelWakeError("textfile: the directory of %s does not exist" % options.textfile)
    if options.crash_loop_starts < 0:
        raise ModelWakeError("crash-loop-starts: must be 0 (record only) or more, got %s" % options.crash_loop_starts)
    if options.gpu_release_timeout <= 0:
        raise ModelWakeError("gpu-release-timeout: must be greater than 0, got %s" % options.gpu_release_timeout)
    check_prefetch(options)
    if options.expected_load_seconds is not None and not options.expected_load_seconds > 0:
        raise ModelWakeError("expected-load-seconds: must be greater than 0 (leave it out when unknown), got %s"
                             % options.expected_load_seconds)
    return config


def engine_environment(environ):
    return dict((k, v) for k, v in environ.items() if k not in PRIVATE_ENV)
