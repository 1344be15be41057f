"""Durations, sizes and HTTP answers as modelwake writes them everywhere: status lines, messages,
progress lines."""
from .units import GIB, MIB


def duration(seconds):
    """`45s`, `6m12s`, `1h02m`: short enough for a status line, precise enough for an ETA."""
    seconds = int(round(max(0.0, seconds)))
    if seconds < 60:
        return "%ds" % seconds
    if seconds < 3600:
        return "%dm%02ds" % (seconds // 60, seconds % 60)
    return "%dh%02dm" % (seconds // 3600, (seconds % 3600) // 60)


def size(count, mib_digits=1):
    """Bytes as `1.2 GiB` from one GiB up, else MiB with mib_digits decimals (`412 MiB`, `5.0 MiB`)."""
    if count >= GIB:
        return "%.1f GiB" % (count / GIB)
    return "%.*f MiB" % (mib_digits, count / MIB)


def mib(count):
    """Bytes always in MiB, one decimal: for deltas that are compared with each other (`+12.5 MiB`)."""
    return "%.1f MiB" % (count / MIB)


def http_result(result):
    """An HTTP probe's result (host.http_probe.request's dict, or the readiness snapshot's HttpResult) in
    short words: `refused`, `503`, `timeout (no answer in 30 s)`; `not asked` for None."""
    if result is None:
        return "not asked"
    if not isinstance(result, dict):
        result = vars(result)
    if result["kind"] == "status":
        return "%d" % result["code"]
    if result["kind"] == "refused":
        return "refused"
    return "%s (%s)" % (result["kind"], result["error"])


# The signals a dying engine process meets most (Linux numbers), named as `kill -l` names them.
SIGNAL_NAMES = {1: "SIGHUP", 2: "SIGINT", 6: "SIGABRT", 7: "SIGBUS", 9: "SIGKILL", 11: "SIGSEGV", 15: "SIGTERM"}


def exit_words(status):
    """A waitpid() status in words: `exit status 1`, `killed by signal 9 (SIGKILL)`; None: reaped."""
    if status is None:
        return "exit status unknown: reaped"
    number = status & 0x7F
    if number:
        name = SIGNAL_NAMES.get(number)
        return "killed by signal %d%s" % (number, " (%s)" % name if name else "")
    return "exit status %d" % (status >> 8)
