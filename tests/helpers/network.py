"""Loopback ports for tests."""
import socket


def free_port():
    """A loopback port nothing listens on now (bound once, then released): for a server the test
    starts, or as an address that refuses connections."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
