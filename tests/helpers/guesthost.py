"""One systemd test host (tools/testhosts) that an integration test deploys onto.

Commands over SSH, systemd's view of a unit, and real playbook runs against the host through a
repository inventory whose one host is pointed at the guest's address: through ansible-runner, as
`python -m modelwake_runner` runs them (modelwake_runner/cli.py), so that the recap, the start's report and a
failed wait's message come from the run's events, not from Ansible's text. Each pytest process
names its guests after its PID, so parallel workers and a developer's own run never share one.
"""
import json
import os
import re
import shutil
import subprocess
import tempfile
import time

from modelwake_runner.cli import run_playbook
from tests.helpers.paths import ANSIBLE, ROOT, SIM_WHEELS, TESTHOSTS
from tests.helpers.waiting import poll
from tools import guest_runtime


# tools/testhosts as a module (its guests' addresses, SSH and root filesystem), the argv of a command on a guest
# over its shared connection, and a command's output: one definition, tools/guest_runtime.py's, which
# `make demo RUNTIME=...` runs too.
testhosts_tool = guest_runtime.testhosts
guest_ssh = guest_runtime.guest_ssh
guest_sh = guest_runtime.guest_sh


def guest_dir(name):
    """The guest's directory on this machine (tools/testhosts' own layout): its console.log, and `merged`, the
    overlay its root runs on, which this side can read and write without the guest's network."""
    return os.path.join(os.environ.get("MODELWAKE_CACHE") or os.path.expanduser("~/.cache/modelwake"),
                        "testhosts", "guests", name)


def host_tool(*args, check=True, timeout=600):
    proc = subprocess.run([TESTHOSTS] + list(args), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          universal_newlines=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError("testhosts %s failed: %s" % (" ".join(args), proc.stdout))
    return proc.stdout.strip()


def guest_vars(key):
    """What a test's own inventory of guests sets for all of them: SSH as root with the tool's key,
    the guest's Python, and the simulated engine's test-only settings, as inventories/demo has them (where
    playbooks/demo-model.yml builds its wheels, which inference_env installs)."""
    return {
        "ansible_user": "root",
        "ansible_ssh_private_key_file": key,
        "ansible_ssh_common_args": "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR",
        "ansible_python_interpreter": "/usr/bin/python3",
        # As inventories/demo/group_vars/all/simulator.yml: for catalog entries that run the simulator.
        "modelwake_sim_wheels": SIM_WHEELS,
        "modelwake_sim_entry": "{{ modelwake_deploy.engine_package | default('') == 'modelwake-sim' }}",
        "inference_env_engine_module": "{{ 'modelwake_sim' if modelwake_sim_entry | bool else '' }}",
        "inference_env_extra_wheel_dirs": "{{ [modelwake_sim_wheels] if modelwake_sim_entry | bool else [] }}",
        "model_service_engine_command": "{{ [model_service_venv ~ '/bin/python', '-m', 'modelwake_sim', 'serve', "
                                        "'--engine', model_service_engine] if modelwake_sim_entry | bool else [] }}",
        "model_service_read_write_paths": "{{ ['-/run/modelwake-fake-gpu'] if '--fake-gpus' in modelwake_deploy.extra_args "
                                          "| default([]) else [] }}",
    }


class Timed(object):
    """`with Timed(timings, label):` stores the block's duration in seconds as timings[label]."""

    def __init__(self, timings, label):
        self.timings = timings
        self.label = label

    def __enter__(self):
        self.start = time.monotonic()
        return self

    def __exit__(self, *exc):
        self.timings[self.label] = round(time.monotonic() - self.start, 1)


# model_service's wait after its restart: when it ran, it followed the start; the role's own wait after
# it only finds the service ready.
RESTART_WAIT = "Wait for the restarted model service to be ready"


class PlayOutput(str):
    """A play's text (Ansible's own output, as ansible-playbook prints it), carrying the run's events
    (modelwake_runner/events.py) as `objects`: what recap(), report() and verdict_msg() read."""

    def __new__(cls, text, objects):
        output = str.__new__(cls, text)
        output.objects = objects
        return output


def verdicts(output, unit=None):
    return [o for o in output.objects if o["event"] == "verdict" and (unit is None or o.get("unit") == unit)]


def verdict_msg(output):
    """The message of the play's last wait that failed or stalled (None when none did)."""
    failed = [v for v in verdicts(output) if v["phase"] in ("failed", "stalled")]
    return (failed[-1].get("msg") or "")[:300] if failed else None


def report(output, unit):
    """How the unit's start went, as model_service reports it: (seconds, [phases]) of the wait that
    followed the restart, else of the role's own wait."""
    waits = [v for v in verdicts(output, unit + ".service") if v["phase"] == "ready"]
    assert waits, output[-3000:]
    followed = [v for v in waits if v.get("task") == RESTART_WAIT] or waits
    return followed[-1]["elapsed"], [phase["phase"] for phase in followed[-1]["phases"]]


def journal_with(pattern, read, timeout=30):
    """A journal as `read()` returns it, once `pattern` is in it (at `timeout` as it is then, for the test's
    assertion to show): journald takes a unit's output from its stream in its own time, so a line the
    launcher wrote just before the state a test saw (its STATUS=, READY=1, or the wait's verdict that
    ended the play) can reach the journal a moment after that state."""
    last = [""]

    def has_it():
        last[0] = read()
        return re.search(pattern, last[0], re.M)

    poll(has_it, timeout, interval=0.5)
    return last[0]


class GuestHost(object):
    """A guest named `<prefix>-<pid>` serving as host `host` of the repository inventory `inventory`."""

    def __init__(self, prefix, inventory, host):
        self.name = "%s-%d" % (prefix, os.getpid() % 100000)
        self.inventory = inventory
        self.host = host
        self.override = None

    def up(self, tmp):
        """Boot the guest and write the inventory override that points `host` at it."""
        self.tmp = tmp
        host_tool("up", self.name)
        self.override = os.path.join(tmp, "address.yml")
        with open(self.override, "w") as handle:
            json.dump({"all": {"children": {"model_hosts": {"hosts": {self.host: {
                "ansible_host": host_tool("addr", self.name),
                "ansible_ssh_private_key_file": host_tool("key")}}}}}}, handle)

    def down(self):
        host_tool("down", self.name, check=False)

    def reboot(self):
        host_tool("reboot", self.name)

    def sh(self, command, check=True, timeout=120, stdin=None):
        """Run a shell command on the guest as root; return its stdout."""
        return guest_sh(self.name, command, check=check, timeout=timeout, stdin=stdin)

    def show(self, unit, *properties):
        """`systemctl show` of the unit's properties, as {name: value}."""
        out = self.sh("systemctl show %s %s" % (unit, " ".join("-p " + name for name in properties)))
        return dict(line.split("=", 1) for line in out.splitlines())

    def unit_state(self, unit):
        return self.show(unit, "InvocationID", "NRestarts", "ActiveState", "SubState", "MainPID", "ExecMainStatus")

    def health(self, port):
        """/health's status code as the guest itself sees it ('000': nothing answered)."""
        return self.sh("python3 -c \"import urllib.request, sys\n"
                       "try: print(urllib.request.urlopen('http://127.0.0.1:%d/health', timeout=3).status)\n"
                       "except urllib.error.HTTPError as e: print(e.code)\n"
                       "except Exception: print('000')\"" % port)

    def completion(self, port, prompt="2+2="):
        """The text of a completion the server on the guest answers (raises when it does not answer)."""
        return self.sh("python3 -c \"import json, urllib.request\n"
                       "request = urllib.request.Request('http://127.0.0.1:%d/v1/completions', method='POST',"
                       " data=json.dumps({'prompt': %r, 'max_tokens': 4}).encode(),"
                       " headers={'Content-Type': 'application/json'})\n"
                       "print(json.load(urllib.request.urlopen(request, timeout=30))['choices'][0]['text'])\"" % (
                           port, prompt))

    def env(self):
        return dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_NOCOLOR="1",
                    ANSIBLE_FORCE_COLOR="0")

    def play(self, playbook, extra=None, timeout=900):
        """A playbook of the repository against the host, through ansible-runner; returns (rc, PlayOutput)."""
        private = tempfile.mkdtemp(prefix="play-", dir=self.tmp)
        objects = []
        try:
            runner, _events = run_playbook(playbook, private, [self.inventory, self.override], extra,
                                           on_object=objects.append, timeout=timeout)
            return runner.rc, PlayOutput(runner.stdout.read(), objects)
        finally:
            shutil.rmtree(private, ignore_errors=True)

    def deploy(self, extra=None):
        return self.play("deploy-k26.yml", extra)

    def recap(self, output):
        """The play recap's counters for the host (ok, changed, unreachable, failed, skipped, rescued, ignored)."""
        recaps = [o["hosts"] for o in output.objects if o["event"] == "recap"]
        assert recaps and self.host in recaps[-1], output[-3000:]
        return recaps[-1][self.host]

    def wait(self, **args):
        """wait_for_model_ready run ad hoc on the guest by real Ansible; returns its result dict."""
        argv = [ANSIBLE, "-i", self.inventory, "-i", self.override, self.host, "-o",
                "-m", "wait_for_model_ready", "-a", json.dumps(args)]
        proc = subprocess.run(argv, cwd=ROOT, env=self.env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              universal_newlines=True, timeout=900)
        for line in proc.stdout.splitlines():
            if line.startswith(self.host + " | "):
                return json.loads(line.split(" => ", 1)[1])
        raise AssertionError("no result from wait_for_model_ready:\n" + proc.stdout[-3000:])
