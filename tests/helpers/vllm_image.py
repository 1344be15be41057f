"""The real vLLM CPU build in a Podman image, built on a systemd test host (tests/integration/test_vllm_deploy.py).

The image is the test hosts' own root filesystem (tools/testhosts' tarball, as tools/guest_runtime.py
imports it) plus the venv that inference_env installed on the guest, at the same path (its bin/python links
to the root filesystem's /usr/bin/python3.11), and libnuma.so.1, which vLLM's CPU kernels link and the guest
got from its package. No registry and nothing run during the build: the guest's venv is appended to the root
filesystem's tar, which `podman import` makes one layer.

Why one imported layer and not `podman build` with FROM and COPY: the venv is 3.5 GB, and a build copies it
into its working container, then tars, hashes and writes it again when it commits (measured with the vfs
driver the guests first had: 197 s on the 2-core test machine); the import writes it once and hashes it (78 s).
With vfs every container's creation copied the image once more (22 to 89 s of the first start); the guests'
container storage is overlay now (tools/testhosts binds it from this machine's filesystem), which copies
nothing. Each step's time goes into `timings`.
"""
import os
import time

from tests.helpers.guesthost import guest_sh, testhosts_tool
from tools.guest_runtime import push_files

IMAGE = "localhost/modelwake-vllm-cpu"
LIBNUMA = ["usr/lib/x86_64-linux-gnu/libnuma.so.1", "usr/lib/x86_64-linux-gnu/libnuma.so.1.0.0"]
WORK = "/root/vllm-image"


def build_vllm_image(guest, venv, timings):
    """The ID (sha256:<hex>) of the image built on `guest` (Podman installed) from the test hosts' root
    filesystem and the guest's `venv`; the sizes and the time of each step are added to `timings`."""

    def step(label, command):
        mark = time.monotonic()
        out = guest_sh(guest, command, timeout=600)
        timings["image: " + label] = round(time.monotonic() - mark, 1)
        return out

    rootfs = testhosts_tool().build()
    mark = time.monotonic()
    push_files(guest, WORK, [rootfs])
    timings["image: root filesystem to the guest"] = round(time.monotonic() - mark, 1)
    timings["image: venv MB (its __pycache__ MB)"] = guest_sh(
        guest, "echo $(du -sm %s | cut -f1) \"($(find %s -name __pycache__ -type d -print0 | du -cm --files0-from=- "
               "| tail -1 | cut -f1))\"" % (venv, venv))
    # The venv's compiled modules (__pycache__) stay: without them every start would compile vLLM's imports.
    # The venv's parent directory (absent from the root filesystem) as an entry of its own: a layer may not hold
    # a path twice, and tar's --no-recursion is not positional, so it is appended alone first.
    tar = "%s/%s" % (WORK, os.path.basename(rootfs)[:-len(".gz")])
    step("venv appended to the root filesystem's tar",
         "gunzip --force {tar}.gz && tar --append --file {tar} -C / --no-recursion {parent} && "
         "tar --append --file {tar} -C / {venv} {libnuma}".format(
             tar=tar, parent=os.path.dirname(venv.strip("/")), venv=venv.strip("/"), libnuma=" ".join(LIBNUMA)))
    step("podman import (one layer)", "podman import --quiet %s %s >/dev/null" % (tar, IMAGE))
    image_id = "sha256:" + guest_sh(guest, "podman image inspect --format '{{.Id}}' %s" % IMAGE)
    timings["image: MB"] = int(guest_sh(guest, "podman image inspect --format '{{.Size}}' %s" % IMAGE)) // 2 ** 20
    guest_sh(guest, "rm -rf %s" % WORK, timeout=300)
    return image_id
