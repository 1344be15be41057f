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

This is the entry point (`modelwake-launch`, `python -m modelwake launch`); the parts live beside it:
cli (options and environment), engine_process (the child, its pipe and its stop), reporter (what
systemd hears) and textfile (Prometheus), liveness (after ready), crash_loop (failed starts counted across
restarts, a loop stopped with EXIT_CRASH_LOOP), hold (a held unit is not restarted), exit_codes, and
supervisor (the run).
"""
import sys

from .cli import parse_args
from .supervisor import Launcher


def main(argv=None):
    options = parse_args(sys.argv[1:] if argv is None else argv)
    return Launcher(options).run()
