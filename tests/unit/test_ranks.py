"""Which processes are ranks: the engine's own titles, whole, never one inherited by fork() or read
from an argument (host/ranks.py)."""
import pytest

from ansible_collections.modelwake.serving.plugins.module_utils.host import ranks


@pytest.mark.parametrize("title, rank", [
    ("sglang::scheduler_TP3", 3),
    ("sglang::scheduler_DP0_TP5_EP0", 5),
    ("sglang::scheduler_DP1_TP2_EP2_PP1", 2),
    ("sglang::scheduler", 0),  # TP 1: SGLang adds no TP part
    ("VLLM::Worker_TP7", 7),
    ("VLLM::Worker_PP1_TP3", 3),
    ("VLLM::EngineCore", None),
    ("VLLM::EngineCore_DP0", None),
    ("sglang::detokenizer", None),
    ("loader_TP0", None),
    ("sglang::scheduler_TP0_helper", None),  # matched whole, not as a prefix
    (None, None),
])
def test_a_rank_is_named_by_the_engines_own_title_whole(title, rank):
    assert ranks.rank_of_title(title) == rank


def process(pid, ppid, cmdline, comm="python3"):
    return {"pid": pid, "ppid": ppid, "cmdline": cmdline, "comm": comm}


def test_a_child_forked_with_its_ranks_title_is_no_rank_and_an_exec_child_is_by_its_own_title():
    processes = {
        100: process(100, 1, "/opt/v/bin/python3 -m sglang.launch_server --tp 2 --node-rank 0"),
        101: process(101, 100, "sglang::scheduler_TP0", "sglang::schedul"),
        102: process(102, 100, "sglang::scheduler_TP1", "sglang::schedul"),
        103: process(103, 101, "sglang::scheduler_TP0", "sglang::schedul"),  # a compile worker, fork() alone
        104: process(104, 101, "/opt/v/bin/python3 -c import triton", "python3"),  # fork + exec
        105: process(105, 100, "/opt/v/bin/python3 -m sglang.launch_server --tp 2 --node-rank 0"),  # forked helper
        106: process(106, 101, "nvidia-smi --query-gpu=memory.used --format=csv", "nvidia-smi"),
        107: process(107, 100, "loader_TP0", "loader_TP0"),
    }
    assert ranks.engine_ranks(processes) == {101: 0, 102: 1}


def test_a_rank_whose_parent_is_outside_the_tree_is_still_a_rank():
    # vLLM's workers under a launcher the look does not include.
    processes = {201: process(201, 200, "VLLM::Worker_TP1", "VLLM::Worker_TP")}
    assert ranks.engine_ranks(processes) == {201: 1}


def test_the_title_is_read_only_from_the_engines_form():
    assert ranks.title({"cmdline": "sglang::scheduler_TP0"}) == "sglang::scheduler_TP0"
    assert ranks.title({"cmdline": "python3 -m x --name a::b"}) is None
    assert ranks.title({"cmdline": ""}) is None
