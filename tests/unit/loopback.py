"""Loopback helpers shared by the tests that talk HTTP."""
import socket


def closed_port():
    """A loopback port nothing listens on (bound once, then released)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    return port
