"""The test doubles of tests/fakes/, loaded for a test."""
import importlib.util
import os
import subprocess

from tests.helpers.paths import FAKES


def fresh_nvml_api():
    """A new copy of tests/fakes/nvml_api.py (NVML's calls faked in Python): its GPUs are module
    state, so each test gets a copy of its own instead of the one an import would share."""
    spec = importlib.util.spec_from_file_location("nvml_api", os.path.join(FAKES, "nvml_api.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class ScriptedRun(object):
    """A `run` callable (subprocess.run's signature) that gives the scripted (rc, stdout) answers in turn and
    records each command: a container runtime's client (`docker inspect`, `docker ps`) scripted for a test."""

    def __init__(self, *answers):
        self.answers = list(answers)
        self.commands = []

    def __call__(self, argv, **_kwargs):
        self.commands.append(argv)
        rc, out = self.answers.pop(0)
        return subprocess.CompletedProcess(argv, rc, out, "")
