"""NVIDIA Xid codes: what each means and whether it is the hardware's fault. Pure data and a parser.

The driver logs a GPU fault to the kernel log as one line,
`NVRM: Xid (PCI:0000:41:00): 79, pid=1234, name=python3, GPU has fallen off the bus.`
(older drivers leave out `PCI:`, and pid/name when no process is involved). The codes and their
meaning follow NVIDIA's Xid catalog (https://docs.nvidia.com/deploy/xid-errors/, "Analyzing Xid
Errors with the Xid Catalog"): its resolution buckets RESET_GPU, RESTART_BM (reboot) and
CONTACT_SUPPORT are a fault of the GPU, its memory, its links or the driver; RESTART_APP with
an application cause (a bad address, an illegal instruction) is the program's own error.

Severities:
  fatal  the GPU or the driver failed: no engine starts on it until it is reset or the node drained;
         a fatal Xid on a watched GPU makes the wait's verdict `failed`.
  app    an application's error reported by the driver (a CUDA kernel's bad access): the engine's own
         log says the rest; quoted in the evidence only.
  info   a consequence or a warning (cleanup after another error, corrected ECC errors).
A code not in the table is quoted as unknown.
"""
import re

FATAL = "fatal"
APP = "app"
INFO = "info"
UNKNOWN = "unknown"

RESET = "reset the GPU or drain the node"
REBOOT = "reboot or drain the node"

# code -> (meaning, severity, what to do)
XID_CODES = {
    8: ("GPU stopped processing (channel idle timeout)", APP, "restart the application"),
    13: ("Graphics Engine Exception (often an application's out-of-range access)", APP, "check the application"),
    31: ("GPU memory page fault (an application's bad address, or a driver error)", APP, "check the application"),
    32: ("invalid or corrupted push buffer stream", APP, "restart the application"),
    43: ("GPU stopped processing (a channel was reset after an application's error)", APP, "restart the application"),
    45: ("preemptive cleanup, due to previous errors", INFO, "see the Xid before it"),
    48: ("double-bit ECC error in GPU memory", FATAL, RESET),
    61: ("internal micro-controller breakpoint/warning", FATAL, RESET),
    62: ("internal micro-controller halt", FATAL, RESET),
    63: ("ECC page retirement or row remapping recorded: a failing memory row", FATAL, RESET),
    64: ("ECC page retirement or row remapping failed", FATAL, RESET),
    69: ("graphics engine class error", APP, "restart the application"),
    74: ("NVLink error", FATAL, RESET),
    79: ("GPU has fallen off the bus", FATAL, REBOOT),
    92: ("high single-bit ECC error rate (corrected)", INFO, "watch the GPU's ECC counters"),
    94: ("contained ECC error: uncorrectable memory error, the affected application stopped", FATAL, RESET),
    95: ("uncontained ECC error: uncorrectable memory error", FATAL, RESET),
    109: ("context switch timeout", APP, "restart the application"),
    119: ("GSP RPC timeout: the GPU's system processor did not answer the driver", FATAL, RESET),
    120: ("GSP error: the GPU's system processor failed", FATAL, RESET),
    140: ("unrecovered ECC error", FATAL, RESET),
    143: ("GPU initialisation failure", FATAL, RESET),
    154: ("GPU recovery action changed: the driver asks for a reset or a reboot", FATAL, REBOOT),
}

# `NVRM: Xid (PCI:0000:41:00): 79, pid=1234, name=python3, GPU has fallen off the bus.`
XID_LINE = re.compile(r"NVRM: Xid \((?:PCI:)?(?P<pci>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2})(?:\.[0-9A-Fa-f])?\):"
                      r"\s*(?P<code>\d+)(?:,\s*(?P<rest>.*))?$")
PID = re.compile(r"pid=(\d+)")
NAME = re.compile(r"name=([^,]*)")


def pci_id(text):
    """'0000:41:00', lower case, from the kernel's '0000:41:00' or NVML's and nvidia-smi's
    '00000000:41:00.0' (the domain's upper half and the function dropped), or None."""
    match = re.match(r"^\s*(?:PCI:)?([0-9A-Fa-f]{4,8}):([0-9A-Fa-f]{2}):([0-9A-Fa-f]{2})(?:\.[0-9A-Fa-f])?\s*$",
                     text or "")
    if not match:
        return None
    return "%04x:%s:%s" % (int(match.group(1), 16) & 0xFFFF, match.group(2).lower(), match.group(3).lower())


def parse(message):
    """{"pci", "code", "pid", "name", "detail", "line"} of one kernel message, or None when it is not
    an Xid line."""
    match = XID_LINE.search(message.strip())
    if not match:
        return None
    rest = match.group("rest") or ""
    pid = PID.search(rest)
    name = NAME.search(rest)
    # What follows pid= and name= is the driver's own words about the fault.
    detail = ", ".join(part.strip() for part in rest.split(",")
                       if part.strip() and not part.strip().startswith(("pid=", "name=")))
    return {"pci": pci_id(match.group("pci")), "code": int(match.group("code")),
            "pid": int(pid.group(1)) if pid else None,
            "name": name.group(1).strip() if name else None,
            "detail": detail, "line": message.strip()}


def describe(code):
    """(meaning, severity, what to do) of an Xid code."""
    return XID_CODES.get(code, ("not in modelwake's table: see NVIDIA's Xid catalog", UNKNOWN,
                                "see NVIDIA's Xid catalog"))


def is_fatal(code):
    return describe(code)[1] == FATAL
