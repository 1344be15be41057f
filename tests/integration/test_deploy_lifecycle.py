"""deploy-k26.yml and the operator playbooks through a model's life, on a real systemd guest.

One systemd-nspawn guest (tools/testhosts) with scripted GPUs runs the simulated K2.6 as
sglang-k26.service. The tests run the real playbooks with ansible-playbook and check what the
guest's systemd and the play's output say: a crash during load fails the play within seconds with
its root cause; a reboot after ready and during a load brings the service back by itself and a
re-run converges with changed=0 and waits until ready; the GPU preflight stops a listed unit that
holds the GPUs and refuses (naming the PID) a process of no such unit; status, stop, start again.
The guest is destroyed afterwards, also when a test fails.
"""
import json
import os
import re
import shutil
import subprocess
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TESTHOSTS = os.path.join(ROOT, "tools", "testhosts")
PLAYBOOK = os.path.join(ROOT, ".venv", "bin", "ansible-playbook")
GUEST = "mwd-life"
UNIT = "sglang-k26"
FAST = ["--disable-cuda-graph", "--load-rate-mib", "64", "--start-seconds", "1", "--init-seconds", "3",
        "--warmup-seconds", "1"]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0 or shutil.which("systemd-nspawn") is None,
                       reason="test hosts need root and systemd-nspawn (make system-deps)"),
]


def host_tool(*args, check=True):
    proc = subprocess.run([TESTHOSTS] + list(args), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          universal_newlines=True, timeout=600)
    if check and proc.returncode != 0:
        raise AssertionError("testhosts %s failed: %s" % (" ".join(args), proc.stdout))
    return proc.stdout.strip()


def on_guest(command, check=True):
    proc = subprocess.run([TESTHOSTS, "ssh", GUEST, command], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True, timeout=120)
    if check and proc.returncode != 0:
        raise AssertionError("%s failed on the guest: %s %s" % (command, proc.stdout, proc.stderr))
    return proc.stdout.strip()


def unit_state():
    out = on_guest("systemctl show %s -p InvocationID -p NRestarts -p ActiveState -p SubState -p MainPID" % UNIT)
    return dict(line.split("=", 1) for line in out.splitlines())


class Guest(object):
    def __init__(self, tmp):
        self.tmp = tmp
        self.inventory = os.path.join(tmp, "inventory.json")

    def write_inventory(self, address, key):
        inventory = {"all": {
            "children": {"model_hosts": {"hosts": {GUEST: {"ansible_host": address}}}},
            "vars": {
                "ansible_user": "root",
                "ansible_ssh_private_key_file": key,
                "ansible_ssh_common_args": "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR",
                "ansible_python_interpreter": "/usr/bin/python3",
                "modelwake_deploy_model": "k26",
                "modelwake_host_models": ["k26"],
                "modelwake_gpus_required": True,
                "modelwake_demo_model_size_mib": 256,
                "modelwake_demo_model_shards": 64,
                "modelwake_models": {"k26": {
                    "engine": "sim", "engine_version": "0.1.0", "unit": UNIT, "port": 30001,
                    "model_path": "/srv/models/Kimi-K2.6-sim", "tp": 8, "gpus": list(range(8)),
                    "extra_args": FAST, "conflicts": ["sglang-k26-ddtree"],
                    "ready_timeout": 300, "stall_timeout": 60}},
            }}}
        with open(self.inventory, "w") as handle:
            json.dump(inventory, handle)

    def play(self, playbook, extra=None):
        """Run a playbook; return (rc, output, seconds)."""
        argv = [PLAYBOOK, "-i", self.inventory, os.path.join(ROOT, playbook)]
        if extra:
            argv += ["-e", json.dumps(extra)]
        env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_NOCOLOR="1")
        start = time.monotonic()
        proc = subprocess.run(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              universal_newlines=True, timeout=900)
        return proc.returncode, proc.stdout, time.monotonic() - start


def recap(output):
    match = re.search(r"^%s\s+: (.*)$" % re.escape(GUEST), output, re.M)
    assert match, output
    return dict((k, int(v)) for k, v in re.findall(r"(\w+)=(\d+)", match.group(1)))


@pytest.fixture(scope="module")
def guest(tmp_path_factory):
    host_tool("up", GUEST)
    try:
        host_tool("install-fake-gpus", GUEST)
        g = Guest(str(tmp_path_factory.mktemp("life")))
        g.write_inventory(host_tool("addr", GUEST), host_tool("key"))
        rc, out, _ = g.play("playbooks/demo-model.yml")
        assert rc == 0, out
        rc, out, _ = g.play("deploy-k26.yml")
        assert rc == 0, out
        assert '"2+2=" -> "4"' in out
        yield g
    finally:
        host_tool("down", GUEST, check=False)


def test_rerun_converges_without_restart(guest):
    before = unit_state()
    rc, out, _ = guest.play("deploy-k26.yml")
    assert rc == 0, out
    assert recap(out)["changed"] == 0
    after = unit_state()
    assert after["InvocationID"] == before["InvocationID"] and after["MainPID"] == before["MainPID"]


def test_crash_during_load_fails_within_seconds_with_the_root_cause(guest):
    rc, out, _ = guest.play("deploy-k26.yml", {"model_service_extra_args": FAST + ["--fault", "crash1:loading"]})
    assert rc == 2, out
    failed = out[out.index("Wait for the restarted model service to be ready"):]
    assert "phase: failed" in failed, failed
    assert "torch.OutOfMemoryError: CUDA out of memory" in failed
    elapsed = int(re.search(r"^\s+elapsed: (\d+)", failed, re.M).group(1))
    assert elapsed <= 20, failed
    # Back to a good configuration: one restart, ready again.
    rc, out, _ = guest.play("deploy-k26.yml")
    assert rc == 0, out


def test_reboot_after_ready_and_during_load_comes_back_and_converges(guest):
    # A slower start (256 MiB at 8 MiB/s, then 20 s of silent initialisation): the reboot lands in
    # the middle of it, and the re-run (about 20 s of Ansible before its wait) still finds it loading.
    slow = {"model_service_extra_args": ["--disable-cuda-graph", "--load-rate-mib", "8", "--start-seconds", "1",
                                         "--init-seconds", "20", "--warmup-seconds", "1"]}
    rc, out, _ = guest.play("deploy-k26.yml", slow)
    assert rc == 0, out
    host_tool("reboot", GUEST)
    # The unit is enabled: systemd starts it at boot, without Ansible.
    assert unit_state()["ActiveState"] in ("active", "activating")
    # Reboot again while it is loading (before the port opens).
    assert on_guest("ss -ltn 'sport = :30001' | tail -n +2") == ""
    host_tool("reboot", GUEST)
    assert unit_state()["ActiveState"] in ("active", "activating")
    rc, out, _ = guest.play("deploy-k26.yml", slow)
    assert rc == 0, out
    assert recap(out)["changed"] == 0
    # It waited for the load: the wait saw a phase before ready.
    report = re.search(r"sglang-k26: ready after (\d+) s \(([^)]*)\)", " ".join(out.split()))
    assert report and int(report.group(1)) > 0 and report.group(2) != "ready", out
    rc, out, _ = guest.play("deploy-k26.yml")
    assert rc == 0, out


def test_preflight_stops_a_listed_unit_and_refuses_a_foreign_holder(guest):
    holder_file = "/run/modelwake-fake-gpu/holder-%s.json"
    on_guest("systemd-run --unit=sglang-k26-ddtree --property=Type=exec python3 -c 'import time; time.sleep(86400)'")
    ddtree_pid = on_guest("systemctl show sglang-k26-ddtree -p MainPID --value")
    on_guest("echo '{\"pid\": %s, \"name\": \"python\", \"gpus\": {\"0\": {\"memory_mib\": 55000, \"utilization\": 0}}}' > %s"
             % (ddtree_pid, holder_file % "ddtree"))
    foreign_pid = on_guest("setsid nohup python3 -c 'import time; time.sleep(86400)' >/dev/null 2>&1 & echo $!")
    try:
        on_guest("echo '{\"pid\": %s, \"name\": \"python\", \"gpus\": {\"1\": {\"memory_mib\": 30000, \"utilization\": 0}}}' > %s"
                 % (foreign_pid, holder_file % "foreign"))
        rc, out, _ = guest.play("deploy-k26.yml")
        assert rc == 2, out
        flat = " ".join(out.split())
        assert "PIDs %s:" % foreign_pid in flat
        assert re.search(r"%s root (session-\d+\.scope|ssh\.service) foreign 1:30000" % foreign_pid, flat), flat
        # Nothing was touched: neither the foreign process nor the listed unit (the play stopped first).
        on_guest("kill -0 %s" % foreign_pid)
        assert on_guest("systemctl is-active sglang-k26-ddtree") == "active"
    finally:
        on_guest("kill %s; rm -f %s" % (foreign_pid, holder_file % "foreign"), check=False)
    rc, out, _ = guest.play("deploy-k26.yml")
    assert rc == 0, out
    assert "changed: [%s] => (item=sglang-k26-ddtree.service)" % GUEST in out
    assert on_guest("systemctl is-active sglang-k26-ddtree", check=False) in ("inactive", "failed")
    assert unit_state()["ActiveState"] == "active"
    on_guest("rm -f %s" % (holder_file % "ddtree"))


def test_status_stop_and_start_again(guest):
    rc, out, _ = guest.play("playbooks/status.yml")
    assert rc == 0, out
    assert re.search(r"%s\s+sglang-k26\s+ready\s" % GUEST, out), out
    rc, out, _ = guest.play("playbooks/stop.yml")
    assert rc == 0, out
    assert on_guest("systemctl is-active %s" % UNIT, check=False) == "inactive"
    assert on_guest("systemctl is-enabled %s" % UNIT, check=False) == "disabled"
    # KillMode=control-group: no rank is left behind.
    assert on_guest("pgrep -u modelwake -f modelwake_sim", check=False) == ""
    rc, out, _ = guest.play("playbooks/status.yml")
    assert rc == 0 and re.search(r"%s\s+sglang-k26\s+not_started\s" % GUEST, out), out
    # A unit that is down gets started (no handler fires: nothing changed but the enablement) and waited on.
    rc, out, _ = guest.play("deploy-k26.yml")
    assert rc == 0, out
    assert unit_state()["ActiveState"] == "active"
    assert on_guest("systemctl is-enabled %s" % UNIT) == "enabled"
