"""InfiniBand port counters from sysfs: the bytes a host received and sent over RDMA.

Why: a load pulled from a peer's GPU memory over RDMA (SGLang `--load-format remote_instance`,
NIXL) does no file or socket I/O at all, so no /proc/<pid>/io counter moves; the HCA's port
counters do. They are host-wide (per port, not per process): growth during a load is evidence
that bytes arrive, not proof of whose.

The counters are `/sys/class/infiniband/<device>/ports/<port>/counters/port_rcv_data` and
`port_xmit_data`. Their unit is 4 bytes: "Total number of data octets, divided by 4 (lanes)"
(Linux, Documentation/ABI/stable/sysfs-class-infiniband), so each value is multiplied by 4.
A host without an HCA has no such tree: the reading is empty, never an error.
"""
import os

SYSFS_ROOT = "/sys/class/infiniband"
WORD_BYTES = 4  # port_rcv_data and port_xmit_data count 32-bit words
COUNTERS = (("port_rcv_data", "rcv_bytes"), ("port_xmit_data", "xmit_bytes"))


def _counter(path):
    try:
        with open(path) as handle:
            return int(handle.read().strip()) * WORD_BYTES
    except (OSError, ValueError):
        return None  # a port without the counter, or one that went away while we read it


def read_ports(sysfs_root=SYSFS_ROOT):
    """{"<device>/<port>": {"rcv_bytes": int or None, "xmit_bytes": int or None}}; {} without an HCA."""
    found = {}
    try:
        devices = sorted(os.listdir(sysfs_root))
    except OSError:
        return found
    for device in devices:
        ports_dir = os.path.join(sysfs_root, device, "ports")
        try:
            ports = sorted(os.listdir(ports_dir), key=lambda name: (len(name), name))
        except OSError:
            continue
        for port in ports:
            counters_dir = os.path.join(ports_dir, port, "counters")
            reading = dict((key, _counter(os.path.join(counters_dir, name))) for name, key in COUNTERS)
            if any(value is not None for value in reading.values()):
                found["%s/%s" % (device, port)] = reading
    return found


def received_bytes(ports):
    """The bytes received over all ports of a read_ports() result, or None when there are none."""
    values = [reading["rcv_bytes"] for reading in ports.values() if reading["rcv_bytes"] is not None]
    return sum(values) if values else None
