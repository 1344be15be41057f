"""NVIDIA Xid lines: the parser and the table (readiness/xid.py), and the verdicts the classifier
gives them: a fatal Xid on a watched GPU fails the wait, anything else is quoted in the evidence."""
import pytest

from ansible_collections.modelwake.serving.plugins.module_utils.readiness import xid

from tests.helpers.traces import SGLANG_PREFIX, Trace, config, replay

FALLEN = "NVRM: Xid (PCI:0000:41:00): 79, pid=1234, name=python3, GPU has fallen off the bus."


# -- the parser ------------------------------------------------------------------------------

def test_a_current_drivers_line_gives_the_pci_id_code_process_and_the_drivers_words():
    assert xid.parse(FALLEN) == {"pci": "0000:41:00", "code": 79, "pid": 1234, "name": "python3",
                                 "detail": "GPU has fallen off the bus.", "line": FALLEN}


@pytest.mark.parametrize("line,pci,code,pid,detail", [
    # Older drivers: no `PCI:`, no pid or name.
    ("NVRM: Xid (0000:01:00): 3, C 00000005 SC 00000007", "0000:01:00", 3, None, "C 00000005 SC 00000007"),
    # A row remap pending (stas00/ml-engineering's example), upper-case hex in the bus id.
    ("NVRM: Xid (PCI:0000:1C:00): 63, pid=1896, Row Remapper: New row marked for remapping, reset gpu to activate.",
     "0000:1c:00", 63, 1896, "Row Remapper: New row marked for remapping, reset gpu to activate."),
    # No process involved: pid='<unknown>'.
    ("NVRM: Xid (PCI:0000:9a:00): 94, pid='<unknown>', name=<unknown>, Contained: SM (0x1). RST: No",
     "0000:9a:00", 94, None, "Contained: SM (0x1). RST: No"),
    ("NVRM: Xid (PCI:0000:2b:00): 79, GPU has fallen off the bus.", "0000:2b:00", 79, None,
     "GPU has fallen off the bus."),
])
def test_the_forms_drivers_write(line, pci, code, pid, detail):
    parsed = xid.parse(line)
    assert (parsed["pci"], parsed["code"], parsed["pid"], parsed["detail"]) == (pci, code, pid, detail)


@pytest.mark.parametrize("line", [
    "NVRM: GPU at PCI:0000:2b:00: GPU-0b11d014-1685-04bd-26ed-5fc0bc1c44ae",
    "NVRM: GPU 0000:2b:00.0: GPU has fallen off the bus.",
    "nvidia-modeset: Loading NVIDIA Kernel Mode Setting Driver",
    "",
])
def test_other_kernel_lines_are_not_xids(line):
    assert xid.parse(line) is None


@pytest.mark.parametrize("text,expected", [
    ("00000000:41:00.0", "0000:41:00"),  # NVML's busId, nvidia-smi's pci.bus_id
    ("0000:41:00", "0000:41:00"),  # the kernel's
    ("PCI:0000:9A:00", "0000:9a:00"),
    ("00010000:05:01.0", "0000:05:01"),  # the domain's upper half is not in the kernel's form
    ("41:00.0", None),
    ("", None),
])
def test_pci_ids_of_the_kernel_nvml_and_nvidia_smi_compare_alike(text, expected):
    assert xid.pci_id(text) == expected


@pytest.mark.parametrize("code", [48, 63, 64, 74, 79, 94, 95, 119, 120, 154])
def test_memory_link_bus_and_gsp_faults_are_fatal(code):
    assert xid.is_fatal(code)
    meaning, severity, action = xid.describe(code)
    assert severity == xid.FATAL and meaning and ("reset" in action or "reboot" in action)


@pytest.mark.parametrize("code,severity", [(13, xid.APP), (31, xid.APP), (43, xid.APP), (45, xid.INFO),
                                           (92, xid.INFO), (9999, xid.UNKNOWN)])
def test_application_errors_cleanup_and_unknown_codes_are_not(code, severity):
    assert not xid.is_fatal(code)
    assert xid.describe(code)[1] == severity


# -- the verdicts ---------------------------------------------------------------------------

def xid_record(line, gpu):
    return dict(xid.parse(line), gpu=gpu, usec=5000000)


def loading(trace, t, xids=None, lines=(), gpu_mem=None):
    snap = trace.step(t, cpu=1.0, read=500 * 2 ** 20, lines=lines, gpu_mem=gpu_mem)
    snap.xids = xids
    return snap


def story(xids_at_20, lines_at_20=()):
    trace = Trace(gpus=4)
    return [loading(trace, 0, lines=[SGLANG_PREFIX + "Load weight begin. avail mem=85 GB"]),
            loading(trace, 10),
            loading(trace, 20, xids=xids_at_20, lines=lines_at_20),
            loading(trace, 30)]


def test_a_fatal_xid_on_a_watched_gpu_fails_the_wait_naming_the_gpu_the_code_and_its_meaning():
    cfg = config(engine="sglang", gpus=[2, 3])
    verdicts = replay(cfg, story([xid_record(FALLEN, 3)]))
    t, verdict = verdicts[-1]
    assert t == 20 and verdict.phase == "failed" and verdict.terminal
    assert verdict.msg == ("failed: GPU 3 (PCI 0000:41:00) reported Xid 79 (GPU has fallen off the bus): a fault of "
                           "the GPU or its driver, not of the engine; reboot or drain the node")
    assert verdict.evidence[0] == FALLEN


def test_the_xid_is_the_cause_when_the_engine_logs_its_crash_in_the_same_look():
    ecc = "NVRM: Xid (PCI:0000:41:00): 94, pid=1234, name=python3, Contained: SM (0x1). RST: No"
    crash = SGLANG_PREFIX + "RuntimeError: CUDA error: uncorrectable ECC error encountered"
    verdict = replay(config(engine="sglang"), story([xid_record(ecc, 3)], lines_at_20=[crash]))[-1][1]
    assert verdict.phase == "failed" and "reported Xid 94 (contained ECC error" in verdict.msg
    assert verdict.evidence[0] == ecc and crash in verdict.evidence


def test_every_gpu_is_watched_without_gpus_even_one_the_driver_could_not_name():
    verdict = replay(config(engine="sglang"), story([xid_record(FALLEN, None)]))[-1][1]
    assert verdict.phase == "failed"
    assert verdict.msg.startswith("failed: the GPU at PCI 0000:41:00 reported Xid 79")


def test_a_fatal_xid_on_a_gpu_the_wait_does_not_watch_is_only_quoted():
    """A shared host: GPU 5 belongs to another model; its fault is evidence here, not this start's failure."""
    other = "NVRM: Xid (PCI:0000:c1:00): 48, pid=999, name=python3, DBE (0x1) ..."
    verdicts = replay(config(engine="sglang", gpus=[0, 1]), story([xid_record(other, 5)]))
    assert [v.phase for _t, v in verdicts] == ["loading"] * 4
    quoted = [e for e in verdicts[-1][1].evidence if e.startswith("kernel: ")]
    assert quoted == ["kernel: %s [Xid 48 on GPU 5 (PCI 0000:c1:00): double-bit ECC error in GPU memory; "
                      "not a watched GPU]" % other]
    # Unmapped while only some GPUs are watched: it may be anyone's, so quoted too.
    verdicts = replay(config(engine="sglang", gpus=[0, 1]), story([xid_record(other, None)]))
    assert verdicts[-1][1].phase == "loading"


def test_an_application_xid_is_quoted_in_every_later_verdict_and_fails_nothing():
    page_fault = "NVRM: Xid (PCI:0000:41:00): 31, pid=1234, name=python3, Ch 00000008, intr 10000000. MMU Fault"
    verdicts = replay(config(engine="sglang", gpus=[3]), story([xid_record(page_fault, 3)]))
    assert [v.phase for _t, v in verdicts] == ["loading"] * 4
    for _t, verdict in verdicts[2:]:
        assert ("kernel: %s [Xid 31 on GPU 3 (PCI 0000:41:00): GPU memory page fault (an application's bad "
                "address, or a driver error); app]" % page_fault) in verdict.evidence
    assert not [e for e in verdicts[1][1].evidence if e.startswith("kernel: ")]


def test_gpus_that_are_no_longer_read_are_neither_progress_nor_a_fault():
    """NVML wedged: the looks after it read no GPU. The memory last seen is not a change, and the
    stall clock runs from the last real progress."""
    cfg = config(engine="sglang", stall_timeout=60, poll_interval=10)
    trace = Trace(gpus=2)
    snaps = [trace.step(0, lines=[SGLANG_PREFIX + "Load weight begin. avail mem=85 GB"], gpu_mem=[500, 500]),
             trace.step(10, gpu_mem=[9000, 9000]), trace.step(20, gpu_mem=[18000, 18000])]
    for t in range(30, 100, 10):
        snap = trace.step(t)
        snap.gpus = []
        snap.errors = ["NVML did not answer in 5 s (GPU 1, nvmlDeviceGetMemoryInfo)"]
        snaps.append(snap)
    verdicts = dict(replay(cfg, snaps))
    assert all(verdicts[t].phase == "loading" for t in range(0, 80, 10))
    assert verdicts[80].phase == "stalled" and "(last progress: GPU memory +9000 MiB on GPU 0,1 at +20 s" in verdicts[80].msg
    assert verdicts[80].gpu == []
