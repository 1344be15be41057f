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
