"""The launcher's exit statuses: what the unit's Restart= and RestartPreventExitStatus= act on."""
from ..host import failed_starts
from ..readiness.phases import FAILED, STALLED, TIMEOUT

EXIT_USAGE = 2  # bad options: nothing was started (argparse uses 2 too)
EXIT_FAILED = 3  # the engine crashed before it was ready
EXIT_STALLED = 4  # no progress on any signal for --stall-timeout
EXIT_TIMEOUT = 5  # still not ready at --timeout
EXIT_ENGINE_EXITED = 6  # the engine exited after it was ready (even with status 0)
# --crash-loop-starts failed starts in a row with one root cause: the loop is stopped (7). Defined with
# the record (host/failed_starts.py): the wait recognises a stopped loop by it.
EXIT_CRASH_LOOP = failed_starts.EXIT_CRASH_LOOP
EXIT_HELD = 8  # one of 3-6 or 9, on a unit under a maintenance hold: not restarted (launcher/hold.py)
# --prefetch could not read the model (a damaged or truncated shard, EIO, a stalled read): the engine was
# never started; the message names the shard (launcher/prefetch_step.py). Restarted: an I/O error may pass.
EXIT_PREFETCH = 9
VERDICT_EXIT = {FAILED: EXIT_FAILED, STALLED: EXIT_STALLED, TIMEOUT: EXIT_TIMEOUT}
