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


def later(a, b):
    """The further of two phases along PHASES (a phase outside them counts as before them all)."""
    def order(phase):
        return PHASES.index(phase) if phase in PHASES else -1
    return a if order(a) >= order(b) else b
