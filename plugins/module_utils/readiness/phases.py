"""The phases and verdicts, named the same in the classifier, the launcher's status and the results."""

NOT_STARTED = "not_started"
STARTING = "starting"
LOADING = "loading"
INITIALIZING = "initializing"
READY = "ready"
FAILED = "failed"
STALLED = "stalled"
TIMEOUT = "timeout"
PHASES = (NOT_STARTED, STARTING, LOADING, INITIALIZING, READY)
TERMINAL = (FAILED, STALLED, TIMEOUT)


def order(phase):
    """Where a phase stands along PHASES; a phase outside them (a verdict, None) before them all."""
    return PHASES.index(phase) if phase in PHASES else -1


def later(a, b):
    """The further of two phases along PHASES."""
    return a if order(a) >= order(b) else b
