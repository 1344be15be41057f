"""A real sd_notify receiver for tests: binds an abstract AF_UNIX datagram socket, as systemd
does, and collects every message with the monotonic time it arrived (a thread drains it so the
sender never blocks on a full queue)."""
import socket
import threading
import time
import uuid

from tests.helpers.waiting import poll


class NotifyListener(object):
    def __init__(self):
        self.name = "modelwake-test-%s" % uuid.uuid4().hex
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind("\0" + self.name)
        self.sock.settimeout(0.2)
        self.messages = []  # (monotonic time, [fields])
        self.lock = threading.Lock()
        self.running = True
        self.thread = threading.Thread(target=self._drain, daemon=True)
        self.thread.start()

    @property
    def address(self):
        """The value for NOTIFY_SOCKET."""
        return "@" + self.name

    def _drain(self):
        while self.running:
            try:
                data = self.sock.recv(65536)
            except socket.timeout:
                continue
            except OSError:
                return
            with self.lock:
                self.messages.append((time.monotonic(), data.decode("utf-8").split("\n")))

    def fields(self, key):
        """[(time, value)] of every KEY=value received, in order."""
        with self.lock:
            return [(t, f.split("=", 1)[1]) for t, fields in self.messages for f in fields if f.startswith(key + "=")]

    def wait_for(self, key, timeout, predicate=lambda value: True):
        """The first (time, value) of KEY whose value passes predicate, once it arrives; None at the deadline."""
        return poll(lambda: next(((t, value) for t, value in self.fields(key) if predicate(value)), None), timeout)

    def close(self):
        self.running = False
        self.thread.join(2)
        self.sock.close()
