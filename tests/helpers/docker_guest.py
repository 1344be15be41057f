"""The Docker guest tests' own images (tools/guest_runtime.py installs Docker and builds the simulated engine's
image, as `make demo RUNTIME=docker` does): an engine upgrade that fails at its start, derived from that image.
"""
from tests.helpers.guesthost import guest_sh
from tests.helpers.podman_guest import BROKEN_MAIN
from tools import guest_runtime

IMAGE_NAME = guest_runtime.IMAGE_NAME["docker"]
SITE = guest_runtime.SITE


def sim_image(guest):
    """(the image archive on this machine, gzipped `docker save`, its ID): tools/guest_runtime.py's, built once
    per cache."""
    return guest_runtime.sim_image(guest, "docker")


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
