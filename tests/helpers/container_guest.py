"""What the container runtimes' guest tests share (tests/integration/test_podman_guest.py and
test_docker_guest.py): one systemd-nspawn guest with the runtime from Debian's packages, the simulated
engine deployed by deploy-k26.yml in a container of the image built from the test hosts' own root
filesystem, and the looks both tests take at the unit and its containers."""
import json
import os
import re
import subprocess
import tempfile
import time

from modelwake_runner.cli import run_playbook
from tests.helpers import ROOT
from tests.helpers.guesthost import PlayOutput, guest_sh, guest_vars, host_tool, journal_with
from tests.helpers.paths import ANSIBLE

# A load of a few seconds (64 MiB at 16 MiB/s), so that several looks see it.
FAST = ["--disable-cuda-graph", "--load-rate-mib", "16", "--start-seconds", "1", "--init-seconds", "2",
        "--warmup-seconds", "1"]
OOM = "torch.OutOfMemoryError: CUDA out of memory."
# The catalog's container_command of the simulator's image (SGLang's protocol), as the demo's catalog has it.
SIM_CONTAINER_COMMAND = ["python3", "-m", "modelwake_sim", "serve", "--engine", "sglang"]


def play(guest, playbook, extra=None):
    """A playbook of the repository against the deployed guest (the fixture's dict); (rc, PlayOutput)."""
    private = tempfile.mkdtemp(prefix="play-", dir=guest["tmp"])
    objects = []
    runner, _events = run_playbook(playbook, private, [guest["inventory"]], extra, on_object=objects.append,
                                   timeout=900)
    return runner.rc, PlayOutput(runner.stdout.read(), objects)


class ContainerGuest(object):
    """The guest `name`, whose catalog entry `model` runs as `unit` under `runtime` (podman or docker)."""

    def __init__(self, name, model, unit, runtime, port):
        self.name = name
        self.model = model
        self.unit = unit
        self.runtime = runtime
        self.port = port
        self.container = "modelwake-" + unit

    def sh(self, command, check=True):
        return guest_sh(self.name, command, check=check)

    def show(self, *properties):
        out = self.sh("systemctl show %s %s" % (self.unit, " ".join("-p " + name for name in properties)))
        return dict(line.split("=", 1) for line in out.splitlines())

    def recap(self, output):
        """The play recap's counters for the guest."""
        recaps = [o["hosts"] for o in output.objects if o["event"] == "recap"]
        assert recaps and self.name in recaps[-1], output[-3000:]
        return recaps[-1][self.name]

    def restart_watching(self, timeout=180):
        """Restart the unit without blocking and follow it from systemd's side until the new run is no
        longer activating: [(ActiveState, StatusText)] of the new run, one per look."""
        before = self.show("InvocationID")["InvocationID"]
        self.sh("systemctl restart --no-block %s" % self.unit)
        seen = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = self.show("InvocationID", "ActiveState", "SubState", "StatusText")
            if state["InvocationID"] not in ("", before):
                seen.append((state["ActiveState"], state["StatusText"]))
                if state["ActiveState"] != "activating":
                    break
            time.sleep(0.3)
        return seen

    def restart_is_activating_until_a_completion(self):
        """Restart the unit and check it from systemd's side: activating, with the launcher's STATUS=
        through the load, until a completion answered (ready only then, the engine that listens found
        among the container's processes); the engine's output in the unit's journal; the old container
        removed by the stop, a new one running."""
        old_container = self.container_id()
        seen = self.restart_watching()
        said = "\n".join("%s: %s" % pair for pair in seen)
        states = [active for active, _text in seen]
        assert states[-1] == "active" and set(states[:-1]) == {"activating"}, said
        assert [text for active, text in seen if active == "activating" and text.startswith("loading")], said
        assert seen[-1][1].startswith("ready in "), said
        ready = r"^modelwake: ready in .*a completion .* answered"
        journal = journal_with(ready, lambda: self.sh("journalctl -u %s -o cat --since=-5min" % self.unit))
        assert re.search(ready, journal, re.M), journal[-3000:]
        assert "held by another process" not in journal
        assert "load" in journal.lower(), journal[-3000:]
        assert self.containers() == [self.container] and self.container_id() != old_container
        self.engine_runs_as_the_service_user()

    def engine_runs_as_the_service_user(self, user="modelwake"):
        """The engine's host processes run as the service user (model_service_container_user service), not as the
        image's root, and what it writes in its HOME, the mounted cache directory, is that user's: after a
        restart too (a root unit's CacheDirectory= would be root's again at every start: the unit has none)."""
        uid = self.sh("id -u %s" % user)
        # The engine's own processes (the image's python3), not the podman or docker client whose command line
        # also names the simulator.
        engine = self.sh("pgrep -f '^python3 -m modelwake_sim serve'").split()
        assert engine, self.sh("ps -eo pid,uid,args")
        assert {self.sh("ps -o uid= -p %s" % pid).strip() for pid in engine} == {uid}, self.sh("ps -eo pid,uid,args")
        cache = "/var/cache/modelwake/%s" % self.unit
        written = cache + "/modelwake-user-check"
        self.sh("%s exec %s sh -c 'touch \"$HOME/modelwake-user-check\"'" % (self.runtime, self.container))
        try:
            assert self.sh("stat -c %%U %s" % written) == user
            assert self.sh("find %s ! -user %s" % (cache, user)) == ""
        finally:
            self.sh("rm -f %s" % written, check=False)

    def a_failed_image_upgrade_is_rolled_back(self, guest, broken_image):
        """Deploy an image derived from the deployed one (`broken_image(name, base ID)` -> its ID, built on the
        guest) whose engine fails at its start, and check that the deploy fails with the engine's own error,
        the unit is put back on the previous image (the unit file, the kept ID, the container's image) and
        that image answers again."""
        old = guest["image_id"]
        mark = time.monotonic()
        new = broken_image(self.name, old)
        guest["timings"]["broken image"] = round(time.monotonic() - mark, 1)
        assert new != old
        with open(guest["inventory"]) as handle:
            deployed = json.load(handle)["all"]["vars"]["modelwake_models"][self.model]
        upgraded = dict(deployed, image_id=new, image_archive="")
        rc, out = play(guest, "deploy-k26.yml", {"modelwake_models": {self.model: upgraded}})
        flat = " ".join(out.split())
        assert rc != 0, flat[-5000:]
        # The restart onto the new image failed with the engine's own error ...
        assert re.search(r"%s did not come up after the image upgrade %s -> %s: failed \(rule [a-z_]+\) after"
                         % (re.escape(self.unit), re.escape(old), re.escape(new)), flat), flat[-5000:]
        # Before anything was undone, the output named the rule and its evidence.
        assert re.search(r"Rolling back %s: its start on the upgrade ended failed by the rule [a-z_]+ after [\d.]+ s: "
                         r"failed: .*; evidence: " % re.escape(self.unit), flat), flat[-5000:]
        assert "libcudart.so.13: cannot open shared object file" in flat, flat[-5000:]
        # ... and the unit was put back on the previous image, which answered again.
        assert re.search(r"Rolled back to the previous image %s and restarted: ready again after [\d.]+ s" % old,
                         flat), flat[-5000:] + "\n" + self.sh("journalctl -u %s -n 60 -o short-monotonic" % self.unit)
        assert self.sh("cat /etc/modelwake/%s.image" % self.unit) == old
        # (Podman shows the container's image ID without its sha256: prefix, Docker with it.)
        running = old if self.runtime == "docker" else old[len("sha256:"):]
        assert self.sh("%s container inspect --format '{{.Image}}' %s" % (self.runtime, self.container)) == running
        # (The launcher says READY=1 after its own completion, a moment after the wait's.)
        deadline = time.monotonic() + 60
        while self.show("ActiveState")["ActiveState"] != "active" and time.monotonic() < deadline:
            time.sleep(1)
        assert self.show("ActiveState")["ActiveState"] == "active"
        # The unit names the previous image again (a re-run with the old pin leaves it so).
        exec_start = self.show("ExecStart")["ExecStart"]
        assert old in exec_start and new not in exec_start

    def hold_gpu(self, pid, index, name):
        """The fake nvidia-smi (tools/testhosts install-fake-gpus) lists `pid` (a host PID, as NVML gives) as
        holding 30000 MiB of GPU `index`."""
        self.sh("echo '{\"pid\": %s, \"name\": \"python\", \"gpus\": {\"%d\": {\"memory_mib\": 30000, "
                "\"utilization\": 0}}}' > /run/modelwake-fake-gpu/holder-%s.json" % (pid, index, name))

    def container_id(self):
        return self.sh("%s container inspect --format '{{.Id}}' %s" % (self.runtime, self.container))

    def containers(self):
        """The names of every container on the guest, running or not."""
        return self.sh("%s ps --all --format '{{.Names}}'" % self.runtime).split()

    def look(self, guest, **args):
        """wait_for_model_ready run ad hoc by real Ansible on the unit, as an operator runs it (README):
        only the options given, nothing the role would add; returns its result."""
        args = dict({"url": "http://127.0.0.1:%d" % self.port, "unit": self.unit + ".service"}, **args)
        argv = [ANSIBLE, "-i", guest["inventory"], self.name, "-o", "-m", "modelwake.serving.wait_for_model_ready",
                "-a", json.dumps(args)]
        proc = subprocess.run(argv, cwd=ROOT, env=dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg")),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True, timeout=600)
        for line in proc.stdout.splitlines():
            if line.startswith(self.name + " | "):
                return json.loads(line.split(" => ", 1)[1])
        raise AssertionError("no result from wait_for_model_ready:\n" + proc.stdout[-3000:])

    def journal_cursor(self):
        return self.sh("journalctl -u %s -n 1 -o export | sed -n 's/^__CURSOR=//p'" % self.unit)

    def journal_since(self, cursor):
        return self.sh("journalctl -u %s -o cat --after-cursor='%s'" % (self.unit, cursor))

    def _write_inventory(self, path, variables):
        with open(path, "w") as handle:
            json.dump({"all": {"children": {"model_hosts": {"hosts": {self.name: {
                "ansible_host": host_tool("addr", self.name)}}}}, "vars": variables}}, handle)

    def deployed(self, tmp, install, sim_image, extra_vars=None):
        """The module fixture's body: the guest up with the runtime (`install(name)`), the model and the
        simulator's wheels, the image (`sim_image(name)` -> (archive, image ID)), the first deploy; yields
        {"inventory", "tmp", "timings", "image_id", "deploy"} and destroys the guest afterwards, also when
        a test fails."""
        timings = {}
        started = time.monotonic()
        host_tool("up", self.name)
        try:
            install(self.name)
            timings[self.runtime] = round(time.monotonic() - started, 1)
            inventory = os.path.join(tmp, "inventory.json")
            entry = {"engine": "sglang", "engine_package": "modelwake-sim", "engine_version": "0.1.0",
                     "unit": self.unit, "port": self.port, "model_path": "/srv/models/%s-sim" % self.model, "tp": 1,
                     "extra_args": FAST, "ready_timeout": 300, "stall_timeout": 60, "runtime": self.runtime,
                     # In the image: its own Python, the simulator in its site directory.
                     "container_command": SIM_CONTAINER_COMMAND}
            variables = dict(guest_vars(host_tool("key")), **{
                "modelwake_deploy_model": self.model, "modelwake_host_models": [self.model],
                "modelwake_gpus_required": False, "modelwake_demo_model_size_mib": 64,
                "modelwake_demo_model_shards": 8, "model_service_poll_interval": 1,
                # Quick restarts: the crash tests wait for the launcher to stop its loop (3 starts).
                "model_service_restart_sec": 2,
                "modelwake_models": {self.model: entry}}, **(extra_vars or {}))
            self._write_inventory(inventory, variables)
            guest = {"inventory": inventory, "tmp": tmp, "timings": timings}
            rc, out = play(guest, "playbooks/demo-model.yml")  # the model on the guest, the simulator's wheels here
            assert rc == 0, out[-5000:]
            mark = time.monotonic()
            archive, image_id = sim_image(self.name)
            timings["image"] = round(time.monotonic() - mark, 1)
            entry.update(image_id=image_id, image_archive=archive)
            self._write_inventory(inventory, variables)
            mark = time.monotonic()
            rc, out = play(guest, "deploy-k26.yml")
            timings["first deploy"] = round(time.monotonic() - mark, 1)
            assert rc == 0, out[-5000:]
            guest.update(image_id=image_id, deploy=out)
            yield guest
        finally:
            host_tool("down", self.name, check=False)
            print("%s guest timings (s): %s, total %.0f" % (self.runtime, timings, time.monotonic() - started))
