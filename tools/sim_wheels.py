#!/usr/bin/env python3
"""Build the wheels a test host installs the simulated engine from: modelwake_sim's own wheel, built
from its source, and py-spy's, downloaded once. The hosts have no index, so the deploy hands this
directory to inference_env as one of its inference_env_extra_wheel_dirs. Test and demo set-up only
(playbooks/demo-model.yml and the tests run it): the roles know nothing of the simulator.

    python tools/sim_wheels.py DEST [--source DIR] [--py-spy VERSION]

Runs pip with the interpreter that runs it (Ansible's own, with setuptools >= 70.1: the wheel is built
without build isolation, so no index is needed for it). Prints DEST.
"""
import argparse
import fcntl
import glob
import os
import shutil
import subprocess
import sys
import tempfile

SIM_SOURCE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "engines", "sim")
# inference_env's default py-spy release (tests/unit/test_stacks.py keeps them equal).
PY_SPY_VERSION = "0.4.1"
PIP = [sys.executable, "-m", "pip", "--disable-pip-version-check"]


def build(dest, source=SIM_SOURCE, py_spy=PY_SPY_VERSION):
    """Build the sim wheel into dest (every time: the source may have changed) and download py-spy's
    wheel of that release when dest has none (py_spy empty: none)."""
    os.makedirs(dest, exist_ok=True)
    # setuptools builds in its source's build/ and *.egg-info: built from a copy, so that nothing is
    # written into the checkout and an interrupted build leaves nothing behind for the next. One build
    # at a time (the tests' guests are set up side by side): each replaces the same wheel in dest.
    with open(os.path.join(dest, ".build.lock"), "w") as lock, tempfile.TemporaryDirectory() as scratch:
        fcntl.flock(lock, fcntl.LOCK_EX)
        copy = os.path.join(scratch, "sim")
        shutil.copytree(source, copy, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
        subprocess.run(PIP + ["wheel", "--no-deps", "--no-build-isolation", "--wheel-dir", dest, copy],
                       check=True, stdout=subprocess.DEVNULL)
    if py_spy and not glob.glob(os.path.join(dest, "py_spy-%s-*.whl" % py_spy)):
        subprocess.run(PIP + ["download", "--no-deps", "--only-binary", ":all:", "--dest", dest,
                              "py-spy==%s" % py_spy], check=True, stdout=subprocess.DEVNULL)
    return dest


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dest", help="directory for the wheels (created; kept wheels are reused)")
    parser.add_argument("--source", default=SIM_SOURCE, help="the simulator's source (default: engines/sim)")
    parser.add_argument("--py-spy", default=PY_SPY_VERSION, help="py-spy release to download; empty: none")
    args = parser.parse_args(argv)
    print(build(os.path.abspath(args.dest), args.source, args.py_spy))
    return 0


if __name__ == "__main__":
    sys.exit(main())
