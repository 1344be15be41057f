"""The launcher's wait learns the disk's rate from the unit's state directory (written by the role, so a
re-measured rate never changes the unit) and the ranks from the engine command."""
import pytest

from ansible_collections.modelwake.serving.plugins.module_utils.launcher import disk_rate
from ansible_collections.modelwake.serving.plugins.module_utils.launcher.cli import build_launch_config, parse_args


@pytest.mark.parametrize("content, rate", [
    ("3400000000\n", 3400000000),
    ("0\n", None),  # the preflight read warm or not at all
    ("fast\n", None),
    ("", None),
    ("12 34\n", None),
])
def test_the_rate_file(tmp_path, content, rate):
    (tmp_path / disk_rate.DISK_RATE_FILE).write_text(content)
    assert disk_rate.read_disk_rate(str(tmp_path)) == rate


def test_no_file_or_no_state_directory_is_no_rate(tmp_path):
    assert disk_rate.read_disk_rate(str(tmp_path)) is None
    assert disk_rate.read_disk_rate(None) is None


@pytest.mark.parametrize("command, tp", [
    (["python", "-m", "sglang.launch_server", "--model-path", "/m", "--tp", "8"], 8),
    (["vllm", "serve", "/m", "--tensor-parallel-size=4"], 4),
    (["python", "-m", "modelwake_sim", "serve", "--tp-size", "2"], 2),
    (["python", "-m", "vllm.entrypoints.openai.api_server", "--model", "/m"], 1),
    (["x", "--tp"], 1),
])
def test_the_ranks_from_the_engine_command(command, tp):
    assert disk_rate.tensor_parallel(command) == tp


def test_the_launch_config_carries_both(tmp_path):
    (tmp_path / disk_rate.DISK_RATE_FILE).write_text("7000000000\n")
    options = parse_args(["--url", "http://127.0.0.1:30001", "--state-dir", str(tmp_path), "--no-start-history",
                          "--", "python", "-m", "sglang.launch_server", "--tp", "8"])
    config = build_launch_config(options, {})
    assert (config.disk_rate, config.tensor_parallel) == (7000000000, 8)
