"""The real compressed-tensors wheels and a venv holding torch 2.13.0 (CPU) with compressed-tensors 0.8.1, the
K2.6 engine's situation, built once under ${MODELWAKE_CACHE:-~/.cache/modelwake}/inference_env and shared by
tests/integration/test_inference_env_real.py (the venv's repair) and test_podman_guest.py (an image's).

The wheels (about 240 MB, torch included) are downloaded once with pip's own configuration (the index is
needed that first time only); the venv is built once from them, offline, and copied for each use."""
import os
import shutil
import subprocess
import sys
import time

from tests.helpers import envkit

CACHE = os.path.join(os.environ.get("MODELWAKE_CACHE") or os.path.expanduser("~/.cache/modelwake"), "inference_env")
TORCH = "2.13.0"
NVFP4 = {"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized",
         "config_groups": {"group_0": {"targets": ["Linear"], "weights": {"num_bits": 4, "type": "float"}}}}
# Installed in the starting venv: what the K2.6 engine venv had, plus psutil, which 0.15.0.1 imports
# without declaring it (its setup.py) and which engine venvs carry anyway.
START = ["torch==%s" % TORCH, "compressed-tensors==0.8.1", "psutil"]
WHEELS = os.path.join(CACHE, "real-wheels")
TEMPLATE_VENV = os.path.join(CACHE, "real-venv-torch-%s" % TORCH)


def timed(label, timings, func, *args):
    started = time.monotonic()
    value = func(*args)
    timings[label] = round(time.monotonic() - started, 1)
    return value


def _download(dest):
    """Real wheels for both releases and their dependencies, with torch held at 2.13.0."""
    partial = dest + ".partial"
    shutil.rmtree(partial, ignore_errors=True)
    for spec in ("compressed-tensors==0.15.0.1", "compressed-tensors==0.8.1"):
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--dest", partial, spec,
                        "torch==%s" % TORCH, "psutil"], check=True)
    os.rename(partial, dest)


def _template_venv(wheels, dest):
    partial = dest + ".partial"
    shutil.rmtree(partial, ignore_errors=True)
    envkit.make_venv(partial, wheels, START, compile_bytecode=False)
    # A venv finds its packages relative to its pyvenv.cfg, so `bin/python -m pip` works after a move.
    os.rename(partial, dest)


def cached(timings):
    """(the wheels' directory, the template venv), built the first time."""
    os.makedirs(CACHE, exist_ok=True)
    if not os.path.isdir(WHEELS):
        timed("download wheels (first time, index)", timings, _download, WHEELS)
    if not os.path.isdir(TEMPLATE_VENV):
        timed("build torch venv (first time, offline)", timings, _template_venv, WHEELS, TEMPLATE_VENV)
    return WHEELS, TEMPLATE_VENV


def wheelhouse(dest, patterns=("compressed_tensors-", "loguru-")):
    """A role's wheelhouse at `dest` with the cached wheels whose names start with `patterns`: by default what
    the upgrade needs, both compressed-tensors releases and loguru (torch stays where it is, so it need not
    be shipped)."""
    os.makedirs(dest)
    for pattern in patterns:
        for name in os.listdir(WHEELS):
            if name.startswith(pattern):
                shutil.copy(os.path.join(WHEELS, name), dest)
    return dest
