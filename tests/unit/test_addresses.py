"""The one "is this URL on this host" test: a host is parsed as an address, never matched as text."""
import pytest

from ansible_collections.modelwake.serving.plugins.module_utils.common.addresses import is_local, is_loopback


@pytest.mark.parametrize("host, loopback, local", [
    ("127.0.0.1", True, True),
    ("127.10.0.1", True, True),  # all of 127.0.0.0/8 is loopback
    ("::1", True, True),
    ("[::1]", True, True),
    ("::ffff:127.0.0.1", True, True),  # IPv4-mapped, whatever the Python version says of it
    ("localhost", True, True),
    ("LOCALHOST", True, True),
    ("0.0.0.0", False, True),  # the wildcard: a port bound on this host, but no host to send to
    ("::", False, True),
    ("10.0.0.5", False, False),
    ("k26.example.org", False, False),
    # Names that only look like loopback: DNS can point them anywhere.
    ("127.evil.example", False, False),
    ("localhost.evil.example", False, False),
    ("::1.evil.example", False, False),
    ("", False, False),
    (None, False, False),
])
def test_only_addresses_of_this_host_are_loopback_or_local(host, loopback, local):
    assert is_loopback(host) is loopback
    assert is_local(host) is local
