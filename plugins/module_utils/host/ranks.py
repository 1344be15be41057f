"""Which of a server's processes are its ranks: the processes the engine itself made one, by the title
it gave them. The engines' titles, from their source, in one place:

- SGLang: each scheduler (one per GPU of the tensor-parallel group) calls
  `setproctitle.setproctitle(f"sglang::scheduler{prefix}")` with the prefix ` DP<d> TP<t> EP<e> PP<p>`
  (each part only when that kind of parallelism is on) and spaces turned to `_`:
  `sglang::scheduler_TP3`, `sglang::scheduler_DP0_TP3_EP0`, or plain `sglang::scheduler` at TP 1
  (sgl-project/sglang, python/sglang/srt/managers/scheduler.py, run_scheduler_process).
- vLLM: `set_process_title(name, suffix)` titles a process `VLLM::<name>_<suffix>`: its tensor-parallel
  workers `VLLM::Worker_TP3` (`VLLM::Worker_PP1_TP3` with pipeline stages) and its engine core
  `VLLM::EngineCore` (`_DP<d>` with data parallelism), which is no rank of its own when workers exist
  (vllm-project/vllm, vllm/utils/system_utils.py set_process_title; v1/executor/multiproc_executor.py;
  v1/engine/core.py). The kernel keeps 15 characters of a title as comm (`VLLM::Worker_TP`), so the
  title is read from the command line, whose argv area setproctitle overwrites.
- The simulated engine (engines/sim) titles its processes the same way.

What is not a rank, though its name may look like one:
- a child made by fork() without exec: it carries its parent's title (`sglang::scheduler_TP0`) and
  command line, a copy of the rank's, not a rank of its own (a compile worker, a forked check);
- a helper called `loader_TP0`, or any process whose title is not one of the patterns below, whole;
- a number in an argument (`--node-rank 0`, `--tp 8`): only the title is read, never the arguments.
"""
import re

# The engines' titles, matched whole: (pattern, the group that holds the TP index, or None).
RANK_TITLES = (
    # `sglang::scheduler`, `sglang::scheduler_TP3`, `sglang::scheduler_DP0_TP3_EP0_PP1`.
    re.compile(r"sglang::scheduler(?:_DP\d+)?(?:_TP(?P<tp>\d+))?(?:_EP\d+)?(?:_PP\d+)?"),
    # `VLLM::Worker_TP3`, `VLLM::Worker_PP1_TP3`.
    re.compile(r"VLLM::Worker(?:_PP\d+)?_TP(?P<tp>\d+)"),
)
# The engine's processes that are no rank of their own, named for messages.
ENGINE_TITLES = (re.compile(r"VLLM::EngineCore(?:_DP\d+)?"), re.compile(r"sglang::detokenizer"))


def title(info):
    """The title a process set itself: the first word of its command line when it has the engines'
    `<engine>::<name>` form (setproctitle writes it over the whole argv area), else None."""
    words = (info.get("cmdline") or "").split()
    if words and "::" in words[0]:
        return words[0]
    return None


def rank_of_title(name):
    """The TP index a title names (`sglang::scheduler_TP3` -> 3, `sglang::scheduler` -> 0), else None."""
    for pattern in RANK_TITLES:
        match = pattern.fullmatch(name or "")
        if match:
            return int(match.group("tp") or 0)
    return None


def inherited(info, processes):
    """Whether the process's command line is a copy of its parent's: made by fork() without exec."""
    parent = processes.get(info.get("ppid"))
    return parent is not None and (parent.get("cmdline") or "") == (info.get("cmdline") or "")


def engine_ranks(processes):
    """{pid: TP index} of the processes the engine made ranks: an engine's rank title that is the
    process's own, not its parent's. processes: {pid: procfs.read_process() info} of one look."""
    ranks = {}
    for pid, info in processes.items():
        rank = rank_of_title(title(info))
        if rank is not None and not inherited(info, processes):
            ranks[pid] = rank
    return ranks
