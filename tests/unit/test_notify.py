"""sd_notify over a real AF_UNIX datagram socket that the test binds: abstract and path names."""
import os
import socket
import uuid

import pytest

from ansible_collections.modelwake.serving.plugins.module_utils.launcher.notify import Notifier, NotifyError, socket_address, watchdog_interval
from ansible_collections.modelwake.serving.plugins.module_utils.readiness.status import one_line


def receive(sock):
    return sock.recv(65536).decode("utf-8").split("\n")


@pytest.fixture
def abstract_socket():
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    name = "modelwake-test-%s" % uuid.uuid4().hex
    sock.bind("\0" + name)
    sock.settimeout(5)
    yield sock, "@" + name
    sock.close()


@pytest.fixture
def path_socket(tmp_path):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    path = str(tmp_path / "notify")
    sock.bind(path)
    sock.settimeout(5)
    yield sock, path
    sock.close()


def test_abstract_name_gets_every_field_in_one_datagram(abstract_socket):
    sock, name = abstract_socket
    notifier = Notifier({"NOTIFY_SOCKET": name})
    assert notifier.enabled
    assert notifier.status("loading 45% (29/64 shards)")
    assert receive(sock) == ["STATUS=loading 45% (29/64 shards)"]
    assert notifier.send("STATUS=initializing", "EXTEND_TIMEOUT_USEC=660000000")
    assert receive(sock) == ["STATUS=initializing", "EXTEND_TIMEOUT_USEC=660000000"]
    assert notifier.ready("ready in 14m03s")
    assert receive(sock) == ["READY=1", "STATUS=ready in 14m03s"]
    notifier.close()


def test_path_socket_and_the_other_messages(path_socket):
    sock, path = path_socket
    notifier = Notifier({"NOTIFY_SOCKET": path})
    notifier.extend_timeout(660.5)
    assert receive(sock) == ["EXTEND_TIMEOUT_USEC=660500000"]
    notifier.watchdog()
    assert receive(sock) == ["WATCHDOG=1"]
    notifier.stopping("stopping: SIGTERM\nforwarded")
    # A newline inside a value would start a bogus field: the status stays one line.
    assert receive(sock) == ["STOPPING=1", "STATUS=stopping: SIGTERM forwarded"]
    notifier.close()


def test_without_notify_socket_nothing_is_sent_and_nothing_fails():
    notifier = Notifier({})
    assert not notifier.enabled
    assert notifier.ready("ready") is True and notifier.error is None


def test_a_vanished_socket_is_reported_not_raised(tmp_path):
    notifier = Notifier({"NOTIFY_SOCKET": str(tmp_path / "gone")})
    assert notifier.status("loading") is False
    assert "cannot notify" in notifier.error and "gone" in notifier.error


def test_addresses():
    assert socket_address("@x/y") == "\0x/y"
    assert socket_address("/run/systemd/notify") == "/run/systemd/notify"
    with pytest.raises(NotifyError, match="NOTIFY_SOCKET"):
        socket_address("vsock:2:1234")
    assert one_line("a\n b\tc ") == "a b c"


@pytest.mark.parametrize("environ, expected", [
    ({}, None),
    ({"WATCHDOG_USEC": "30000000"}, 15.0),
    ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "4242"}, 15.0),
    ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "1"}, None),  # meant for another process
    ({"WATCHDOG_USEC": "0"}, None),
    ({"WATCHDOG_USEC": "x"}, None),
])
def test_watchdog_interval_is_half_of_watchdog_sec(environ, expected):
    assert watchdog_interval(environ, pid=4242) == expected


def test_the_current_process_is_the_default_watchdog_target():
    assert watchdog_interval({"WATCHDOG_USEC": "2000000", "WATCHDOG_PID": str(os.getpid())}) == 1.0
