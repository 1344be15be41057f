#!/usr/bin/env python3
"""A container runtime on a systemd test host (tools/testhosts), and the simulated engine's image for it.

What `make demo RUNTIME=podman|docker` runs, and the container guest tests with it (tests/integration/
test_podman_guest.py, test_docker_guest.py, test_vllm_deploy.py):

  install NAME podman|docker       the runtime from Debian's packages, set up for what a test host lacks
  sim-image NAME podman|docker [--vars-file F]
                                   the simulator's image archive on this machine (built on NAME the first
                                   time, then cached) and its ID; --vars-file writes both, with the runtime,
                                   as extra-vars for the demo's catalog entry

The guests reach no network: the packages are downloaded here by this machine's apt, resolved against the test
hosts' own package database and sources, so that exactly what a guest lacks is fetched (cached, keyed by the
guests' root filesystem and the package list). The image is the guests' own root filesystem (tools/testhosts'
tarball) plus the simulated engine's package in its Python's site directory (from the wheel that
playbooks/demo-model.yml builds), saved as an archive under MODELWAKE_CACHE and keyed by the root filesystem
and the engine's files: later runs only load it, as an air-gapped host does (inference_env_container_image_archive).

What the guests need that a real host does not (docs/containers.md):
- Podman's and Docker's storage on a directory of this machine's own filesystem, which tools/testhosts binds
  at /var/lib/containers and /var/lib/docker (a guest's root is an overlayfs, on which neither overlay driver
  can mount: they would fall back to vfs, which copies the image's every file for each container).
- No session keyring per container (the guest may not create one).
- The guests' cgroup v1 controllers are read-only. Podman runs with --cgroups=disabled (the inventory's
  model_service_container_cgroups), so the container's processes stay in the unit's own cgroup. For Docker, a
  runc wrapper, Docker's default runtime on the guest only, runs runc as rootless runc does (--rootless=true:
  it then passes over the cgroups it cannot create) with the container's cgroup path and limits removed.
- Docker's network is the host's: neither a bridge nor iptables rules are made.

Standard library only; root (the guests' SSH key is root's).
"""
import argparse
import fcntl
import hashlib
import importlib.machinery
import importlib.util
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile

TOOLS = os.path.dirname(os.path.abspath(__file__))
CACHE_ROOT = os.environ.get("MODELWAKE_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "modelwake")
CACHE = os.path.join(CACHE_ROOT, "podman")  # both runtimes' packages and archives (the name predates Docker's)
# Where playbooks/demo-model.yml builds the simulator's wheels (the demo inventory's modelwake_sim_wheels).
SIM_WHEELS = os.path.join(CACHE_ROOT, "sim-wheels")
RUNTIMES = ("podman", "docker")

# Podman's packages and the container's init (catatonit, for --init: it passes the stop on to the engine);
# Docker 20.10 (Debian 12's docker.io) with containerd, runc and tini (Docker's --init).
PACKAGES = {"podman": ["podman", "catatonit"], "docker": ["docker.io", "tini"]}
# Bump when an image's recipe changes, so an archive built the old way is not reused.
IMAGE_RECIPE = {"podman": "1", "docker": "2"}
IMAGE_NAME = {"podman": "localhost/modelwake-sim", "docker": "localhost/modelwake-sim-docker"}
SITE = "usr/local/lib/python3.11/dist-packages/"

STORAGE_CONF = '[storage]\ndriver = "overlay"\nrunroot = "/run/containers/storage"\ngraphroot = "/var/lib/containers/storage"\n'
CONTAINERS_CONF = "[containers]\nkeyring = false\n"
PODMAN_CONTAINERFILE = "FROM localhost/modelwake-testhost-base\nADD sim.tar /%s\n" % SITE

# Docker's image: one slim layer (Docker 20.10 loads no OCI archive, and a slim layer keeps its gzipped
# `docker save` short): the root filesystem without what the simulated engine never reads.
DOCKER_SLIMMED = tuple("./" + path for path in (
    "usr/share/locale/", "usr/share/doc/", "usr/share/man/", "usr/share/info/", "usr/share/perl",
    "usr/share/python-wheels/", "usr/lib/python3/", "usr/lib/systemd/", "var/lib/dpkg/", "var/lib/apt/", "var/cache/"))
RUNC_WRAPPER = "/usr/local/sbin/runc-testhost"
DAEMON_JSON = json.dumps({"storage-driver": "overlay2", "iptables": False, "bridge": "none",
                          "runtimes": {"runc-testhost": {"path": RUNC_WRAPPER}}, "default-runtime": "runc-testhost"})
RUNC_WRAPPER_SCRIPT = '''#!/usr/bin/python3
"""runc for a test host whose cgroup v1 controllers are read-only (tools/guest_runtime.py)."""
import json
import os
import sys

args = sys.argv[1:]
for command in ("create", "run"):
    if command in args:
        bundle = args[args.index("--bundle") + 1] if "--bundle" in args else "."
        with open(os.path.join(bundle, "config.json")) as handle:
            spec = json.load(handle)
        spec["linux"].pop("cgroupsPath", None)
        spec["linux"].pop("resources", None)
        with open(os.path.join(bundle, "config.json"), "w") as handle:
            json.dump(spec, handle)
        args.insert(args.index(command) + 1, "--no-new-keyring")
        break
os.execv("/usr/sbin/runc", ["runc", "--rootless=true"] + args)
'''


class GuestCommandError(RuntimeError):
    pass


def testhosts():
    """tools/testhosts as a module (its guests' SSH and root filesystem), loaded once."""
    if "testhosts_tool" not in sys.modules:
        loader = importlib.machinery.SourceFileLoader("testhosts_tool", os.path.join(TOOLS, "testhosts"))
        spec = importlib.util.spec_from_loader("testhosts_tool", loader)
        module = importlib.util.module_from_spec(spec)
        loader.exec_module(module)
        sys.modules["testhosts_tool"] = module
    return sys.modules["testhosts_tool"]


def guest_ssh(name, command):
    """The argv that runs `command` on the guest `name` over its shared SSH connection."""
    return testhosts().ssh_cmd(name, command)


def guest_sh(name, command, check=True, timeout=120, stdin=None):
    """Run a shell command as root on the guest `name` (stdin: text or bytes); return its stdout."""
    if isinstance(stdin, str):
        stdin = stdin.encode("utf-8")
    proc = subprocess.run(guest_ssh(name, command), input=stdin, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, timeout=timeout)
    out = proc.stdout.decode("utf-8", "replace").strip()
    if check and proc.returncode != 0:
        raise GuestCommandError("%s failed on the guest %s (rc %d): %s %s"
                                % (command, name, proc.returncode, out, proc.stderr.decode("utf-8", "replace")))
    return out


class Locked(object):
    """One builder at a time per cache entry (parallel test workers share MODELWAKE_CACHE)."""

    def __init__(self, path):
        self.path = path + ".lock"

    def __enter__(self):
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(self.fd, fcntl.LOCK_EX)

    def __exit__(self, *exc):
        os.close(self.fd)


# ---------------------------------------------------------------- packages

def guest_debs(packages):
    """The directory of the .deb files that `packages` add to a test host (downloaded once, cached by the
    guests' root filesystem and the package list)."""
    tool = testhosts()
    lower = os.path.join(tool.CACHE, tool.rootfs_id())
    debs = os.path.join(CACHE, "debs-%s-%s" % (tool.rootfs_id(), hashlib.sha256(" ".join(packages).encode()).hexdigest()[:8]))
    with Locked(debs):
        if os.path.isdir(debs):
            return debs
        work = debs + ".work"
        shutil.rmtree(work, ignore_errors=True)
        for sub in ("lists/partial", "cache/archives/partial"):
            os.makedirs(os.path.join(work, sub))
        # This machine's apt, resolving against the guests' package database and sources: it fetches exactly
        # what a guest lacks, and changes nothing on this machine.
        options = ["-o", "Dir::State::Lists=" + os.path.join(work, "lists"),
                   "-o", "Dir::Cache=" + os.path.join(work, "cache"),
                   "-o", "Dir::State::status=" + os.path.join(lower, "var/lib/dpkg/status"),
                   "-o", "Dir::Etc::SourceList=" + os.path.join(lower, "etc/apt/sources.list"),
                   "-o", "Dir::Etc::SourceParts=" + os.path.join(work, "no-parts"),
                   "-o", "Debug::NoLocking=1"]
        subprocess.run(["apt-get", "-qq"] + options + ["update"], check=True)
        subprocess.run(["apt-get", "-qq", "-y", "--no-install-recommends", "--download-only"] + options
                       + ["install"] + list(packages), check=True)
        archives = os.path.join(work, "cache", "archives")
        os.makedirs(debs + ".tmp", exist_ok=True)
        for name in os.listdir(archives):
            if name.endswith(".deb"):
                shutil.move(os.path.join(archives, name), os.path.join(debs + ".tmp", name))
        os.rename(debs + ".tmp", debs)
        shutil.rmtree(work)
        return debs


def push_files(guest, directory, paths):
    """Copy local files into `directory` on the guest (one tar stream over its SSH)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for path in paths:
            tar.add(path, arcname=os.path.basename(path))
    guest_sh(guest, "mkdir -p %s && tar -x -C %s" % (directory, directory), stdin=buf.getvalue(), timeout=300)


def install_debs(guest, packages):
    """Install `packages` on the guest from the cached .deb files (the guests reach no network)."""
    debs = guest_debs(packages)
    push_files(guest, "/root/guest-debs", [os.path.join(debs, name) for name in sorted(os.listdir(debs))])
    guest_sh(guest, "DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "
                    "/root/guest-debs/*.deb >/dev/null && rm -rf /root/guest-debs", timeout=300)


def install_podman(guest):
    """Podman on the guest from the cached packages, set up for what the guests lack."""
    install_debs(guest, PACKAGES["podman"])
    guest_sh(guest, "cat > /etc/containers/storage.conf", stdin=STORAGE_CONF)
    guest_sh(guest, "cat > /etc/containers/containers.conf", stdin=CONTAINERS_CONF)


def install_docker(guest):
    """Docker on the guest from the cached packages, its daemon configured before its first start."""
    guest_sh(guest, "mkdir -p /etc/docker && cat > /etc/docker/daemon.json", stdin=DAEMON_JSON)
    guest_sh(guest, "cat > %s && chmod 755 %s" % (RUNC_WRAPPER, RUNC_WRAPPER), stdin=RUNC_WRAPPER_SCRIPT)
    install_debs(guest, PACKAGES["docker"])
    guest_sh(guest, "systemctl is-active docker containerd >/dev/null")


def install(guest, runtime):
    """The runtime on the guest, unless it is there already (a demo run again)."""
    if guest_sh(guest, "command -v %s || true" % runtime):
        return False
    (install_podman if runtime == "podman" else install_docker)(guest)
    return True


# ---------------------------------------------------------------- the simulator's image

def sim_tar():
    """The simulated engine's package files (its wheel's, pure Python, no dependencies) as a tar, and their
    digest, which keys the image."""
    try:
        wheels = [name for name in os.listdir(SIM_WHEELS) if name.startswith("modelwake_sim-") and name.endswith(".whl")]
    except FileNotFoundError:
        wheels = []
    if len(wheels) != 1:
        raise GuestCommandError("one modelwake_sim wheel expected in %s, found %s: playbooks/demo-model.yml builds it "
                                "(run it first)" % (SIM_WHEELS, wheels))
    digest = hashlib.sha256()
    buf = io.BytesIO()
    with zipfile.ZipFile(os.path.join(SIM_WHEELS, wheels[0])) as wheel, tarfile.open(fileobj=buf, mode="w") as tar:
        for name in sorted(wheel.namelist()):
            data = wheel.read(name)
            digest.update(name.encode() + b"\0" + data)
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue(), digest.hexdigest()


def image_key(runtime, sim_digest):
    return hashlib.sha256(("%s %s %s" % (IMAGE_RECIPE[runtime], testhosts().rootfs_id(), sim_digest)).encode()).hexdigest()[:16]


def build_podman_image(guest, tar_bytes, key, archive):
    """Build the image on the guest (root filesystem imported, the engine's files `tar_bytes` added by a build),
    save it as an OCI archive at `archive`; return its ID. The guest's storage is left without it, for the
    deploy to load."""
    tool = testhosts()
    name = "%s:%s" % (IMAGE_NAME["podman"], key)
    work = "/root/image-build"
    with open(os.path.join(CACHE, "sim.tar"), "wb") as handle:
        handle.write(tar_bytes)
    with open(os.path.join(CACHE, "Containerfile"), "w") as handle:
        handle.write(PODMAN_CONTAINERFILE)
    push_files(guest, work, [tool.build(), os.path.join(CACHE, "sim.tar"), os.path.join(CACHE, "Containerfile")])
    guest_sh(guest, "cd %s && podman import --quiet %s localhost/modelwake-testhost-base >/dev/null && "
                    "podman build --quiet --cgroup-manager=cgroupfs -t %s . >/dev/null"
             % (work, os.path.basename(tool.build()), name), timeout=600)
    image_id = "sha256:" + guest_sh(guest, "podman image inspect --format '{{.Id}}' %s" % name)
    guest_sh(guest, "podman save --quiet --format oci-archive -o %s/image.tar %s" % (work, name), timeout=600)
    with open(archive + ".tmp", "wb") as out:
        subprocess.run(guest_ssh(guest, "cat %s/image.tar" % work), stdout=out, check=True, timeout=600)
    os.rename(archive + ".tmp", archive)
    guest_sh(guest, "rm -rf %s && podman rmi --all --force >/dev/null" % work, timeout=300)
    return image_id


def docker_layer(path, tar_bytes):
    """Write the Docker image's one layer to `path`: the root filesystem, slimmed, plus the engine's files
    `tar_bytes` in the site directory."""
    with tarfile.open(testhosts().build(), "r:gz") as rootfs, tarfile.open(path, "w") as out:
        for member in rootfs:
            if not member.name.startswith(DOCKER_SLIMMED):
                out.addfile(member, rootfs.extractfile(member) if member.isfile() else None)
        with tarfile.open(fileobj=io.BytesIO(tar_bytes)) as sim:
            for member in sim:
                member.name = SITE + member.name
                out.addfile(member, sim.extractfile(member))


def build_docker_image(guest, tar_bytes, key, archive):
    """Import the one layer on the guest, save it as a gzipped `docker save` archive at `archive`; return its
    ID. The guest's storage is left without it, for the deploy to load."""
    name = "%s:%s" % (IMAGE_NAME["docker"], key)
    work = "/root/image-build"
    layer = os.path.join(CACHE, "sim-docker-layer.tar")
    docker_layer(layer, tar_bytes)
    push_files(guest, work, [layer])
    os.unlink(layer)
    guest_sh(guest, "docker import %s/%s %s >/dev/null" % (work, os.path.basename(layer), name), timeout=600)
    image_id = guest_sh(guest, "docker image inspect --format '{{.Id}}' %s" % name)
    guest_sh(guest, "docker save %s | gzip -1 > %s/image.tar.gz" % (name, work), timeout=600)
    with open(archive + ".tmp", "wb") as out:
        subprocess.run(guest_ssh(guest, "cat %s/image.tar.gz" % work), stdout=out, check=True, timeout=600)
    os.rename(archive + ".tmp", archive)
    guest_sh(guest, "rm -rf %s && docker rmi --force %s >/dev/null" % (work, name), timeout=300)
    return image_id


def sim_image(guest, runtime):
    """(the image archive on this machine, its ID sha256:<hex>) for `runtime`: built on `guest` (the runtime
    installed) the first time, then reused."""
    tar_bytes, sim_digest = sim_tar()
    key = image_key(runtime, sim_digest)
    suffix = ".oci.tar" if runtime == "podman" else ".docker.tar.gz"
    archive = os.path.join(CACHE, "sim-image-%s%s" % (key, suffix))
    id_file = archive + ".id"
    with Locked(archive):
        if not (os.path.exists(archive) and os.path.exists(id_file)):
            build = build_podman_image if runtime == "podman" else build_docker_image
            image_id = build(guest, tar_bytes, key, archive)
            with open(id_file, "w") as handle:
                handle.write(image_id + "\n")
        with open(id_file) as handle:
            return archive, handle.read().strip()


def demo_vars(runtime, archive, image_id):
    """The extra-vars of the demo's catalog entry (inventories/demo/group_vars/all/models.yml) for `runtime`."""
    return {"modelwake_demo_runtime": runtime, "modelwake_demo_image_id": image_id,
            "modelwake_demo_image_archive": archive}


# ---------------------------------------------------------------- command line

def main(argv=None):
    top = argparse.ArgumentParser(prog="guest_runtime.py", description=__doc__.split("\n\n")[0])
    sub = top.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for verb, text in (("install", "install the runtime on the guest (kept if it is there)"),
                       ("sim-image", "the simulator's image archive for the runtime, and its ID")):
        p = sub.add_parser(verb, help=text)
        p.add_argument("name", metavar="NAME", help="the test host (tools/testhosts)")
        p.add_argument("runtime", metavar="RUNTIME", help="podman or docker")
        if verb == "sim-image":
            p.add_argument("--vars-file", help="write the demo's extra-vars (runtime, image ID, archive) here")
    args = top.parse_args(argv)
    if args.runtime not in RUNTIMES:
        top.error("RUNTIME must be podman or docker, not %r (RUNTIME=venv needs neither)" % args.runtime)
    if os.geteuid() != 0:
        top.error("must run as root (the test hosts' SSH key is root's): use sudo")
    tool = testhosts()
    if not tool.running(tool.check_name(args.name)):
        top.error("test host %s is not running: `tools/testhosts up %s` first" % (args.name, args.name))
    try:
        if args.command == "install":
            done = install(args.name, args.runtime)
            print("%s: %s %s" % (args.name, args.runtime, "installed" if done else "already installed"))
            return 0
        archive, image_id = sim_image(args.name, args.runtime)
    except (GuestCommandError, subprocess.CalledProcessError) as err:
        print("guest_runtime.py: %s" % err, file=sys.stderr)
        return 1
    if args.vars_file:
        with open(args.vars_file + ".tmp", "w") as handle:
            json.dump(demo_vars(args.runtime, archive, image_id), handle, indent=1)
            handle.write("\n")
        os.replace(args.vars_file + ".tmp", args.vars_file)
    print("%s %s" % (image_id, archive))
    return 0


if __name__ == "__main__":
    sys.exit(main())
