"""The kernel log's records since a start, read from /dev/kmsg without blocking: the driver's Xid lines.

/dev/kmsg gives one record per read(), `prio,seq,usec_since_boot,flags;message`, followed by
continuation lines (` KEY=value`) that are skipped; the read fails with EAGAIN once no record is
left (the descriptor is non-blocking) and with EPIPE when the ring buffer overwrote records not yet
read (the next read goes on with the oldest one left). The descriptor stays open between looks, and
the latest sequence number is kept, so a look reads only the records that arrived since the last.

Records from before the start (the engine's process start, in microseconds since boot, the clock
of the records' own stamps) are left out: an Xid of last week is not this start's fault.

Reading /dev/kmsg needs root where kernel.dmesg_restrict is 1 (the default on Debian and Ubuntu):
the module runs as root, a launcher running as the service user may not. Then `error` says why, and
the wait goes on without this signal (Xid evidence is lost: worth a warning). A host, container or
guest with no /dev/kmsg at all is normal: `absent` says so, and it is no error.

MODELWAKE_KMSG_PATH names another file for tests: a regular file of records in the same format, one
per line (the scripted kernel log of tests/unit/test_kernel_log.py and the integration tests).
"""
import errno
import os

KMSG = "/dev/kmsg"
PATH_ENV = "MODELWAKE_KMSG_PATH"
READ_SIZE = 8192  # /dev/kmsg fails a read whose buffer is smaller than the record (EINVAL)
MAX_RECORDS = 10000  # per look: a flood of kernel messages must not hold the look


def default_path():
    return os.environ.get(PATH_ENV) or KMSG


def parse_record(line):
    """(seq, usec, message) of one `prio,seq,usec,flags;message` record, or None (a continuation
    line, or not a record)."""
    if not line or line[0] in " \t":
        return None
    head, sep, message = line.partition(";")
    fields = head.split(",")
    if not sep or len(fields) < 3:
        return None
    try:
        return int(fields[1]), int(fields[2]), message.rstrip("\n")
    except ValueError:
        return None


class KernelLog(object):
    """New kernel messages containing `match` since `since_usec` (None: every record in the buffer).

    read_new() -> [{"seq", "usec", "message"}]; `error` is why the log could not be read at the
    latest look, else None; `absent`: there is no such file (no kernel log on this host: no error)."""

    def __init__(self, since_usec=None, path=None, match="NVRM: Xid"):
        self.path = path or default_path()
        self.since_usec = since_usec
        self.match = match
        self.last_seq = None
        self.error = None
        self.absent = False
        self._fd = None
        self._pending = b""  # a regular file's partial last line, completed at a later look

    def _open(self):
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        return self._fd

    def close(self):
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _chunks(self, fd):
        """The bytes readable now: one record per read from /dev/kmsg, blocks from a file."""
        for _record in range(MAX_RECORDS):
            try:
                data = os.read(fd, READ_SIZE)
            except BlockingIOError:
                return  # no record left
            except OSError as exc:
                if exc.errno == errno.EPIPE:
                    continue  # records overwritten before they were read: go on with the oldest left
                raise
            if not data:
                return  # the end of a regular file
            yield data

    def read_new(self):
        try:
            fd = self._open()
            data = self._pending + b"".join(self._chunks(fd))
        except OSError as exc:
            self.close()
            self.absent = exc.errno == errno.ENOENT
            self.error = None if self.absent else "kernel log unreadable: %s: %s" % (self.path, exc.strerror or exc)
            return []
        self.error = None
        self.absent = False
        lines = data.split(b"\n")
        self._pending = lines.pop()  # b"" after a whole record; a file's line being written otherwise
        found = []
        for raw in lines:
            record = parse_record(raw.decode("utf-8", "replace"))
            if record is None:
                continue
            seq, usec, message = record
            if self.last_seq is not None and seq <= self.last_seq:
                continue
            self.last_seq = seq
            if self.since_usec is not None and usec < self.since_usec:
                continue
            if self.match in message:
                found.append({"seq": seq, "usec": usec, "message": message})
        return found
