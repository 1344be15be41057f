"""`make demo RUNTIME=podman|docker` timed as a user runs it (docs/containers.md, "The container demo").

From no demo host (tools/testhosts down demo-k26) and no cached image archive: `make demo RUNTIME=podman`
(the test host, its scripted GPUs, the model, Podman from Debian's packages, the simulator's image built,
the deploy that loads it and waits until ready), the same command again (every step keeps what is there),
`make demo RUNTIME=docker` on that host (Docker installed, its image built, the unit moved into Docker's
container), the same again, and `make demo` (back to the venv). Each command's wall time from this process,
its play recap and the wait's "ready after" line. It replaces the demo host (demo-k26) and the two image
archives in MODELWAKE_CACHE.
"""
import glob
import os
import re
import subprocess
import time

from tests.helpers import ROOT
from tools import guest_runtime

HOST = "demo-k26"
# (label, make's RUNTIME)
RUNS = (("from no host and no image", "podman"), ("again", "podman"), ("on that host", "docker"), ("again", "docker"),
        ("venv again", "venv"))


def _recap(text):
    """The demo host's last play recap (deploy-k26.yml's, after demo-model.yml's)."""
    recaps = re.findall(r"^%s\s*:\s*(ok=.*)$" % HOST, text, re.M)
    return dict((key, int(value)) for key, value in re.findall(r"(\w+)=(\d+)", recaps[-1])) if recaps else None


def measure(work):
    result = {"status": "not measured", "runs": []}
    log_dir = os.path.join(work, "container-demo")
    os.makedirs(log_dir, exist_ok=True)
    subprocess.run([os.path.join(ROOT, "tools", "testhosts"), "down", HOST], cwd=ROOT,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for archive in glob.glob(os.path.join(guest_runtime.CACHE, "sim-image-*")):
        os.unlink(archive)
    for label, runtime in RUNS:
        mark = time.monotonic()
        proc = subprocess.run(["make", "demo", "RUNTIME=" + runtime], cwd=ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, universal_newlines=True, timeout=1800)
        seconds = round(time.monotonic() - mark, 1)
        log = os.path.join(log_dir, "%d-%s.log" % (len(result["runs"]), runtime))
        with open(log, "w") as handle:
            handle.write(proc.stdout)
        ready = re.search(r"ready after (\d+) s \(([^)]*)\)", proc.stdout)
        result["runs"].append({"label": label, "runtime": runtime, "rc": proc.returncode, "seconds": seconds,
                               "recap": _recap(proc.stdout), "ready_after_s": int(ready.group(1)) if ready else None,
                               "phases": ready.group(2) if ready else None, "log": log})
        if proc.returncode != 0:
            result["why"] = "%s failed (rc %d): %s" % (label, proc.returncode, proc.stdout[-600:])
            return result
    result["status"] = "measured"
    result["date"] = time.strftime("%Y-%m-%d")
    result["load_average"] = ["%.2f" % x for x in os.getloadavg()]
    return result
