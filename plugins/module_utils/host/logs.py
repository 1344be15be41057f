"""Reading a server's log as it grows: a file tailer and a journald reader, same interface.

Both return whole lines from `read_new()`, split on `\\r` as well as `\\n`: tqdm redraws its
progress bar with `\\r`, so one "line" of a progress bar holds many updates. Plain `journalctl`
hides such lines as `[N blob data]`; the JSON output carries them (as a list of byte values).

After each `read_new()`, `last_read_context` is True when those lines came from a first read
that may hold an earlier run of the server (the tail of a file appended across restarts): the
classifier does not take fatal lines from such context at face value.
"""
import json
import os
import re
import time

from ..common.command import run_command
from ..common.units import MIB

LINE_BREAK = re.compile(rb"\r\n|\r|\n")
# How much of an existing log file to read on the first look: enough for the current run's
# phase markers, bounded so a huge log does not cost a long read.
FILE_CONTEXT_BYTES = MIB
JOURNAL_CONTEXT_LINES = 2000


def split_records(data):
    """Split bytes into (complete lines as str, remaining partial bytes). Empty lines are dropped."""
    parts = LINE_BREAK.split(data)
    rest = parts.pop()
    lines = [p.decode("utf-8", "replace") for p in parts if p.strip()]
    return lines, rest


class FileTailer(object):
    """Follows a log file across appends, truncation (copytruncate) and rotation (a new inode)."""

    def __init__(self, path, context_bytes=FILE_CONTEXT_BYTES):
        self.path = path
        self.context_bytes = context_bytes
        self.handle = None
        self.inode = None
        self.partial = b""
        self.first = True
        self.last_read_context = False

    def _open(self, from_end):
        try:
            self.handle = open(self.path, "rb")
        except OSError:
            self.handle = None
            return
        stat = os.fstat(self.handle.fileno())
        self.inode = stat.st_ino
        self.partial = b""
        if from_end and stat.st_size > self.context_bytes:
            self.handle.seek(stat.st_size - self.context_bytes)
            self.handle.readline()  # drop the first, cut line

    def read_new(self):
        self.last_read_context = self.first
        if self.handle is None:
            self._open(from_end=self.first)
        self.first = False
        if self.handle is None:
            return []  # not there yet: the server may create it later
        data = self.handle.read()
        try:
            stat = os.stat(self.path)
        except OSError:
            stat = None
        if stat is not None and stat.st_ino != self.inode:
            # Rotated: what was left in the old file is in `data`; continue with the new file.
            self.handle.close()
            self._open(from_end=False)
            if self.handle is not None:
                data += b"\n" + self.handle.read()
        elif stat is not None and stat.st_size < self.handle.tell():
            # Truncated in place: start again from the beginning.
            self.handle.seek(0)
            self.partial = b""
            data = self.handle.read()
        lines, self.partial = split_records(self.partial + data)
        return lines


def decode_message(message):
    """journald's MESSAGE: a string, or a list of byte values when it holds control characters."""
    if isinstance(message, list):
        return bytes(message).decode("utf-8", "replace")
    if message is None:
        return ""
    return str(message)


class JournalReader(object):
    """Reads a unit's journal as JSON with a cursor, so no line is read twice or missed.

    Only the lines of the unit's current run (`invocation_id`, whose main process is `main_pid`) and
    of the runs after it are the start's story. The run a line belongs to is not always the one
    journald names: it tags a stdout line with the unit's invocation at the moment it reads the
    line, not when it was written, so the last words of a run stopped for a restart (vLLM's
    "KeyboardInterrupt: terminated"), read late by a busy journald, carry the new run's id. The
    line's `_PID` (the process whose stream it came through) does not lie: a process whose lines
    carried an earlier run's id belongs to that run, whatever its later lines say.

    `earlier_invocation`: a run known to be an earlier one at every read, not only the first: the run
    a restart replaced, still stopping when the wait began (its drain's lines, the errors of requests
    it refused while it drained, are not this start's story however late they are read).
    """

    def __init__(self, unit, runner=run_command, invocation_id=None, since_epoch=None, main_pid=None,
                 earlier_invocation=None):
        self.unit = unit
        self.runner = runner
        self.invocation_id = invocation_id
        self.earlier_invocation = earlier_invocation
        self.main_pid = str(main_pid) if main_pid else None
        self.earlier_run_pids = set()
        self.since_epoch = time.time() if since_epoch is None else since_epoch
        self.cursor = None
        self.first = True
        self.error = None
        self.last_read_context = False

    def _command(self):
        argv = ["journalctl", "-u", self.unit, "-o", "json", "--no-pager"]
        if self.cursor:
            argv += ["--after-cursor", self.cursor]
        elif self.first:
            argv += ["-n", str(JOURNAL_CONTEXT_LINES)]
        else:
            argv += ["--since", "@%d" % int(self.since_epoch)]
        return argv

    def read_new(self):
        first = self.first
        rc, out, err = self.runner(self._command(), 30)
        self.first = False
        # With the invocation id known, the first read holds only this run: no doubt about it.
        self.last_read_context = first and not self.invocation_id
        if rc != 0:
            self.error = "journalctl failed (rc %d): %s" % (rc, err.strip()[:200])
            return []
        lines = []
        for raw in out.splitlines():
            try:
                entry = json.loads(raw)
            except ValueError:
                continue
            self.cursor = entry.get("__CURSOR", self.cursor)
            if self._of_an_earlier_run(entry, first):
                continue
            parsed, rest = split_records(decode_message(entry.get("MESSAGE")).encode("utf-8"))
            lines.extend(parsed)
            if rest.strip():
                lines.append(rest.decode("utf-8", "replace"))
        return lines

    def _of_an_earlier_run(self, entry, first):
        """Whether entry is an earlier run's line; learns the earlier runs' writers on the first read."""
        pid = entry.get("_PID")
        if pid in self.earlier_run_pids:
            return True
        if self.earlier_invocation and self.earlier_invocation in (entry.get("_SYSTEMD_INVOCATION_ID"),
                                                                   entry.get("INVOCATION_ID")):
            if pid and pid not in ("1", self.main_pid):
                self.earlier_run_pids.add(pid)
            return True
        if not (first and self.invocation_id):
            # Later reads hold this run's lines and those of the restarts that follow it.
            return False
        if pid == "1":
            # systemd's own messages about the unit ("Stopped ...") name their run in INVOCATION_ID.
            return entry.get("INVOCATION_ID") not in (None, self.invocation_id)
        if entry.get("_SYSTEMD_INVOCATION_ID") in (None, self.invocation_id):
            return False
        if pid and pid != self.main_pid:
            self.earlier_run_pids.add(pid)
        return True
