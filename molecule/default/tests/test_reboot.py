"""The guest side_effect.yml rebooted really booted again, and its enabled unit came back."""

testinfra_hosts = ["mol-dflt-1"]


def test_boot_id_changed(host):
    before = host.file("/var/lib/mw-probe/boot_id_before_reboot").content_string.strip()
    assert before
    assert host.file("/proc/sys/kernel/random/boot_id").content_string.strip() != before


def test_probe_unit_is_back_after_reboot(host):
    assert host.service("mw-probe").is_running
