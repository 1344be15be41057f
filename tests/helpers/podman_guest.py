"""The Podman guest tests' own images (tools/guest_runtime.py installs Podman and builds the simulated engine's
image, as `make demo RUNTIME=podman` does): an engine upgrade that fails at its start, derived from that image.
"""
from tests.helpers.guesthost import guest_sh
from tools import guest_runtime

IMAGE_NAME = guest_runtime.IMAGE_NAME["podman"]
SITE = "/" + guest_runtime.SITE


def sim_image(guest):
    """(the image archive on this machine, its ID): tools/guest_runtime.py's, built once per cache."""
    return guest_runtime.sim_image(guest, "podman")


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
