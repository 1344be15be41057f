"""Podman on a systemd test host (tools/testhosts), and the simulated engine's image for it.

The guests reach no network: Podman comes from Debian's packages downloaded on this machine, with the
test hosts' own package database, so that only what a guest lacks is fetched (cached, keyed by the
guests' root filesystem). The image is the guests' own root filesystem (tools/testhosts' tarball)
imported, plus the simulated engine's package in its Python's site directory: built on a guest once,
saved as an OCI archive under MODELWAKE_CACHE and keyed by the root filesystem and the engine's files,
so later runs only load it (as an air-gapped host does, through inference_env_container_image_archive).

What the guests need that a real host does not (docs/containers.md): Podman's storage on a
directory of this machine's own filesystem, which tools/testhosts binds at /var/lib/containers (a guest's
root is an overlayfs, on which Podman's overlay cannot mount: it would fall back to vfs, which copies the
image's every file for each container), no session keyring per container (the guest may not create one), and
--cgroups=disabled (the guest's cgroup v1 controllers are read-only): the container's processes then stay
in the unit's own cgroup, as --cgroups=split keeps them in sub-cgroups of it on a cgroup v2 host.
"""
import fcntl
import hashlib
import io
import os
import shutil
import subprocess
import tarfile
import zipfile

from tests.helpers.guesthost import guest_sh, guest_ssh, testhosts_tool
from tests.helpers.paths import SIM_WHEELS

CACHE = os.path.join(os.environ.get("MODELWAKE_CACHE") or os.path.expanduser("~/.cache/modelwake"), "podman")
# Podman's packages and the container's init (catatonit, for --init: it passes the stop on to the engine).
PACKAGES = ["podman", "catatonit"]
# Bump when the image's recipe changes, so an archive built the old way is not reused.
IMAGE_RECIPE = "1"
IMAGE_NAME = "localhost/modelwake-sim"
SITE = "/usr/local/lib/python3.11/dist-packages/"
CONTAINERFILE = "FROM localhost/modelwake-testhost-base\nADD sim.tar %s\n" % SITE
STORAGE_CONF = '[storage]\ndriver = "overlay"\nrunroot = "/run/containers/storage"\ngraphroot = "/var/lib/containers/storage"\n'
CONTAINERS_CONF = "[containers]\nkeyring = false\n"


class Locked(object):
    """One builder at a time per cache entry (parallel pytest workers share MODELWAKE_CACHE)."""

    def __init__(self, path):
        self.path = path + ".lock"

    def __enter__(self):
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(self.fd, fcntl.LOCK_EX)

    def __exit__(self, *exc):
        os.close(self.fd)


def podman_debs():
    """The directory of the .deb files Podman adds to a test host (downloaded once)."""
    return guest_debs(PACKAGES)


def guest_debs(packages):
    """The directory of the .deb files that `packages` add to a test host (downloaded once, cached by the
    guests' root filesystem and the package list)."""
    tool = testhosts_tool()
    lower = os.path.join(tool.CACHE, tool.rootfs_id())
    debs = os.path.join(CACHE, "debs-%s-%s" % (tool.rootfs_id(), hashlib.sha256(" ".join(packages).encode()).hexdigest()[:8]))
    with Locked(debs):
        if os.path.isdir(debs):
            return debs
        work = debs + ".work"
        shutil.rmtree(work, ignore_errors=True)
        for sub in ("lists/partial", "cache/archives/partial"):
            os.makedirs(os.path.join(work, sub))
        # The host's apt, resolving against the guests' package database and sources: it fetches exactly
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


def install_debs(guest, packages):
    """Install `packages` on the guest from the cached .deb files (the guests reach no network)."""
    debs = guest_debs(packages)
    push_files(guest, "/root/guest-debs", [os.path.join(debs, name) for name in sorted(os.listdir(debs))])
    guest_sh(guest, "DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "
                    "/root/guest-debs/*.deb >/dev/null && rm -rf /root/guest-debs", timeout=300)


def push_files(guest, directory, paths):
    """Copy local files into `directory` on the guest (one tar stream over its SSH)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for path in paths:
            tar.add(path, arcname=os.path.basename(path))
    guest_sh(guest, "mkdir -p %s && tar -x -C %s" % (directory, directory), stdin=buf.getvalue(), timeout=300)


def install_podman(guest):
    """Podman on the guest from the cached packages, set up for what the guests lack."""
    install_debs(guest, PACKAGES)
    guest_sh(guest, "cat > /etc/containers/storage.conf", stdin=STORAGE_CONF)
    guest_sh(guest, "cat > /etc/containers/containers.conf", stdin=CONTAINERS_CONF)


def sim_tar():
    """The simulated engine's package files (its wheel's, pure Python, no dependencies) as a tar, and
    their digest, which keys the image."""
    wheels = [name for name in os.listdir(SIM_WHEELS) if name.startswith("modelwake_sim-") and name.endswith(".whl")]
    assert len(wheels) == 1, "one modelwake_sim wheel expected in %s (playbooks/demo-model.yml builds it): %s" % (
        SIM_WHEELS, wheels)
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


def sim_image(guest):
    """(the image archive on this machine, its ID sha256:<hex>): built on `guest` (Podman installed) the
    first time, then reused; the guest's storage is left without it, for the deploy to load."""
    tool = testhosts_tool()
    tar_bytes, sim_digest = sim_tar()
    key = hashlib.sha256(("%s %s %s" % (IMAGE_RECIPE, tool.rootfs_id(), sim_digest)).encode()).hexdigest()[:16]
    archive = os.path.join(CACHE, "sim-image-%s.oci.tar" % key)
    id_file = archive + ".id"
    with Locked(archive):
        if not (os.path.exists(archive) and os.path.exists(id_file)):
            work = "/root/image-build"
            with open(os.path.join(CACHE, "sim.tar"), "wb") as handle:
                handle.write(tar_bytes)
            with open(os.path.join(CACHE, "Containerfile"), "w") as handle:
                handle.write(CONTAINERFILE)
            push_files(guest, work, [tool.build(), os.path.join(CACHE, "sim.tar"), os.path.join(CACHE, "Containerfile")])
            guest_sh(guest, "cd %s && podman import --quiet %s localhost/modelwake-testhost-base >/dev/null && "
                            "podman build --quiet --cgroup-manager=cgroupfs -t %s:%s . >/dev/null"
                     % (work, os.path.basename(tool.build()), IMAGE_NAME, key), timeout=600)
            image_id = "sha256:" + guest_sh(guest, "podman image inspect --format '{{.Id}}' %s:%s" % (IMAGE_NAME, key))
            guest_sh(guest, "podman save --quiet --format oci-archive -o %s/image.tar %s:%s" % (work, IMAGE_NAME, key),
                     timeout=600)
            with open(archive + ".tmp", "wb") as out:
                subprocess.run(guest_ssh(guest, "cat %s/image.tar" % work), stdout=out, check=True, timeout=600)
            os.rename(archive + ".tmp", archive)
            with open(id_file, "w") as handle:
                handle.write(image_id + "\n")
            guest_sh(guest, "rm -rf %s && podman rmi --all --force >/dev/null" % work, timeout=300)
        with open(id_file) as handle:
            return archive, handle.read().strip()


# An engine upgrade that fails at start: the simulator's entry point replaced by one whose import fails as a
# CUDA build for another driver does.
BROKEN_MAIN = ('raise ImportError("libcudart.so.13: cannot open shared object file: No such file or directory '
               '(an image built for a newer driver)")\n')


def broken_image(guest, base_id):
    """The ID of an image derived on `guest` from the image `base_id` (present there), whose engine fails at
    its start: no RUN step (nothing runs during the build), so the build is one layer copied."""
    work = "/root/broken-image"
    guest_sh(guest, "mkdir -p %s/modelwake_sim && cat > %s/modelwake_sim/__main__.py" % (work, work), stdin=BROKEN_MAIN)
    guest_sh(guest, "cat > %s/Containerfile" % work,
             stdin="FROM %s\nCOPY modelwake_sim/__main__.py %smodelwake_sim/__main__.py\n"
             % (base_id[len("sha256:"):], SITE))
    guest_sh(guest, "cd %s && podman build --quiet --pull=never --cgroup-manager=cgroupfs -t %s:broken . >/dev/null"
             % (work, IMAGE_NAME), timeout=300)
    return "sha256:" + guest_sh(guest, "podman image inspect --format '{{.Id}}' %s:broken" % IMAGE_NAME)
