"""Docker on a systemd test host (tools/testhosts), and the simulated engine's image for it.

Docker 20.10 (Debian 12's docker.io), containerd, runc and tini (Docker's --init) come from Debian's packages,
downloaded on this machine as Podman's are (podman_guest.guest_debs). The image is Podman's test image's
recipe (the test hosts' root filesystem plus the simulated engine), slimmed to one layer (image_tar), imported
on a guest once and cached as a gzipped `docker save` archive: Docker 20.10 loads no OCI archive.

What the guests need that a real host does not (docs/containers.md): the guests' cgroup v1
controllers are read-only, and runc, as root, fails creating the container's cgroups there. A wrapper,
Docker's default runtime on the guest only, runs runc as rootless runc does (`--rootless=true`: it then
passes over the cgroups it cannot create) with the container's cgroup path and limits removed, and without
a session keyring per container (the guest may not create one). runc still puts the container in a
name=systemd cgroup of its own (below containerd.service), as on a real host. Docker's storage is overlay2 on
a directory of this machine's own filesystem, which tools/testhosts binds at /var/lib/docker (on the guest's
overlayfs root dockerd would fall back to vfs, which copies a whole image for each container); the network
is the host's, so neither a bridge nor iptables rules are made.
"""
import hashlib
import io
import json
import os
import subprocess
import tarfile

from tests.helpers.guesthost import guest_sh, guest_ssh, testhosts_tool
from tests.helpers.podman_guest import BROKEN_MAIN, CACHE, Locked, install_debs, push_files, sim_tar

PACKAGES = ["docker.io", "tini"]
# Bump when the image's recipe changes, so an archive built the old way is not reused.
IMAGE_RECIPE = "2"
IMAGE_NAME = "localhost/modelwake-sim-docker"
SITE = "usr/local/lib/python3.11/dist-packages/"
# What the image leaves out of the test hosts' root filesystem (tar member prefixes).
SLIMMED = tuple("./" + path for path in ("usr/share/locale/", "usr/share/doc/", "usr/share/man/", "usr/share/info/",
                                          "usr/share/perl", "usr/share/python-wheels/", "usr/lib/python3/",
                                          "usr/lib/systemd/", "var/lib/dpkg/", "var/lib/apt/", "var/cache/"))
RUNC_WRAPPER = "/usr/local/sbin/runc-testhost"
DAEMON_JSON = json.dumps({"storage-driver": "overlay2", "iptables": False, "bridge": "none",
                          "runtimes": {"runc-testhost": {"path": RUNC_WRAPPER}}, "default-runtime": "runc-testhost"})
RUNC_WRAPPER_SCRIPT = '''#!/usr/bin/python3
"""runc for a test host whose cgroup v1 controllers are read-only (tests/helpers/docker_guest.py)."""
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


def install_docker(guest):
    """Docker on the guest from the cached packages, its daemon configured before its first start."""
    guest_sh(guest, "mkdir -p /etc/docker && cat > /etc/docker/daemon.json", stdin=DAEMON_JSON)
    guest_sh(guest, "cat > %s && chmod 755 %s" % (RUNC_WRAPPER, RUNC_WRAPPER), stdin=RUNC_WRAPPER_SCRIPT)
    install_debs(guest, PACKAGES)
    guest_sh(guest, "systemctl is-active docker containerd >/dev/null")


def image_tar(path):
    """Write the image's one layer to `path`: the test hosts' root filesystem without what the simulated engine
    never reads (its Python's standard library and shared libraries stay), plus the engine in the site
    directory. One slim layer keeps the archive and its load short."""
    tool = testhosts_tool()
    tar_bytes, _digest = sim_tar()
    with tarfile.open(tool.build(), "r:gz") as rootfs, tarfile.open(path, "w") as out:
        for member in rootfs:
            if not member.name.startswith(SLIMMED):
                out.addfile(member, rootfs.extractfile(member) if member.isfile() else None)
        with tarfile.open(fileobj=io.BytesIO(tar_bytes)) as sim:
            for member in sim:
                member.name = SITE + member.name
                out.addfile(member, sim.extractfile(member))


def sim_image(guest):
    """(the image archive on this machine, gzipped `docker save`, and its ID sha256:<hex>): built on `guest`
    (Docker installed) the first time, then reused; the guest's storage is left without it, for the deploy
    to load."""
    tool = testhosts_tool()
    _tar_bytes, sim_digest = sim_tar()
    key = hashlib.sha256(("%s %s %s" % (IMAGE_RECIPE, tool.rootfs_id(), sim_digest)).encode()).hexdigest()[:16]
    archive = os.path.join(CACHE, "sim-image-%s.docker.tar.gz" % key)
    id_file = archive + ".id"
    with Locked(archive):
        if not (os.path.exists(archive) and os.path.exists(id_file)):
            work = "/root/image-build"
            layer = os.path.join(CACHE, "sim-docker-layer.tar")
            image_tar(layer)
            push_files(guest, work, [layer])
            os.unlink(layer)
            guest_sh(guest, "docker import %s/%s %s:%s >/dev/null" % (work, os.path.basename(layer), IMAGE_NAME, key),
                     timeout=600)
            image_id = guest_sh(guest, "docker image inspect --format '{{.Id}}' %s:%s" % (IMAGE_NAME, key))
            guest_sh(guest, "docker save %s:%s | gzip -1 > %s/image.tar.gz" % (IMAGE_NAME, key, work), timeout=600)
            with open(archive + ".tmp", "wb") as out:
                subprocess.run(guest_ssh(guest, "cat %s/image.tar.gz" % work), stdout=out, check=True,
                               timeout=600)
            os.rename(archive + ".tmp", archive)
            with open(id_file, "w") as handle:
                handle.write(image_id + "\n")
            guest_sh(guest, "rm -rf %s && docker rmi --force %s:%s >/dev/null" % (work, IMAGE_NAME, key), timeout=300)
        with open(id_file) as handle:
            return archive, handle.read().strip()


def broken_image(guest, base_id):
    """The ID of an image derived on `guest` from the image `base_id` (present there) whose engine fails at its
    start (podman_guest.BROKEN_MAIN): Docker's builder copies the one file into a layer of its own, no RUN step
    (nothing runs during the build). The base is tagged for the build's FROM, a name the builder resolves
    without a registry."""
    work = "/root/broken-image"
    guest_sh(guest, "mkdir -p %s/modelwake_sim && cat > %s/modelwake_sim/__main__.py" % (work, work), stdin=BROKEN_MAIN)
    guest_sh(guest, "cat > %s/Dockerfile" % work,
             stdin="FROM %s:base\nCOPY modelwake_sim/__main__.py /%smodelwake_sim/__main__.py\n" % (IMAGE_NAME, SITE))
    guest_sh(guest, "docker tag %s %s:base && docker build --quiet -t %s:broken %s >/dev/null"
             % (base_id, IMAGE_NAME, IMAGE_NAME, work), timeout=300)
    return guest_sh(guest, "docker image inspect --format '{{.Id}}' %s:broken" % IMAGE_NAME)
