"""The compressed-tensors repair of an engine's container image (runtime podman or docker): a thin derived image.

The pinned image is never changed. Where its compressed-tensors lacks what the model's formats need, a
container of it (the staged wheelhouse mounted read-only) installs the release with the image's own pip, the
protected packages (torch) held at their versions by a constraints file as in a venv, and the install is
verified by importing the enum, all in that one container; only then is it committed as a new image labelled
with the base image's ID and the repair, which the next run finds by those labels (nothing to do). A failed
repair removes its container and any image it committed: the host is left as it was. An image whose own
release already meets the repair is read in a container once: the answer is kept in a small record per image
ID (`state_dir`), which names the same files for as long as it exists, so a re-run starts no container.

Podman and Docker take the same words for every step here (run, exec, stop, commit, rm, rmi, images,
image inspect), so one code path serves both: `cli` is the runtime's client.

Runs on the managed host (standard library only). Anything that runs a process takes a
`run(argv) -> (rc, stdout, stderr)` callable, as pyenv does, so unit tests can script it.
"""
import json
import os
import re

from ..common.json_record import read_record, replace_record
from .pyenv import (
    PyEnvError,
    canonical_name,
    protect_constraints,
    satisfies,
    snapshot,
    snapshot_diff,
    venv_python,
    verify,
)

# The labels a derived image carries: the image it was derived from (its ID) and the repair it holds.
LABEL_BASE = "io.modelwake.repair.base"
LABEL_SPEC = "io.modelwake.repair.spec"
# Where the repair container sees the host's files (bind mounts: they are not part of the committed image).
WHEELHOUSE_MOUNT = "/tmp/modelwake-wheelhouse"
CONSTRAINTS_MOUNT = "/tmp/modelwake-constraints"
# pyenv's snapshot() and verify() run `<venv>/bin/python ...`: this placeholder venv's python is swapped for
# `<cli> exec <container> <the image's python>` (InContainer.run), so the container's Python answers the same
# questions a venv's does.
PLACEHOLDER_VENV = "/modelwake-image"
# Keeps the repair container alive between its steps (it is stopped before the commit).
IDLE = "import time; time.sleep(86400)"


_IMAGE_ID = re.compile(r"^(sha256:)?[0-9a-f]{64}$")


def image_id(text):
    """An image ID as sha256:<hex> (Podman prints the bare hex, Docker the prefixed)."""
    text = text.strip()
    if not _IMAGE_ID.match(text):
        raise PyEnvError("%r is not an image ID" % text[:200])
    return text if text.startswith("sha256:") else "sha256:" + text


def spec_label(name, match, version):
    """The repair as a label value, without the = and spaces that a LABEL change would have to quote."""
    return "%s/%s/%s" % (canonical_name(name), match, version)


def container_name(base):
    return "modelwake-repair-" + base.replace("sha256:", "")[:12]


def record_path(state_dir, base):
    """Where what was read in the image `base` is kept (named by its ID: the same ID is the same files)."""
    return os.path.join(state_dir, "read-%s.json" % base.replace("sha256:", ""))


class ImageRepair(object):
    """The repair of the image `base` (its ID) with `name` `match` (exact or minimum) `version`."""

    def __init__(self, run, cli, base, name, version, match="minimum", python="python3", protect=(),
                 verify_module="", verify_attribute="", verify_values=(), wheelhouse="", index_url="",
                 run_args=(), work_dir=None, state_dir="", record_reads=True):
        self.run_ = run
        self.cli = cli
        self.base = image_id(base)
        self.name = name
        self.version = version
        self.op = "==" if match == "exact" else ">="
        self.label = spec_label(name, match, version)
        self.python = python
        self.protect = list(protect)
        self.verify_args = (verify_module, verify_attribute, list(verify_values))
        self.wheelhouse = wheelhouse
        self.index_url = index_url
        self.run_args = list(run_args)
        self.work_dir = work_dir
        self.state_dir = state_dir
        self.record_reads = record_reads  # False in check mode: it may use the record, never write it
        self.container = container_name(self.base)

    # The runtime's client.
    def cli_run(self, *args):
        return self.run_([self.cli] + list(args))

    def checked(self, what, *args):
        rc, out, err = self.cli_run(*args)
        if rc != 0:
            raise PyEnvError("%s failed (%s %s, rc=%d): %s" % (what, os.path.basename(self.cli), args[0], rc,
                                                               (err or out).strip()[-2000:]))
        return out

    def in_container(self, argv):
        """pyenv's run() for the repair container: the placeholder venv's python is the image's, via exec."""
        if argv[0] != venv_python(PLACEHOLDER_VENV):
            raise ValueError("not a command of the placeholder venv: %r" % (argv,))
        return self.cli_run("exec", self.container, self.python, *argv[1:])

    def find_derived(self):
        """The ID of an image derived from the base by this repair (its labels), or None."""
        out = self.checked("listing the derived images", "images", "--no-trunc", "--quiet",
                           "--filter", "label=%s=%s" % (LABEL_BASE, self.base))
        for candidate in sorted(set(image_id(line) for line in out.split() if line.strip())):
            labels = json.loads(self.checked("reading the labels of " + candidate, "image", "inspect",
                                             "--format", "{{json .Config.Labels}}", candidate) or "null") or {}
            if labels.get(LABEL_BASE) == self.base and labels.get(LABEL_SPEC) == self.label:
                return candidate
        return None

    # -- what an earlier run read in the image ----------------------------------------------------------
    def read_key(self):
        """What the read answered: this repair, checked with this Python and this verification."""
        return json.dumps([self.label, self.python] + list(self.verify_args))

    def remembered(self):
        """The release an earlier run found meeting this repair in the image, or None (never read, or no
        state_dir)."""
        if not self.state_dir:
            return None
        return read_record(record_path(self.state_dir, self.base)).get(self.read_key())

    def remember(self, installed):
        """Keep that the image's `installed` release meets this repair (replaced atomically)."""
        if not (self.state_dir and self.record_reads):
            return
        path = record_path(self.state_dir, self.base)
        record = read_record(path)
        record[self.read_key()] = installed
        replace_record(path, record)

    def problem(self, installed):
        """Why the container's Python does not meet the repair (None when it does)."""
        if not satisfies(installed, self.op, self.version):
            return "%s is %s" % (self.name, installed or "not installed")
        if self.verify_args[0]:
            return verify(self.in_container, PLACEHOLDER_VENV, *self.verify_args)
        return None

    def start_container(self, sources=False, constraints_dir=None):
        """The repair container of the base image, idle. `sources`: for the install, with the wheelhouse (and
        the constraints) mounted read-only; a read needs neither (the wheelhouse is staged only for an install)."""
        # One left by an interrupted run would hold the name.
        self.cli_run("rm", "--force", self.container)
        mounts = []
        if sources and self.wheelhouse:
            mounts += ["--volume", "%s:%s:ro" % (self.wheelhouse, WHEELHOUSE_MOUNT)]
        if sources and constraints_dir:
            mounts += ["--volume", "%s:%s:ro" % (constraints_dir, CONSTRAINTS_MOUNT)]
        # From the wheelhouse alone, no network; only an install without one asks the index.
        network = [] if sources and not self.wheelhouse else ["--network=none"]
        self.checked("starting the repair container of " + self.base, "run", "--detach", "--pull=never",
                     "--name", self.container, *(network + mounts + self.run_args
                                                 + ["--entrypoint", self.python, self.base, "-c", IDLE]))

    def remove_container(self):
        self.cli_run("rm", "--force", self.container)

    def image_config(self):
        """The base image's Config (its Entrypoint and Cmd, which the commit must keep)."""
        return json.loads(self.checked("reading " + self.base, "image", "inspect", "--format", "{{json .Config}}",
                                       self.base) or "null") or {}

    def read_base(self):
        """(installed version, problem) of the base image: problem None when it needs no repair."""
        self.start_container()
        try:
            installed = snapshot(self.in_container, PLACEHOLDER_VENV).get(canonical_name(self.name))
            problem = self.problem(installed)
        finally:
            self.remove_container()
        if problem is None:
            self.remember(installed)
        return installed, problem

    def apply(self, check_mode=False):
        """Find or make the derived image; return the result dict (image: the ID the service runs)."""
        result = {"base": self.base, "repair": self.label, "changed": False, "derived": False, "diff": {}}
        found = self.find_derived()
        if found:
            return dict(result, image=found, derived=True, action="none",
                        msg="%s is derived from %s with %s already" % (found, self.base, self.label))
        known = self.remembered()
        if known is not None:
            return dict(result, image=self.base, before=known, after=known, action="none",
                        msg="%s already has %s %s (read on an earlier run)" % (self.base, self.name, known))
        if check_mode:
            installed, problem = self.read_base()
            if problem is None:
                return dict(result, image=self.base, before=installed, after=installed, action="none",
                            msg="%s already has %s %s" % (self.base, self.name, installed))
            spec = "%s%s%s" % (self.name, self.op, self.version)
            return dict(result, image=None, changed=True, before=installed, action="install",
                        msg="would derive an image from %s with %s (%s)" % (self.base, spec, problem))
        return self.derive(result)

    def derive(self, result):
        committed = None
        constraints_dir = self.work_dir and os.path.join(self.work_dir, "constraints")
        try:
            if constraints_dir:
                # Read in the container by the image's user, whoever that is.
                os.makedirs(constraints_dir, exist_ok=True)
                os.chmod(constraints_dir, 0o755)
            self.start_container(sources=True, constraints_dir=constraints_dir)
            before = snapshot(self.in_container, PLACEHOLDER_VENV)
            installed = before.get(canonical_name(self.name))
            problem = self.problem(installed)
            if problem is None:
                self.remember(installed)
                return dict(result, image=self.base, before=installed, after=installed, action="none",
                            msg="%s already has %s %s" % (self.base, self.name, installed))
            self.install(before, constraints_dir)
            after = snapshot(self.in_container, PLACEHOLDER_VENV)
            now = after.get(canonical_name(self.name))
            failure = self.problem(now)
            if failure:
                raise PyEnvError("verification after installing %s %s failed: %s" % (self.name, now, failure))
            self.checked("stopping the repair container", "stop", "--time", "0", self.container)
            committed = self.commit()
            return dict(result, image=committed, derived=True, changed=True, before=installed, after=now,
                        diff=snapshot_diff(before, after), action="install",
                        msg="derived %s from %s with %s %s (%s)" % (committed, self.base, self.name, now, problem))
        except (PyEnvError, ValueError) as exc:
            if committed:
                self.cli_run("rmi", "--force", committed)
            raise PyEnvError("the %s repair of the image %s failed, nothing was left on the host: %s"
                             % (self.name, self.base, exc))
        finally:
            self.remove_container()

    def install(self, before, constraints_dir):
        spec = "%s%s%s" % (self.name, self.op, self.version)
        argv = ["exec", self.container, self.python, "-m", "pip", "install", "--disable-pip-version-check",
                "--no-input", "--no-cache-dir"]
        if self.wheelhouse:
            argv += ["--no-index", "--find-links", WHEELHOUSE_MOUNT]
        elif self.index_url:
            argv += ["--index-url", self.index_url]
        lines = protect_constraints(before, self.protect, self.name)
        if lines:
            if not constraints_dir:
                raise PyEnvError("the protected packages need a work directory for their constraints file")
            path = os.path.join(constraints_dir, "protect-constraints.txt")
            with open(path, "w") as handle:
                handle.write("\n".join(lines) + "\n")
            os.chmod(path, 0o644)
            argv += ["--constraint", CONSTRAINTS_MOUNT + "/protect-constraints.txt"]
        rc, out, err = self.cli_run(*(argv + [spec]))
        if rc != 0:
            raise PyEnvError("pip install %s failed in the image (rc=%d): %s" % (spec, rc, (err or out).strip()[-3000:]))

    def commit(self):
        """Commit the stopped repair container, keeping the base's Entrypoint and Cmd (the container's were
        the idle Python), labelled so a later run finds it; its ID."""
        config = self.image_config()
        changes = ["LABEL %s=%s" % (LABEL_BASE, self.base), "LABEL %s=%s" % (LABEL_SPEC, self.label),
                   "ENTRYPOINT %s" % json.dumps(config.get("Entrypoint") or []),
                   "CMD %s" % json.dumps(config.get("Cmd") or [])]
        argv = ["commit"]
        for change in changes:
            argv += ["--change", change]
        out = self.checked("committing the repaired image", *(argv + [self.container]))
        # The ID is the last line (Podman may say more before it).
        lines = [line for line in out.split() if line.strip()]
        if not lines:
            raise PyEnvError("committing the repaired image printed no image ID")
        return image_id(lines[-1])
