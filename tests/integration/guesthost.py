"""One systemd test host (tools/testhosts) that an integration test deploys onto.

Commands over SSH, systemd's view of a unit, and real `ansible-playbook` / `ansible` runs against
the host through a repository inventory whose one host is pointed at the guest's address. Each
pytest process names its guests after its PID, so parallel workers and a developer's own run never
share one.
"""
import json
import os
import re
import subprocess
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TESTHOSTS = os.path.join(ROOT, "tools", "testhosts")
BIN = os.path.join(ROOT, ".venv", "bin")


def host_tool(*args, check=True, timeout=600):
    proc = subprocess.run([TESTHOSTS] + list(args), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          universal_newlines=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError("testhosts %s failed: %s" % (" ".join(args), proc.stdout))
    return proc.stdout.strip()


def until(what, predicate, timeout=300, interval=0.5):
    """Poll predicate() until it returns something true; fail naming what was awaited."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError("%s: not seen within %d s" % (what, timeout))


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


def verdict_msg(output):
    """The failed wait's message in a play's output (the YAML result's msg)."""
    match = re.search(r"^\s+msg: '?((failed|stalled)[^\n]*)", output, re.M)
    return match.group(1)[:300] if match else None


def report(output, unit):
    """model_service's 'Report how the start went' line: (seconds, [phases])."""
    match = re.search(r"%s: ready after (\d+) s \(([^)]*)\)" % re.escape(unit), " ".join(output.split()))
    assert match, output[-3000:]
    return int(match.group(1)), match.group(2).split(" -> ")


class GuestHost(object):
    """A guest named `<prefix>-<pid>` serving as host `host` of the repository inventory `inventory`."""

    def __init__(self, prefix, inventory, host):
        self.name = "%s-%d" % (prefix, os.getpid() % 100000)
        self.inventory = inventory
        self.host = host
        self.override = None

    def up(self, tmp):
        """Boot the guest and write the inventory override that points `host` at it."""
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
        proc = subprocess.run([TESTHOSTS, "ssh", self.name, command], input=stdin, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, timeout=timeout)
        out = proc.stdout.decode("utf-8", "replace").strip()
        if check and proc.returncode != 0:
            raise AssertionError("%s failed on the guest (rc %d): %s %s"
                                 % (command, proc.returncode, out, proc.stderr.decode("utf-8", "replace")))
        return out

    def unit_state(self, unit):
        out = self.sh("systemctl show %s -p InvocationID -p NRestarts -p ActiveState -p SubState -p MainPID "
                      "-p ExecMainStatus" % unit)
        return dict(line.split("=", 1) for line in out.splitlines())

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
        """ansible-playbook against the host; returns (rc, output)."""
        argv = [os.path.join(BIN, "ansible-playbook"), "-i", self.inventory, "-i", self.override,
                os.path.join(ROOT, playbook)]
        if extra:
            argv += ["-e", json.dumps(extra)]
        proc = subprocess.run(argv, cwd=ROOT, env=self.env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              universal_newlines=True, timeout=timeout)
        return proc.returncode, proc.stdout

    def deploy(self, extra=None):
        return self.play("deploy-k26.yml", extra)

    def recap(self, output):
        """The play recap's counters for the host."""
        match = re.search(r"^%s\s+: (.*)$" % re.escape(self.host), output, re.M)
        assert match, output[-3000:]
        return dict((k, int(v)) for k, v in re.findall(r"(\w+)=(\d+)", match.group(1)))

    def wait(self, **args):
        """wait_for_model_ready run ad hoc on the guest by real Ansible; returns its result dict."""
        argv = [os.path.join(BIN, "ansible"), "-i", self.inventory, "-i", self.override, self.host, "-o",
                "-m", "wait_for_model_ready", "-a", json.dumps(args)]
        proc = subprocess.run(argv, cwd=ROOT, env=self.env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              universal_newlines=True, timeout=900)
        for line in proc.stdout.splitlines():
            if line.startswith(self.host + " | "):
                return json.loads(line.split(" => ", 1)[1])
        raise AssertionError("no result from wait_for_model_ready:\n" + proc.stdout[-3000:])
