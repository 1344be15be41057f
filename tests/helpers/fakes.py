"""The test doubles of tests/fakes/, loaded for a test."""
import importlib.util
import os

from tests.helpers.paths import FAKES


def fresh_nvml_api():
    """A new copy of tests/fakes/nvml_api.py (NVML's calls faked in Python): its GPUs are module
    state, so each test gets a copy of its own instead of the one an import would share."""
    spec = importlib.util.spec_from_file_location("nvml_api", os.path.join(FAKES, "nvml_api.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
