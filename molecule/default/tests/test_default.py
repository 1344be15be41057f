"""Facts the default scenario must leave on both guests, one test each (testinfra)."""


def test_sshd_is_running(host):
    assert host.service("ssh").is_running


def test_systemd_reached_running(host):
    # `degraded` (a failed unit) or `starting` would mean the guest is not a healthy systemd host.
    assert host.run("systemctl is-system-running").stdout.strip() == "running"


def test_nvidia_smi_answers_8_gpus(host):
    out = host.check_output("nvidia-smi --query-gpu=index,memory.total --format=csv,noheader,nounits")
    rows = [line.split(",") for line in out.splitlines()]
    assert [int(row[0]) for row in rows] == list(range(8))
    assert {int(row[1]) for row in rows} == {97887}


def test_probe_unit_enabled_and_running(host):
    probe = host.service("mw-probe")
    assert probe.is_enabled
    assert probe.is_running
