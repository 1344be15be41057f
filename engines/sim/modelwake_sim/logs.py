"""Log lines in the real engines' formats, written to stdout in single flushed writes.

SGLang:  `[2026-05-25 19:06:14 TP0] Load weight begin. avail mem=94.12 GB` (main process: no TPn).
vLLM:    `(Worker pid=123) INFO 05-25 19:06:14 [default_loader.py:291] Loading weights took 3.10 seconds`.
tqdm to a non-tty file: every update is `\\r<bar>\\n` (vLLM: after the process prefix).
vLLM multi-line records (tracebacks) end their inner lines with `\\r\\n`, as measured on the real
CPU build; SGLang's use plain `\\n`.
"""
import os
import sys
import time

SGLANG = "sglang"
VLLM = "vllm"

# `--benign-error-lines`: lines of healthy starts that look like a crash and are none, as the real
# engines print them. CuTe DSL's import check, from every SGLang rank as it starts to capture graphs
# (cutlass's own logger, then SGLang's); vLLM's ulimit warning, which quotes an exception.
CUTE_DSL_WALK = "Unexpected error during package walk: cutlass.cute.experimental"
VLLM_ULIMIT = ("Found ulimit of 20000 and failed to automatically increase with error current limit exceeds maximum "
               "limit. This can cause fd limit errors like `OSError: [Errno 24] Too many open files`. Consider "
               "increasing with ulimit -n")


def sglang_prefix(rank=None, now=None):
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now))
    if rank is None:
        return "[%s]" % stamp
    return "[%s TP%d]" % (stamp, rank)


def vllm_process_prefix(role, pid):
    """`(APIServer pid=1)`, `(EngineCore pid=2)`, `(Worker pid=3)` / `(Worker_TP1 pid=3)`."""
    return "(%s pid=%d)" % (role, pid)


def vllm_record(level, source, message, now=None):
    stamp = time.strftime("%m-%d %H:%M:%S", time.localtime(now))
    return "%s %s [%s] %s" % (level, stamp, source, message)


def format_tqdm(desc, done, total, elapsed):
    """One tqdm update in vLLM/SGLang's bar format (`<desc>: <p>% Completed | n/N [t<eta, rate]`)."""
    pct = int(100 * done / total) if total else 100
    rate = elapsed / done if done else None
    if rate is None:
        speed = "?it/s"
        eta = "?"
    elif rate >= 1 or rate == 0:
        speed = "%.2fs/it" % rate
        eta = _clock(rate * (total - done))
    else:
        speed = "%.2fit/s" % (1.0 / rate)
        eta = _clock(rate * (total - done))
    return "%s: %3d%% Completed | %d/%d [%s<%s, %s]" % (desc, pct, done, total, _clock(elapsed), eta, speed)


def _clock(seconds):
    seconds = int(seconds)
    if seconds >= 3600:
        return "%d:%02d:%02d" % (seconds // 3600, seconds // 60 % 60, seconds % 60)
    return "%02d:%02d" % (seconds // 60, seconds % 60)


class Logger:
    """Writes one process's lines with its engine's prefix. One os.write per record keeps records
    from different processes sharing stdout whole."""

    def __init__(self, engine, role="main", rank=None, pid=None, fd=None):
        self.engine = engine
        self.role = role
        self.rank = rank
        self.pid = pid if pid is not None else os.getpid()
        self.fd = fd if fd is not None else sys.stdout.fileno()

    def _write(self, text):
        data = text.encode("utf-8", "replace")
        while data:
            try:
                written = os.write(self.fd, data)
            except InterruptedError:
                continue
            except OSError:
                return  # stdout gone (reader closed): nothing useful left to do with the line
            data = data[written:]

    def _vprefix(self):
        return vllm_process_prefix(self.role, self.pid) + " "

    def info(self, message, source="", level="INFO"):
        """Log a record; `message` may span lines (a traceback)."""
        lines = message.split("\n")
        if self.engine == SGLANG:
            head = sglang_prefix(self.rank) + " " + lines[0]
            self._write("\n".join([head] + lines[1:]) + "\n")
        else:
            head = self._vprefix() + vllm_record(level, source or "api_server.py:1", lines[0])
            rest = [self._vprefix() + line for line in lines[1:]]
            self._write("\r\n".join([head] + rest) + "\n")

    def error(self, message, source=""):
        self.info(message, source, level="ERROR")

    def warning(self, message, source=""):
        self.info(message, source, level="WARNING")

    def raw(self, line):
        """A line written outside the logging module (uvicorn's own logger, print)."""
        if self.engine == SGLANG:
            self._write(line + "\n")
        else:
            self._write(self._vprefix() + line + "\n")

    def benign_errors(self):
        """`--benign-error-lines`: this engine's healthy lines that look like a crash."""
        if self.engine == SGLANG:
            now = time.time()
            self._write("%s,%03d - CUTE_DSL - WARNING - [handle_import_error] - %s\n"
                        % (time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now)), int(now * 1000) % 1000,
                           CUTE_DSL_WALK))
            self.warning(CUTE_DSL_WALK)
        else:
            self.warning(VLLM_ULIMIT, "system_utils.py:255")

    def uvicorn(self, message):
        """Uvicorn's logger: SGLang reconfigures it to `[<time>] INFO:     <msg>`."""
        if self.engine == SGLANG:
            self._write("%s INFO:     %s\n" % (sglang_prefix(None), message))
        else:
            self._write(self._vprefix() + "INFO:     " + message + "\n")

    def progress(self, bar):
        """A tqdm update as tqdm writes it to a file: `\\r<bar>\\n`."""
        if self.engine == SGLANG:
            self._write("\r" + bar + "\n")
        else:
            self._write(self._vprefix() + "\r" + bar + "\n")

    def traceback(self, frames, exc_line, intro="Traceback (most recent call last):", source="", header=None):
        """An exception record: optional header message, the frames, and the final exception line."""
        body = [intro]
        for filename, lineno, func, code in frames:
            body.append('  File "%s", line %d, in %s' % (filename, lineno, func))
            body.append("    " + code)
        body.append(exc_line)
        if header is None:
            # An uncaught exception: Python prints it to the terminal without a log prefix.
            if self.engine == SGLANG:
                self._write("\n".join(body) + "\n")
            else:
                self._write("\r\n".join(self._vprefix() + line for line in body) + "\n")
        else:
            # `logger.error(f"Scheduler hit an exception: {traceback}")` puts the traceback's first
            # line on the header's line; a header without a trailing space gets its own line.
            joiner = "" if header.endswith(" ") else "\n"
            self.error(header + joiner + "\n".join(body), source)
