"""sd_notify(3) with the standard library: datagrams to systemd's $NOTIFY_SOCKET.

A Type=notify service tells systemd its state by sending `KEY=value` lines, one datagram per
message, to the AF_UNIX SOCK_DGRAM socket named in $NOTIFY_SOCKET: a path, or an abstract name
written with a leading '@' (the kernel's name starts with a NUL byte instead). Outside systemd
the variable is unset and every send is a no-op, so the launcher runs the same way by hand.
"""
import os
import socket

from ..common.errors import ModelWakeError
from ..readiness.status import one_line


class NotifyError(ModelWakeError):
    """$NOTIFY_SOCKET names a socket this code cannot use (not a unix socket address)."""


def socket_address(value):
    """The address to sendto() for a $NOTIFY_SOCKET value: '@name' is abstract, '/path' a file."""
    if value.startswith("@"):
        return "\0" + value[1:]
    if value.startswith("/"):
        return value
    # systemd 254+ also knows "vsock:CID:PORT" (for VMs): never the case for a host service.
    raise NotifyError("NOTIFY_SOCKET=%r is neither an absolute path nor an abstract '@' name" % value)


class Notifier(object):
    """Sends notifications; remembers the last error instead of raising (systemd is one reader)."""

    def __init__(self, environ=None):
        environ = os.environ if environ is None else environ
        value = environ.get("NOTIFY_SOCKET") or ""
        self.address = socket_address(value) if value else None
        self.error = None
        self._sock = None

    @property
    def enabled(self):
        return self.address is not None

    def send(self, *fields):
        """Send `KEY=value` fields in one datagram; True when it was delivered (or nobody listens)."""
        if not self.enabled:
            return True
        message = "\n".join(fields).encode("utf-8")
        try:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            self._sock.sendto(message, self.address)
        except OSError as exc:
            # systemd gone (shutdown) or the socket replaced: report it, never end the service.
            self.error = "cannot notify %s: %s" % (self.address.replace("\0", "@"), exc)
            return False
        self.error = None
        return True

    def ready(self, status=None):
        return self.send(*(["READY=1"] + (["STATUS=" + one_line(status)] if status else [])))

    def status(self, text):
        return self.send("STATUS=" + one_line(text))

    def extend_timeout(self, seconds):
        """Push the current start (or stop) timeout to now + seconds (systemd 236+)."""
        return self.send("EXTEND_TIMEOUT_USEC=%d" % int(seconds * 1000000))

    def watchdog(self):
        return self.send("WATCHDOG=1")

    def stopping(self, status=None):
        return self.send(*(["STOPPING=1"] + (["STATUS=" + one_line(status)] if status else [])))

    def close(self):
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def watchdog_interval(environ=None, pid=None):
    """Seconds between WATCHDOG=1 pings (half of WatchdogSec=), or None when no watchdog is set.

    WATCHDOG_PID, when set, names the process the watchdog is meant for: not us, no pings.
    """
    environ = os.environ if environ is None else environ
    pid = os.getpid() if pid is None else pid
    try:
        usec = int(environ.get("WATCHDOG_USEC") or 0)
    except ValueError:
        return None
    target = environ.get("WATCHDOG_PID")
    if usec <= 0 or (target and target != str(pid)):
        return None
    return usec / 1000000.0 / 2
