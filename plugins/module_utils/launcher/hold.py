"""The launcher and the maintenance hold (host/hold.py): a held unit is not restarted by systemd.

When the engine of a held unit fails, stalls, times out or exits after ready, the launcher exits with
EXIT_HELD instead of the verdict's status: the unit lists it in RestartPreventExitStatus=, so
Restart= does not start it again while a person works on the box. The hold is read at that moment,
not at start: a hold set while the engine runs applies without a restart, and a release needs none
either. A person's own `systemctl start` is not automation and still starts it."""
from ..host.hold import hold_path, read_hold
from .exit_codes import EXIT_ENGINE_EXITED, EXIT_HELD, EXIT_PREFETCH, VERDICT_EXIT

# The statuses after which Restart= would start the engine again (EXIT_USAGE already prevents it).
RESTARTING_EXITS = frozenset(list(VERDICT_EXIT.values()) + [EXIT_ENGINE_EXITED, EXIT_PREFETCH])


def exit_status_when_held(hold_dir, unit, code, log):
    """`code`, or EXIT_HELD when `unit` is held (its flag in `hold_dir`) and `code` would have it restarted."""
    if code not in RESTARTING_EXITS:
        return code
    hold = read_hold(hold_path(hold_dir, unit))
    if hold is None:
        return code
    log("%s: not restarting (exit %d instead of %d; release the hold, then start the unit)"
        % (hold.describe(), EXIT_HELD, code))
    return EXIT_HELD
