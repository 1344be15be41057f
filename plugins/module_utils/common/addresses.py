"""Which host a URL names: this host only (loopback), or this host's ports (loopback or wildcard).

The one definition for every caller: a host name is parsed as an address, never matched by its
text, so `127.evil.example` (a DNS name that can point anywhere) is no loopback address.
"""
import ipaddress


def _address(host):
    """The IP address `host` spells (brackets and an IPv6 zone allowed), or None for a name."""
    text = (host or "").strip("[]").split("%")[0]
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return None
    # ::ffff:127.0.0.1 is 127.0.0.1 over IPv6; Python before 3.13 calls it no loopback address.
    return getattr(address, "ipv4_mapped", None) or address


def is_loopback(host):
    """`localhost` or a loopback address (127.0.0.0/8, ::1): a connection to it stays on this host."""
    if (host or "").lower() == "localhost":
        return True
    address = _address(host)
    return address is not None and address.is_loopback


def is_local(host):
    """A loopback or wildcard address (0.0.0.0, ::): a URL with it reaches a port bound on this host,
    so the port's owner is visible here."""
    if is_loopback(host):
        return True
    address = _address(host)
    return address is not None and address.is_unspecified
