"""The launcher's run: start the engine, report its start to systemd until it is ready (or give up
with the verdict's exit status), then supervise it until it exits or the launcher is stopped."""
import os
import signal
import sys
import time

from ..common.errors import ModelWakeError
from ..host.prefetch import PrefetchError
from ..readiness import engines
from ..readiness.phases import FAILED, NOT_STARTED, READY, STALLED
from ..readiness.probe import HostProbe
from ..readiness.verdict import Verdict
from ..readiness.waiter import wait_for_ready
from .cli import build_launch_config, engine_environment
from .crash_loop import CrashLoopGuard
from .drain import drain
from .engine_process import EOF_WAIT, Engine
from .exit_codes import EXIT_CRASH_LOOP, EXIT_ENGINE_EXITED, EXIT_FAILED, EXIT_PREFETCH, EXIT_USAGE, VERDICT_EXIT
from .hold import exit_status_when_held
from .gpu_turns import GpuTurnError, GpuTurns
from .liveness import unresponsive_message, watchdog_liveness
from .notify import Notifier, watchdog_interval
from .prefetch_step import PrefetchStep
from .reporter import STATUS_EVERY, Reporter
from .start_record import said_at_start
from .textfile import prometheus_text, write_textfile

LOG_PREFIX = engines.LAUNCHER_LINE_PREFIX


class StopRequested(Exception):
    """SIGTERM or SIGINT arrived: stop the engine and end cleanly.

    A signal, not a failure (like KeyboardInterrupt), so deliberately outside ModelWakeError: an
    `except ModelWakeError` that reports a failure must never swallow a stop."""


class Launcher(object):
    """One run of the launcher for the parsed `options`; run() returns its exit status. The
    environment, the output streams and the clocks are injected for tests."""

    def __init__(self, options, environ=None, out=None, err=None, clock=time.monotonic, wall_clock=time.time):
        self.options = options
        self.environ = os.environ if environ is None else environ
        self.out = out if out is not None else sys.stdout.buffer
        self.err = err if err is not None else sys.stderr
        self.clock = clock
        self.wall_clock = wall_clock
        self.engine = None
        self.stop_signal = None
        # Off until run() has valid options (--state-dir): records nothing.
        self.crash_loop = CrashLoopGuard(None, 0, self.log, wall_clock)
        self.reporter = None
        self.serving_config = None  # set once ready: a stop then drains the requests in flight
        self.turns = None

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

    def _final_textfile(self, phase, msg, verdict=None):
        """The last word for node_exporter when no look follows (stopped, exited after ready, gave up)."""
        if self.options.textfile:
            text = prometheus_text(self.options.name, verdict or Verdict(phase, msg), self.wall_clock(),
                                   self.options.expected_load_seconds, self.crash_loop.metrics(),
                                   starts=self._start_metrics())
            error = write_textfile(self.options.textfile, text)
            if error:
                self.log(error)

    def _start_metrics(self):
        memory = getattr(self.options, "start_memory", None)
        return memory.metrics() if memory is not None else None

    def _stop(self, notifier):
        name = signal.Signals(self.stop_signal).name
        notifier.stopping("stopping: %s forwarded to the engine" % name)
        self.log("%s received: stopping the engine's process group %d (SIGKILL after %s s)"
                 % (name, self.engine.pid, self.options.stop_timeout))
        if self.serving_config is not None:
            drain(self.engine, self.serving_config, self.options.stop_timeout, self.clock, self.log, notifier.status)
        else:
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
        self.crash_loop = CrashLoopGuard(options.state_dir, options.crash_loop_starts, self.log, self.wall_clock)
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, self._on_signal)
        try:
            if options.gpu_turns and not self._take_gpu_turn(notifier, config):
                return 0  # stopped while it waited: nothing was started
        except GpuTurnError as exc:  # a stopped instance's GPU memory never released: a failed start too
            self.log("failed: %s" % exc)
            notifier.status("failed: %s" % exc)
            return self.crash_loop.failed("failed: %s" % exc, [], EXIT_FAILED)
        # The prefetch inside the turn: two starts on the same GPUs never read their models at once (each
        # would compete for the disk and evict the other's pages), and the next waits until this one is loaded.
        try:  # launcher/prefetch_step.py: the model into the page cache, before the engine exists
            if not PrefetchStep(options, notifier, self.log, config.stall_timeout,
                                stopping=lambda: self.stop_signal is not None).run():
                self._release_turn()
                return 0  # stopped while it read: nothing was started
        except PrefetchError as exc:
            self._release_turn()
            self.log("failed: %s" % exc)
            notifier.status("failed: %s" % exc)
            return exit_status_when_held(options.hold_dir, options.name,
                                         self.crash_loop.failed("failed: %s" % exc, [], EXIT_PREFETCH), self.log)
        try:
            self.engine = Engine(options.command, engine_environment(self.environ), self.out)
        except OSError as exc:
            message = "error: command: cannot start %s: %s" % (options.command[0], exc)
            self.log(message)
            return self.crash_loop.failed(message, [], EXIT_FAILED)
        self.log("engine started as pid %d: %s" % (self.engine.pid, " ".join(options.command)))
        for line in said_at_start(options):  # the auto budgets, the usual start: said once
            self.log(line)
        try:
            code = self._watch(notifier, config.for_started_server(self.engine.pid))
            # A unit under a maintenance hold is not restarted by Restart= (launcher/hold.py).
            return exit_status_when_held(options.hold_dir, options.name, code, self.log)
        except StopRequested:
            return self._stop(notifier)
        finally:
            if self.engine is not None and not self.engine.exited.is_set():
                self.engine.stop(min(options.stop_timeout, 10))
            self._release_turn()
            notifier.close()

    def _release_turn(self):
        """The next start on these GPUs may go (also done by the lock's end with this process)."""
        if self.turns is not None:
            self.turns.release()
            self.turns = None

    def _take_gpu_turn(self, notifier, config):
        """launcher/gpu_turns.py: the start's turn on its GPUs and their memory; False when stopped meanwhile."""
        options = self.options
        self.turns = GpuTurns(config.gpus, options.gpu_turns, options.gpu_release_timeout, notifier, self.log,
                              options.extend_timeout)
        return self.turns.take(stopping=lambda: self.stop_signal is not None)

    def _watch(self, notifier, config):
        options = self.options
        engine = self.engine
        try:
            probe = HostProbe(config, output=engine.output)
        except ModelWakeError as exc:  # the engine died before the first look
            engine.exited.wait(EOF_WAIT)
            message = "failed: the engine ended at once (%s): %s" % (engine.describe_exit(), exc)
            self.log(message)
            code = self._failed_start(message, engines.crash_evidence(list(engine.output.tail)),
                                      self._usage_or(EXIT_FAILED))
            self._final_textfile(FAILED, message)
            return code
        reporter = self.reporter = Reporter(notifier, self.clock, options.extend_timeout, name=options.name,
                                            textfile=options.textfile, log=self.log, wall_clock=self.wall_clock,
                                            expected_load=options.expected_load_seconds,
                                            failed_starts=self.crash_loop.metrics,
                                            starts=self._start_metrics)

        def on_snapshot(snap, verdict):
            engine.remember_tree()
            reporter.on_snapshot(snap, verdict)

        result = wait_for_ready(config, probe, clock=self.clock, sleep=self._sleep, on_snapshot=on_snapshot,
                                memory=getattr(options, "start_memory", None))
        self._release_turn()  # the verdict is in: the next start on these GPUs may go
        for warning in result.get("warnings", []):
            self.log("warning: %s" % warning)
        if result["phase"] != READY:
            return self._give_up(result)
        self.crash_loop.reached_ready()
        engine.output.collect = False  # nobody reads the queue now; the tail stays for evidence
        return self._supervise(notifier, config)

    def _give_up(self, result):
        engine = self.engine
        self.log(result["msg"])
        for line in result.get("evidence") or []:
            self.log("  | " + line)
        grace = min(self.options.stop_timeout, 10)
        code = self._failed_start(result["msg"], result.get("evidence"),
                                  self._usage_or(VERDICT_EXIT.get(result["phase"], EXIT_FAILED)))
        self._final_textfile(result["phase"], result["msg"], self.reporter.verdict)
        if not engine.exited.is_set():
            self.log("stopping the engine's process group %d" % engine.pid)
        engine.stop(grace)
        why = "" if code == EXIT_CRASH_LOOP else " so that Restart= applies"
        self.log("engine %s; exiting %d%s" % (engine.describe_exit(), code, why))
        return code

    def _failed_start(self, msg, evidence, code):
        """The exit status for a start that failed with `code`: recorded, and EXIT_CRASH_LOOP when it makes
        a crash loop. A usage error is never restarted anyway."""
        return code if code == EXIT_USAGE else self.crash_loop.failed(msg, evidence, code)

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
        self.serving_config = config
        ping = watchdog_interval(self.environ)
        liveness = None
        if ping is not None and self.options.liveness_failures:
            liveness = watchdog_liveness(config, self.options.liveness_check, self.options.liveness_failures,
                                         ping, log=self.log, status=notifier.status)
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
        evidence = engines.crash_evidence(list(engine.output.tail))
        message = "failed: the engine exited after it was ready (%s)" % engine.describe_exit()
        notifier.status(message)
        self._final_textfile(FAILED, message)
        self.log(message)
        for line in evidence:
            self.log("  | " + line)
        engine.stop(1)  # whatever it left in its group
        return EXIT_ENGINE_EXITED
