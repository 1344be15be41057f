"""The Type=notify launcher: runs the engine as its child and tells systemd the truth.

Neither SGLang nor vLLM sends READY=1, so a plain unit is "active" the moment the engine's
process starts. `python -m modelwake launch [options] -- <engine command>` starts the engine in
its own process group, tees its output to the journal, and watches it with the same probe and
classifier as wait_for_model_ready (pid mode, the output pipe as its log source). It sends
  STATUS=      at each change and at least every STATUS_EVERY seconds (`loading 45% (29/64
               shards, 412 MiB/s, ETA 6m12s)`), so `systemctl status` shows the phase;
  EXTEND_TIMEOUT_USEC=  whenever there was progress, so TimeoutStartSec acts as a stall budget;
  READY=1      only when the ready check passes (by default a real completion);
and on stalled / failed / timeout logs the verdict with its evidence, stops the engine's
process group and exits non-zero, so Restart= applies. After ready it keeps supervising: an
engine that exits (even with 0, a crash can) ends the launcher with EXIT_ENGINE_EXITED. Under a
watchdog (WatchdogSec=) it sends WATCHDOG=1 while the engine runs; with --liveness-failures N it
first asks the engine (/health, or a completion) before each ping, and after N failed answers in a
row sends no more pings, so that systemd's watchdog kills the hung engine and Restart= starts it.
SIGTERM/SIGINT stop the engine (SIGTERM to its group, SIGKILL after --stop-timeout); SIGHUP is
forwarded. The API key is read from the environment (EnvironmentFile=), never from a flag.
"""
import argparse
import collections
import ctypes
import dataclasses
import os
import queue
import signal
import subprocess
import sys
import threading
import time

from ..host import http_probe, procfs
from ..readiness import engines
from ..readiness.verdict import Verdict
from ..readiness.phases import FAILED, NOT_STARTED, PHASES, READY, STALLED, TERMINAL, TIMEOUT
from ..readiness.config import build_config
from ..common.errors import ModelWakeError
from ..common.formatting import http_result
from ..host.logs import split_records
from ..readiness.status import format_status, one_line
from .notify import Notifier, watchdog_interval
from ..readiness.probe import HostProbe
from ..readiness.waiter import wait_for_ready

EXIT_USAGE = 2  # bad options: nothing was started (argparse uses 2 too)
EXIT_FAILED = 3  # the engine crashed before it was ready
EXIT_STALLED = 4  # no progress on any signal for --stall-timeout
EXIT_TIMEOUT = 5  # still not ready at --timeout
EXIT_ENGINE_EXITED = 6  # the engine exited after it was ready (even with status 0)
VERDICT_EXIT = {FAILED: EXIT_FAILED, STALLED: EXIT_STALLED, TIMEOUT: EXIT_TIMEOUT}

# The launcher's own key variable: removed from the engine's environment (the engine reads its own).
API_KEY_ENV = "MODELWAKE_LAUNCHER_API_KEY"
# Variables meant for the launcher alone: the engine must not notify systemd or feed its watchdog.
PRIVATE_ENV = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", API_KEY_ENV)
STATUS_EVERY = 30.0  # seconds: systemd shows how current a status is only by repeating it
TAIL_LINES = 200
# How long a read of the output waits for the rest of a dead engine's output (its traceback).
EOF_WAIT = 2.0
LOG_PREFIX = "modelwake: "
# What a liveness probe after ready asks: /health (cheap), or a real completion (vLLM's /health stays
# 200 on a hung engine; SGLang's runs a 1-token generation itself).
LIVENESS_CHECKS = ("health", "completion")


class StopRequested(Exception):
    """SIGTERM or SIGINT arrived: stop the engine and end cleanly.

    A signal, not a failure (like KeyboardInterrupt), so deliberately outside ModelWakeError: an
    `except ModelWakeError` that reports a failure must never swallow a stop."""


PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4


def ambient_capability_dropper():
    """A preexec_fn for the engine's child: clear the ambient capabilities before exec, so the engine
    (a non-root user, no file capabilities) runs with none. The unit grants CAP_SYS_PTRACE where Yama
    asks for it (roles/model_service), for the launcher's py-spy only. prctl is looked up here, in
    the parent: between fork and exec only the call itself runs. Kernels before 4.3 have no ambient
    set, and a libc without prctl needs no drop: then nothing is done."""
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None

    def drop():
        prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    return drop


# -- Prometheus textfile -----------------------------------------------------------------
# In Prometheus' own conventions (promtool check metrics): counters end in _total, a 0..1 value in
# _ratio, a point in time is _timestamp_seconds since the epoch; the unit is the label `name`, its
# full name, as node_exporter's systemd collector labels it, so the two join on(name).
def _label(value):
    return str(value).replace("\\", "\\\\").replace("\"", "\\\"").replace("\n", "\\n")


def prometheus_text(name, verdict, phase_started, expected_load=None):
    """node_exporter textfile-collector metrics for one verdict of the unit `name` (its full name,
    e.g. sglang-k26.service). phase_started: when the current phase began, wall-clock seconds since
    the epoch; expected_load: the expected load time in seconds, or None. A value still unknown
    (no bytes read yet, no ETA) is left out rather than written as 0."""
    labels = 'name="%s"' % _label(name)
    lines = ["# HELP modelwake_phase Start-up phase of the model server: 1 for the current one, 0 for the others.",
             "# TYPE modelwake_phase gauge"]
    for phase in PHASES + TERMINAL:
        lines.append('modelwake_phase{%s,phase="%s"} %d' % (labels, phase, 1 if phase == verdict.phase else 0))
    families = [
        ("modelwake_phase_start_timestamp_seconds", "gauge",
         "When the current phase began, seconds since the epoch.", phase_started),
        ("modelwake_read_bytes_total", "counter",
         "Bytes the server's processes read from disk since the launcher started them.", verdict.bytes_read),
        ("modelwake_load_ratio", "gauge", "Share of the model's weights loaded, 0 to 1.", verdict.fraction),
        ("modelwake_load_eta_seconds", "gauge", "Estimated seconds until loading ends.", verdict.eta),
        ("modelwake_load_expected_seconds", "gauge",
         "Expected load time in seconds (the GPU preflight's estimate or the operator's).", expected_load),
    ]
    for metric, kind, text, value in families:
        if value is not None:
            lines += ["# HELP %s %s" % (metric, text), "# TYPE %s %s" % (metric, kind),
                      "%s{%s} %s" % (metric, labels, value)]
    return "\n".join(lines) + "\n"


def write_textfile(path, text):
    """Atomically: the collector must never read a half-written file. Returns an error or None."""
    tmp = "%s.%d.tmp" % (path, os.getpid())
    try:
        with open(tmp, "w") as handle:
            handle.write(text)
        os.chmod(tmp, 0o644)
        os.rename(tmp, path)
    except OSError as exc:
        return "textfile %s could not be written: %s" % (path, exc)
    return None


# -- what to tell systemd ------------------------------------------------------------------
class Reporter(object):
    """Decides, after each snapshot, what systemd hears. Clocks injected: no I/O of its own
    beyond the notifier and the optional textfile, so tests replay a start with a fake clock.
    clock is the monotonic one the wait runs on; wall_clock (time.time) is read once, here, only to
    date the phases for Prometheus: a later jump of the wall clock moves no phase."""

    def __init__(self, notifier, clock, extend_seconds, name="model", textfile=None, log=None,
                 status_every=STATUS_EVERY, wall_clock=time.time, expected_load=None):
        self.notifier = notifier
        self.clock = clock
        self.extend_seconds = extend_seconds
        self.name = name
        self.textfile = textfile
        self.expected_load = expected_load
        self.log = log or (lambda text: None)
        self.status_every = status_every
        self.start = clock()
        self.wall_start = wall_clock()
        self.last_status = None
        self.last_status_at = None
        self.last_progress_t = None
        self.ready = False
        self.verdict = None
        self.errors = set()

    def _say_once(self, error):
        if error and error not in self.errors:
            self.errors.add(error)
            self.log(error)

    def on_snapshot(self, snap, verdict):
        """wait_for_ready's on_snapshot hook."""
        now = self.clock()
        self.verdict = verdict
        for error in snap.errors:  # a signal that could not be read (stacks, journal, GPUs): said once
            self._say_once(error)
        text = format_status(verdict, now - self.start)
        if verdict.phase == READY:
            if not self.ready:
                self.ready = True
                self.notifier.ready(text)
                self._say_once(self.notifier.error)
                self.log("%s (%s)" % (text, verdict.msg))
                self.last_status, self.last_status_at = text, now
        else:
            progress_t = (verdict.last_progress or {}).get("t")
            fields = []
            if text != self.last_status or now - self.last_status_at >= self.status_every:
                fields.append("STATUS=" + one_line(text))
                self.last_status, self.last_status_at = text, now
            if not verdict.terminal and progress_t is not None and progress_t != self.last_progress_t:
                # Progress since the last look: systemd may wait another full budget from now.
                fields.append("EXTEND_TIMEOUT_USEC=%d" % int(self.extend_seconds * 1000000))
                self.last_progress_t = progress_t
            if fields:
                self.notifier.send(*fields)
                self._say_once(self.notifier.error)
        if self.textfile:
            # verdict.since counts from the wait's start, which is this reporter's start.
            text = prometheus_text(self.name, verdict, self.wall_start + verdict.since, self.expected_load)
            self._say_once(write_textfile(self.textfile, text))


# -- liveness after ready ------------------------------------------------------------------
class Liveness(object):
    """After READY=1: does the engine still answer? One probe before each watchdog ping.

    `probe()` returns (answered, what failed). After `failures` failed probes in a row the verdict is
    final: no more pings, ever, for this run (systemd's watchdog then kills the unit and Restart=
    starts it again). An answer before that resets the count. No clock, no I/O of its own."""

    def __init__(self, probe, failures, log=None):
        self.probe = probe
        self.failures = failures
        self.log = log or (lambda text: None)
        self.missed = 0
        self.last_failure = None
        self.gave_up = False

    def answers(self):
        """Probe once: True while the pings may go on."""
        if self.gave_up:
            return False
        answered, failure = self.probe()
        if answered:
            if self.missed:
                self.log("liveness: the engine answers again after %d failed probe(s)" % self.missed)
            self.missed = 0
            return True
        self.missed += 1
        self.last_failure = failure
        self.gave_up = self.missed >= self.failures
        if not self.gave_up:
            self.log("liveness: %s (%d of %d failed probes in a row)" % (failure, self.missed, self.failures))
        return not self.gave_up


def liveness_probe(config, check, timeout):
    """The engine asked once, as the ready check asks it (http_probe.probe_ready, the key from the
    launcher's environment), every request bounded by `timeout`: (answered, what failed)."""
    def probe():
        found = http_probe.probe_ready(config.url, ready_check=check, model=config.model, api_key=config.api_key,
                                       health_timeout=timeout, completion_timeout=timeout)
        if found["ready"]:
            return True, None
        for name, path in (("completion", "/v1/completions"), ("models", "/v1/models"), ("health", "/health")):
            if found[name] is not None:
                return False, "%s %s" % (path, http_result(found[name]))
        return False, "no answer"
    return probe


# -- the engine's output ------------------------------------------------------------------
class PipeSource(object):
    """The engine's merged stdout/stderr: teed line by line to our stdout (the journal) and
    offered to the probe with the interface of logs.FileTailer (read_new, last_read_context)."""

    last_read_context = False  # everything comes from this run: no earlier run's lines
    error = None

    def __init__(self, fd, out, exited=None, eof_wait=EOF_WAIT):
        self.fd = fd
        self.out = out
        self.exited = exited or threading.Event()
        self.eof_wait = eof_wait
        self.queue = queue.Queue()
        self.tail = collections.deque(maxlen=TAIL_LINES)
        self.collect = True
        self.eof = threading.Event()
        self.thread = threading.Thread(target=self._pump, name="engine-output", daemon=True)

    def start(self):
        self.thread.start()
        return self

    def _tee(self, data):
        try:
            self.out.write(data)
            self.out.flush()
        except (OSError, ValueError):
            pass  # our stdout gone (journald restarting): keep the engine and the watch going

    def _records(self, lines):
        for line in lines:
            self.tail.append(line)
            if self.collect:
                self.queue.put(line)

    def _pump(self):
        pending_tee = b""
        pending_records = b""
        while True:
            try:
                data = os.read(self.fd, 65536)
            except OSError:
                data = b""
            if not data:
                break
            # journald splits on \n: hand it whole lines (a long \r progress bar at most 64 KiB).
            pending_tee += data
            cut = pending_tee.rfind(b"\n") + 1
            if cut == 0 and len(pending_tee) > 65536:
                cut = len(pending_tee)
            if cut:
                self._tee(pending_tee[:cut])
                pending_tee = pending_tee[cut:]
            # The classifier also splits on \r: a tqdm redraw is news before its line ends.
            lines, pending_records = split_records(pending_records + data)
            self._records(lines)
        if pending_tee:
            self._tee(pending_tee + b"\n")
        if pending_records.strip():
            self._records([pending_records.decode("utf-8", "replace")])
        os.close(self.fd)
        self.eof.set()

    def read_new(self):
        if self.exited.is_set():
            # The engine is gone: its last lines (the traceback) are still in the pipe.
            self.eof.wait(self.eof_wait)
        lines = []
        while True:
            try:
                lines.append(self.queue.get_nowait())
            except queue.Empty:
                return lines


# -- the engine process --------------------------------------------------------------------
class Engine(object):
    """The engine as our child, in its own session and process group (pgid == pid)."""

    def __init__(self, argv, env, out):
        read_fd, write_fd = os.pipe()
        try:
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=write_fd, stderr=write_fd,
                                         env=env, start_new_session=True, close_fds=True,
                                         preexec_fn=ambient_capability_dropper())
        finally:
            os.close(write_fd)
        self.pid = self.proc.pid
        self.exited = threading.Event()
        self.status = None
        self.wake = threading.Event()
        self.output = PipeSource(read_fd, out, exited=self.exited).start()
        self.seen = {}  # pid -> starttime of every descendant seen, to kill escapees by identity
        threading.Thread(target=self._reap, name="engine-reaper", daemon=True).start()

    def _reap(self):
        _pid, status = os.waitpid(self.pid, 0)
        self.status = status
        self.proc.returncode = -1  # reaped here: Popen must not wait for it again
        self.exited.set()
        self.wake.set()

    def describe_exit(self):
        if self.status is None:
            return "still running"
        if os.WIFSIGNALED(self.status):
            return "killed by signal %d (%s)" % (os.WTERMSIG(self.status), signal.Signals(os.WTERMSIG(self.status)).name)
        return "exit status %d" % os.WEXITSTATUS(self.status)

    def refused_its_options(self):
        """Did the engine exit by itself with argparse's usage status (bad options)?"""
        return self.status is not None and os.WIFEXITED(self.status) and os.WEXITSTATUS(self.status) == EXIT_USAGE

    def remember_tree(self):
        for pid, info in procfs.tree([self.pid]).items():
            self.seen[pid] = info["starttime"]

    def signal_group(self, signum):
        try:
            os.killpg(self.pid, signum)
        except OSError:
            pass  # the group is empty: nothing left to signal

    def _still_running(self):
        """Descendants seen earlier that still run (not exited, not a zombie)."""
        running = []
        for pid, starttime in self.seen.items():
            info = procfs.read_process(pid)
            if info is not None and info["starttime"] == starttime and not procfs.is_gone(info):
                running.append(pid)
        return running

    def _kill_escapees(self):
        """Descendants seen earlier that left the process group (setsid) and still run."""
        for pid in self._still_running():
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass

    def _wait_tree_gone(self, seconds):
        """SIGKILL takes effect asynchronously: on a loaded host a killed child can still run for a
        moment. Return only once none of the tree is left (or after `seconds`), so that nothing of
        the engine outlives the launcher, with or without systemd's cgroup to clean up."""
        deadline = time.monotonic() + seconds
        while self._still_running() and time.monotonic() < deadline:
            time.sleep(0.05)

    def stop(self, grace, signum=signal.SIGTERM):
        """signum to the group, SIGKILL to whatever is left after `grace` seconds; returns when reaped."""
        if not self.exited.is_set():
            self.remember_tree()
            self.signal_group(signum)
            self.exited.wait(grace)
        self.signal_group(signal.SIGKILL)
        self._kill_escapees()
        self.exited.wait(grace + 5)
        self._wait_tree_gone(5)
        return self.exited.is_set()


# -- the whole run ---------------------------------------------------------------------------
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
    parser.add_argument("--timeout", type=float, default=86400, help="overall deadline in seconds (default 86400)")
    parser.add_argument("--stall-timeout", type=float, default=600, help="no progress this long = stalled (default 600)")
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
                        help="seconds the engine gets after SIGTERM before SIGKILL (keep below TimeoutStopSec)")
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
                        help="what a liveness probe asks: health (GET /health 200) or completion (a real one)")
    parser.add_argument("--peer", action="append", default=[], metavar="NAME=ADDRESS",
                        help="another node of a multi-node group (repeatable): a node that leaves the group is "
                             "a failure that names it, and restarts this one (the group re-forms)")
    parser.add_argument("--peer-port", type=int, default=None, help="the group's dist-init port (with --peer)")
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
    """A validated WaitConfig (pid filled in once the engine runs); raises ModelWakeError."""
    params = {
        "url": options.url, "engine": options.engine, "ready_check": options.ready_check,
        "model": options.model, "api_key": environ.get(API_KEY_ENV) or None,
        "model_path": options.model_path, "gpus": _gpus(options.gpus),
        "timeout": options.timeout, "stall_timeout": options.stall_timeout,
        "poll_interval": options.poll_interval,
        "py_spy": options.py_spy, "stacks_interval": options.stacks_interval,
        "peers": _peers(options.peer), "peer_port": options.peer_port,
        # Validation needs a live pid; the engine's replaces it once it runs.
        "pid": os.getpid(),
    }
    if options.timeout <= 0:
        raise ModelWakeError("timeout: must be greater than 0 (the launcher always waits), got %s" % options.timeout)
    config = build_config(params)
    config.follows_log = True  # the engine's output comes through our pipe
    # A spinning hang is declared at most a stack read later than a silent one.
    minimum = config.stall_timeout + config.stacks_interval + 2 * config.poll_interval
    if options.extend_timeout is None:
        options.extend_timeout = minimum + 30
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
    if options.expected_load_seconds is not None and not options.expected_load_seconds > 0:
        raise ModelWakeError("expected-load-seconds: must be greater than 0 (leave it out when unknown), got %s"
                             % options.expected_load_seconds)
    return config


def engine_environment(environ):
    return dict((k, v) for k, v in environ.items() if k not in PRIVATE_ENV)


class Launcher(object):
    def __init__(self, options, environ=None, out=None, err=None, clock=time.monotonic, wall_clock=time.time):
        self.options = options
        self.environ = os.environ if environ is None else environ
        self.out = out if out is not None else sys.stdout.buffer
        self.err = err if err is not None else sys.stderr
        self.clock = clock
        self.wall_clock = wall_clock
        self.engine = None
        self.stop_signal = None

    def log(self, text):
        self.err.write(LOG_PREFIX + text + "\n")
        self.err.flush()

    # Signals arrive in the main thread, between two looks or inside a wait.
    def _on_signal(self, signum, _frame):
        if signum == signal.SIGHUP:
            if self.engine is not None:
                self.engine.signal_group(signum)
            return
        self.stop_signal = signum
        if self.engine is not None:
            # Forward at once: a look in flight (an HTTP probe can take seconds) must not delay
            # the engine's own clean shutdown; _stop escalates to SIGKILL after the grace.
            self.engine.signal_group(signum)
            self.engine.wake.set()

    def _sleep(self, seconds):
        """wait_for_ready's sleep: ends early when the engine exits or a stop is asked for."""
        self.engine.wake.wait(seconds)
        self.engine.wake.clear()
        if self.stop_signal is not None:
            raise StopRequested()

    def _final_textfile(self, phase, msg):
        """The last word for node_exporter when no look follows (stopped, or exited after ready)."""
        if self.options.textfile:
            text = prometheus_text(self.options.name, Verdict(phase, msg), self.wall_clock(),
                                   self.options.expected_load_seconds)
            error = write_textfile(self.options.textfile, text)
            if error:
                self.log(error)

    def _stop(self, notifier):
        name = signal.Signals(self.stop_signal).name
        notifier.stopping("stopping: %s forwarded to the engine" % name)
        self.log("%s received: stopping the engine's process group %d (SIGKILL after %s s)"
                 % (name, self.engine.pid, self.options.stop_timeout))
        self.engine.stop(self.options.stop_timeout, signum=self.stop_signal)
        self.log("engine stopped (%s)" % self.engine.describe_exit())
        self._final_textfile(NOT_STARTED, "stopped")
        return 0

    def run(self):
        options = self.options
        try:
            notifier = Notifier(self.environ)
            config = build_launch_config(options, self.environ)
        except ModelWakeError as exc:  # bad options, or a NOTIFY_SOCKET it cannot use
            self.log("error: %s" % exc)
            return EXIT_USAGE
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, self._on_signal)
        try:
            self.engine = Engine(options.command, engine_environment(self.environ), self.out)
        except OSError as exc:
            self.log("error: command: cannot start %s: %s" % (options.command[0], exc))
            return EXIT_FAILED
        self.log("engine started as pid %d: %s" % (self.engine.pid, " ".join(options.command)))
        try:
            return self._watch(notifier, dataclasses.replace(config, pid=self.engine.pid))
        except StopRequested:
            return self._stop(notifier)
        finally:
            if self.engine is not None and not self.engine.exited.is_set():
                self.engine.stop(min(options.stop_timeout, 10))
            notifier.close()

    def _watch(self, notifier, config):
        options = self.options
        engine = self.engine
        try:
            probe = HostProbe(config)
        except ModelWakeError as exc:  # the engine died before the first look
            engine.exited.wait(EOF_WAIT)
            self.log("failed: the engine ended at once (%s): %s" % (engine.describe_exit(), exc))
            return self._usage_or(EXIT_FAILED)
        probe.sources.append(engine.output)
        reporter = Reporter(notifier, self.clock, options.extend_timeout, name=options.name,
                            textfile=options.textfile, log=self.log, wall_clock=self.wall_clock,
                            expected_load=options.expected_load_seconds)

        def on_snapshot(snap, verdict):
            engine.remember_tree()
            reporter.on_snapshot(snap, verdict)

        result = wait_for_ready(config, probe, clock=self.clock, sleep=self._sleep, on_snapshot=on_snapshot)
        for warning in result.get("warnings", []):
            self.log("warning: %s" % warning)
        if result["phase"] != READY:
            return self._give_up(result)
        engine.output.collect = False  # nobody reads the queue now; the tail stays for evidence
        return self._supervise(notifier, config)

    def _give_up(self, result):
        engine = self.engine
        self.log(result["msg"])
        for line in result.get("evidence") or []:
            self.log("  | " + line)
        grace = min(self.options.stop_timeout, 10)
        code = self._usage_or(VERDICT_EXIT.get(result["phase"], EXIT_FAILED))
        if not engine.exited.is_set():
            self.log("stopping the engine's process group %d" % engine.pid)
        engine.stop(grace)
        self.log("engine %s; exiting %d so that Restart= applies" % (engine.describe_exit(), code))
        return code

    def _usage_or(self, code):
        """`code`, or EXIT_USAGE when the engine exited refusing its options: restarting cannot help,
        and the unit's RestartPreventExitStatus= stops the loop on that code. Also when the engine
        was gone before the first look (how fast it exits decides which path sees it)."""
        if self.engine.exited.is_set() and self.engine.refused_its_options():
            self.log("the engine refused its options (exit status %d): fix the command line, a restart "
                     "would fail the same way" % EXIT_USAGE)
            return EXIT_USAGE
        return code

    def _unresponsive(self, notifier, liveness, ping):
        """The liveness verdict: said once, to the journal, in STATUS= and the textfile."""
        message = unresponsive_message(liveness, ping)
        notifier.status(message)
        self._final_textfile(STALLED, message)
        self.log(message)

    def _supervise(self, notifier, config):
        """After READY=1: follow the engine until it exits or we are stopped; feed the watchdog, while
        the engine answers when --liveness-failures is set."""
        engine = self.engine
        ping = watchdog_interval(self.environ)
        liveness = None
        if ping is not None and self.options.liveness_failures:
            # A probe and its ping fit in the watchdog's period: at most half a ping interval each.
            limit = http_probe.COMPLETION_TIMEOUT if self.options.liveness_check == "completion" else http_probe.HEALTH_TIMEOUT
            liveness = Liveness(liveness_probe(config, self.options.liveness_check, min(limit, ping / 2)),
                                self.options.liveness_failures, log=self.log)
        while not engine.exited.is_set():
            if ping is not None:
                if liveness is None:
                    notifier.watchdog()
                elif not liveness.gave_up:
                    if liveness.answers():
                        notifier.watchdog()
                    else:  # the last failure of the row: said once, then silence until the watchdog acts
                        self._unresponsive(notifier, liveness, ping)
            engine.wake.wait(ping if ping is not None else STATUS_EVERY)
            engine.wake.clear()
            if self.stop_signal is not None:
                raise StopRequested()
        engine.output.eof.wait(EOF_WAIT)
        tail = list(engine.output.tail)
        evidence = engines.root_cause(tail) if any(engines.EXCEPTION_LINE.search(l) for l in tail) else tail[-10:]
        message = "failed: the engine exited after it was ready (%s)" % engine.describe_exit()
        notifier.status(message)
        self._final_textfile(FAILED, message)
        self.log(message)
        for line in evidence:
            self.log("  | " + line)
        engine.stop(1)  # whatever it left in its group
        return EXIT_ENGINE_EXITED


def unresponsive_message(liveness, ping):
    return ("stalled: the engine stopped answering after it was ready (%s, %d times in a row, every %g s): "
            "no more WATCHDOG=1, systemd's watchdog restarts it"
            % (liveness.last_failure, liveness.missed, ping))


def main(argv=None):
    options = parse_args(sys.argv[1:] if argv is None else argv)
    return Launcher(options).run()
