#!/usr/bin/python
# Copyright: (c) modelwake contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Ansible module: wait until a starting LLM inference server is ready, from evidence."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: wait_for_model_ready
short_description: Wait for an SGLang or vLLM server to be ready, telling loading from hung from crashed
description:
  - Watches a starting inference server (SGLang or vLLM) until a real request succeeds, and says
    which phase it is in - C(not_started), C(starting), C(loading), C(initializing), C(ready), or
    the terminal verdicts C(failed), C(stalled), C(timeout).
  - Instead of one fixed deadline it judges from evidence read on the host - the process tree's CPU
    time (including reaped children) and disk reads (C(read_bytes)), GPU memory through NVML or
    C(nvidia-smi), the engine's log lines (journald or a file), systemd's unit state, and HTTP
    answers. A silent phase with CPU or disk activity is never stalled; a hang is reported once
    I(stall_timeout) passes with no progress on any signal; a crash is reported within one poll.
  - Runs on the managed host with the Python standard library alone. GPUs are read through NVML, the
    driver's own C(libnvidia-ml.so.1) bound with ctypes (nothing to install), else C(nvidia-smi).
  - With live progress (the action plugin, C(modelwake_progress_interval), on by default), the module
    checks its input and leaves the wait to one detached process of its own on the host; the
    controller reads that process's latest look with one shell command per interval, which returns
    at once when the wait ends. A wait nobody reads any more ends by itself.
  - A host that stops answering meanwhile (a dropped SSH connection) is looked at again every interval
    while its wait goes on on the host; the start is never judged on the gap, and the host is given up
    as unreachable only once I(timeout) has passed.
version_added: "1.0.0"
author: modelwake contributors (@modelwake)
extends_documentation_fragment:
  - modelwake.serving.server
options:
  engine:
    description:
      - Which engine's log markers and endpoint meanings apply. C(auto) decides from the log lines.
    type: str
    choices: [sglang, vllm, auto]
    default: auto
  unit:
    description:
      - A systemd unit to watch - its state, C(MainPID), C(NRestarts), every process of its cgroup,
        and its journal.
      - Exactly one of I(unit) and I(pid) is required.
    type: str
  pid:
    description:
      - A process to watch together with all its descendants (no systemd needed).
      - Exactly one of I(unit) and I(pid) is required.
      - A pid that is not running is refused, unless I(log_path) is given - then a wait begun after its
        server died ends C(failed) at its first look, quoting the exception or last line of the log. When
        another process listens on the I(url)'s port (the server restarted as a new process), it is still
        refused, naming that process.
    type: int
  log_path:
    description:
      - A log file of the server to follow (with I(unit), in addition to the journal).
    type: path
  ready_check:
    description:
      - What proves the server ready.
      - C(completion) posts a real completion (C("2+2="), 4 tokens, temperature 0) and needs a 200
        answer with C(choices). It is the only check that sees a hung vLLM engine, whose C(/health)
        stays 200.
      - C(health) needs C(GET /health) 200.
      - C(models) needs C(GET /v1/models) 200; SGLang answers it before it is ready.
    type: str
    choices: [completion, health, models]
    default: completion
  model:
    description:
      - Served model name for the completion. Default is the first id listed by C(/v1/models).
    type: str
  timeout:
    description:
      - Overall deadline in seconds. C(0) looks once and returns the current phase without failing.
      - C(auto) derives it from the host's record of earlier starts of this model (see I(history)) - the
        longest whole start seen (outliers left out) x 2, at least 600 s; without a record, 3600. The
        derivation is said once, at the wait's start, and returned as RV(budgets).
    type: raw
    default: 3600
  stall_timeout:
    description:
      - Seconds without progress on any signal after which the start counts as C(stalled).
      - C(auto) derives it from the host's record of earlier starts of this model - the longest
        silence seen inside a phase (outliers left out) x 1.5 + 60 s, at least 120 s; without a record, 600.
    type: raw
    default: 600
  poll_interval:
    description:
      - Seconds between the starts of two looks. A look that takes longer (a hung completion) is
        followed at once.
    type: float
    default: 5
  completion_timeout:
    description:
      - Seconds one look waits for the completion of I(ready_check=completion) (and at most for
        C(/health) and C(/v1/models), 5 s). Must be greater than 0.
      - After a completion timed out, the following looks wait at most I(poll_interval) for it while
        the server shows no other progress; any progress, or an answer, gives the next one the full
        I(completion_timeout) again. So a slow but working server still gets full attempts. No
        attempt runs past the moment the stall would be declared.
      - Bounds, from the event to the verdict - ready at the end of the first look whose completion
        answers, which starts at most one I(poll_interval) after the server can answer; a crash at
        most one I(poll_interval) after the exit; a hang never before I(stall_timeout) after the last
        progress seen and at most I(stall_timeout) + I(poll_interval) after it began, plus the last
        look's own time (with a hung completion, at most I(poll_interval) more).
    type: int
    default: 30
  model_path:
    description:
      - The model's directory on the host. The size of its weight files gives the loading
        fraction and ETA. Must exist.
    type: path
  expected_bytes:
    description:
      - Bytes the server reads while loading, instead of I(model_path) (wins over it when both are given).
    type: int
  disk_read_rate:
    description:
      - The cold sequential read rate of the disk under the model, in bytes per second, as the GPU
        preflight measures it (the fact C(gpu_preflight_disk_rate)); C(0) or unset when unknown.
      - While loading runs below a third of it for 30 s, from the disk, the verdict's C(bottleneck)
        and message say so, with the likely cause (page faults through mmap, or reads too few or
        too small) and the engine's option to try.
    type: int
  tensor_parallel:
    description:
      - The engine's ranks on this host (its tensor-parallel size). With mmap every rank faults the
        same files, which the slow-load line says.
    type: int
    default: 1
  gpus:
    description:
      - Indices of the GPUs to watch. Default is all.
    type: list
    elements: int
  progress_path:
    description:
      - A file on the host to which one JSON line per look is appended (the snapshot and the verdict).
    type: path
  py_spy:
    description:
      - Where py-spy is, to read the Python stacks of the server's processes (the ranks) during
        silent phases - C(auto) looks next to the engine's interpreter (the venv's C(bin/), where
        the inference_env role installs it), then on C(PATH); an absolute path names it; C(off)
        reads no stacks.
      - Without py-spy everything works as without stacks, and the result's warnings say once why
        stacks are unavailable.
    type: str
    default: auto
  stacks_interval:
    description:
      - The least seconds between two reads of the stacks (each read costs some tens of ms of CPU per
        Python process). C(0) reads them at every look that saw nothing move but CPU, unless the
        last read cost so much CPU that reading that often would take more than 0.25 % of a core;
        the reads are then spaced to that share, and never more than I(stall_timeout) / 4 apart.
      - A busy-spinning hang is declared stalled at most I(stall_timeout) + 2 x I(poll_interval) + the
        gap between two reads after it began.
    type: float
    default: 0
  peers:
    description:
      - The other nodes of a multi-node server (SGLang's C(--nnodes)), each with its C(name) (used in
        the messages) and C(address) (what its engine connects from, or node 0's address on the other
        nodes). Requires I(peer_port).
      - Their engines keep TCP connections to node 0's dist-init port (torch's store) for the life
        of the group. A node never seen connected has not joined (the others wait in the
        rendezvous); a node whose connections all closed has left, and the nodes left behind wait in
        a collective that cannot complete - C(failed), naming the node, at the next look.
    type: list
    elements: dict
    suboptions:
      name:
        description: The node's name (its inventory name).
        type: str
        required: true
      address:
        description: Its address (an IP address or a name this host resolves).
        type: str
        required: true
  peer_port:
    description:
      - The group's dist-init port (the port of SGLang's C(--dist-init-addr)). Required with I(peers).
    type: int
  hold_file:
    description:
      - The unit's maintenance hold (C(/etc/modelwake/hold/<unit>.json), written by C(playbooks/hold.yml)).
        The look reports it as I(hold); it changes nothing in the wait or its verdict.
    type: path
  engine_version:
    description:
      - The engine's version, as the host's record of starts keeps it - earlier starts count as usual
        only with the same unit, model and engine version. Default is the version of the unit's
        newest record.
    type: str
  history:
    description:
      - The host's record of this unit's starts (one JSON line per start, docs/operating.md "Start
        history") - the usual phase durations, the whole start's ETA, "slower than usual" and the
        C(auto) budgets come from it.
      - C(auto) is C(/var/lib/modelwake/<unit>/starts.jsonl) with I(unit) (none with I(pid)); C(off)
        reads and writes none; an absolute path names the file (its directory must exist).
      - The wait adds the start it watched to the record only where no modelwake launcher runs the
        server (whose launcher records its own starts), only when it saw the start from its beginning,
        and only once per start (systemd's InvocationID).
    type: str
    default: auto
  fleet_hosts:
    description:
      - Inventory names of the hosts whose waits this one task follows, on a task with C(run_once) - each
        host's own arguments (the task templated with its variables) over its own connection, all at once.
      - Without it, Ansible runs a wait per host in a worker that the wait holds until its verdict, so
        with more hosts than C(forks) the last hosts are looked at only once the first are ready.
      - The task's result is C(hosts) (per host, what the task returns for one host) and C(msg) (how many
        ended how). It never fails itself (a failed C(run_once) task fails every host), so a task after it
        judges each host, e.g. C(ansible.builtin.fail) when C(result.hosts[inventory_hostname]) is failed.
      - Handled by the action plugin; the module ignores it.
    type: list
    elements: str
  _follow:
    description:
      - Internal; set only by this module's action plugin, which prints progress while it waits. The
        module checks its input, leaves the wait to a detached process of its own and returns; the
        plugin follows that process over the connection. Never set it in a task.
    type: dict
    suboptions:
      interval:
        description: Seconds between two reads of the wait's progress by the controller.
        type: float
        required: true
notes:
  - Supports check mode. The module only observes, so it runs normally in check mode.
  - The task fails unless the phase is C(ready); with I(timeout=0) it never fails on the phase.
  - Progress means any of - CPU time of the tree above 0.05 cores, 1 MiB more read from disk,
    64 MiB change of GPU memory, new log lines (not hang-time chatter), a changed process tree,
    phase, HTTP answer or systemd status text. GPU utilisation is not progress; a hung NCCL
    collective keeps the GPUs at 100 %.
  - CPU is progress only while it goes to code that moves - when the stacks are read, a busy
    process whose Python frames have not changed and that touched no new memory (fewer than 256
    page faults) since is spinning, as ranks do in a hung collective; its CPU does not count.
seealso:
  - module: ansible.builtin.wait_for
  - module: ansible.builtin.uri
attributes:
  check_mode:
    description:
      - It only observes. In check mode it looks once (as with I(timeout=0)) and returns the current
        phase - a play in check mode started nothing, so there is nothing to wait for.
    support: full
  diff_mode:
    description: Nothing to compare, it changes nothing.
    support: none
"""

EXAMPLES = r"""
- name: Wait until K2.6 answers a completion
  modelwake.serving.wait_for_model_ready:
    url: http://127.0.0.1:30001
    engine: sglang
    unit: sglang-k26.service
    model_path: /root/models/Kimi-K2.6
    api_key: "{{ vault_k26_api_key }}"
    timeout: 3600
    stall_timeout: 600

- name: Tell the phase of a vLLM server started by hand, without waiting
  modelwake.serving.wait_for_model_ready:
    url: http://127.0.0.1:8000
    engine: vllm
    pid: "{{ vllm_pid }}"
    log_path: /var/log/vllm.log
    timeout: 0
  register: model_service_phase

- name: Wait for the health endpoint only, on GPUs 0-3
  modelwake.serving.wait_for_model_ready:
    url: http://127.0.0.1:30001
    unit: sglang-small.service
    ready_check: health
    gpus: [0, 1, 2, 3]
    progress_path: /var/lib/modelwake/sglang-small.progress.jsonl
"""

RETURN = r"""
phase:
  description: The phase at the end - not_started, starting, loading, initializing, ready, failed, stalled or timeout.
  returned: always
  type: str
  sample: ready
elapsed:
  description: Seconds the module waited.
  returned: always
  type: int
  sample: 912
msg:
  description: What happened, since when, and on what evidence.
  returned: always
  type: str
  sample: "stalled: no progress for 600 s in phase loading (last progress: read_bytes +12.0 MiB at +301 s; process 4242 state T (stopped))"
phases:
  description: The phases seen, with start and duration in seconds since the module started.
  returned: always
  type: list
  elements: dict
  sample: [{"phase": "loading", "start": 0.0, "duration": 640.2}, {"phase": "initializing", "start": 640.2, "duration": 270.0}]
evidence:
  description: Log lines that justify the verdict; for a crash the root-cause exception first, then the tail of its traceback.
  returned: always
  type: list
  elements: str
  sample: ["(Worker pid=7) ERROR SafetensorError: Error while deserializing header: incomplete metadata"]
rule:
  description:
    - The terminal rule that ended the wait (docs/readiness.md, "What ends a wait"), for example C(rank_died),
      C(fatal_log_line) or C(stalled); empty for C(ready) and the phases of a wait still going.
  returned: always
  type: str
  sample: rank_died
bytes_read:
  description: Bytes the server's processes read from disk (read_bytes of the whole tree), null when unreadable.
  returned: always
  type: int
  sample: 588410961920
read_rate:
  description: Disk read rate over the last minute, bytes per second, or null.
  returned: always
  type: float
  sample: 602931200.0
fraction:
  description: Share of the weights loaded (shards from the engine's progress bar, else bytes against I(model_path)), or null.
  returned: always
  type: float
  sample: 0.45
eta:
  description: Estimated seconds until loading ends, or null.
  returned: always
  type: float
  sample: 421.0
shards:
  description: The engine's shard progress [n, N], or null.
  returned: always
  type: list
  elements: int
  sample: [29, 64]
gpu:
  description: Watched GPUs at the last look.
  returned: always
  type: list
  elements: dict
  sample: [{"index": 0, "memory_used_mib": 77824, "utilization": 0}]
restarts:
  description: How often the unit restarted during the wait (NRestarts increase).
  returned: always
  type: int
  sample: 0
pid:
  description: The watched process (I(pid), or the unit's MainPID).
  returned: always
  type: int
  sample: 4242
engine:
  description: The engine whose markers applied (auto until the log told).
  returned: always
  type: str
  sample: sglang
since:
  description: When the current phase began, seconds since the module started.
  returned: always
  type: float
  sample: 640.2
last_progress:
  description: When the last progress was seen and what it was.
  returned: always
  type: dict
  sample: {"t": 905.0, "what": "CPU 1.80 cores"}
stacks:
  description:
    - The Python stacks of the server's processes at the latest read, when it is recent (empty
      otherwise, and without py-spy) - per process its pid, name, rank (when its title tells),
      state, the thread shown, C(same_for) (seconds its stack has not changed at all),
      C(in_function_for) (seconds in its innermost function) and the innermost frames, innermost first.
  returned: always
  type: list
  elements: dict
  sample: [{"pid": 4301, "name": "sglang::scheduler_TP0", "rank": 0, "state": "R", "thread": "MainThread",
            "same_for": 2.0, "in_function_for": 40.0, "frames": [{"function": "repack_marlin_weights", "file": "marlin.py", "line": 211}]}]
where:
  description: The ranks' stacks in one line, ranks in the same function grouped (empty without them).
  returned: always
  type: str
  sample: "TP0-6 in all_reduce (parallel_state.py:512) for 10m00s; TP7 state T (stopped) in load_weights (loader.py:449)
    for 10m00s - the odd one out"
progress:
  description:
    - The last progress line the action plugin printed, without its host prefix, for a stdout callback
      that shows only results. Only when the wait was followed with live progress.
  returned: when followed
  type: str
  sample: "ready 16m40s | read 548.0 GiB / 548.0 GiB (100 %) at 575.0 MiB/s | shards 64/64 | GPU x8 612.0 GiB / 764.7 GiB"
cost:
  description:
    - What the wait cost the host in CPU seconds - C(startup_cpu_s) (the module's process - the interpreter,
      Ansible's wrapper, the input checks), C(looks_cpu_s) (the detached wait's own process, all its looks),
      C(gpu_read_cpu_s) (the GPU reads among them), C(programs_cpu_s) (programs it ran - journalctl,
      systemctl, py-spy, nvidia-smi) and C(looks), their number. Only when the wait was followed with live progress.
  returned: when followed
  type: dict
  sample: {"startup_cpu_s": 0.21, "looks": 25, "looks_cpu_s": 0.09, "gpu_read_cpu_s": 0.002, "programs_cpu_s": 0.0}
hold:
  description:
    - Who holds the unit under a maintenance hold, since when (UTC) and why, read from I(hold_file);
      null when it is not held. Only in a wait that runs inline (a look with I(timeout=0), or without live progress).
  returned: when hold_file is given
  type: dict
  sample: {"by": "alice", "since": "2026-12-04T23:30:00Z", "reason": "reseat NVLink bridge"}
stacks_unavailable:
  description: Why the latest read of the stacks got none (py-spy not installed, not permitted), or empty.
  returned: always
  type: str
  sample: "py-spy is not installed (looked next to the engine's interpreter (/opt/modelwake/venv/bin) and on PATH)"
bottleneck:
  description:
    - While loading runs far below the disk's measured cold rate (I(disk_read_rate)) - under a third of
      it for 30 s, with the bytes coming from the disk - that, its likely cause from the process
      tree's counters and the engine's option to try; empty otherwise.
  returned: always
  type: str
  sample: "loading at 575 MiB/s, 12x below this disk's 7.0 GB/s: page faults through mmap; vLLM:
    --safetensors-load-strategy eager (or --load-format fastsafetensors); or model_service_prefetch: on"
usual:
  description:
    - The usual duration in seconds of each phase (C(starting), C(loading), C(initializing)), medians of
      the host's latest earlier starts of this unit, model and engine version that became ready; null
      without any.
  returned: always
  type: dict
  sample: {"starting": 20.0, "loading": 960.0, "initializing": 660.0}
start_eta:
  description: Seconds until the whole start is ready, from the usual durations (the byte-based RV(eta) while loading), or null.
  returned: always
  type: float
  sample: 120.0
slower_than_usual:
  description: The current phase has run past 1.5 x its usual duration (said, not a failure).
  returned: always
  type: bool
  sample: false
last_start:
  description:
    - The unit's newest recorded start (this one, once recorded) - C(started_at) (seconds since the
      epoch), C(verdict), C(verdict_after) (seconds), C(engine_version), C(phases) (seconds each) and
      C(page_cache) (C(warm), C(cold) or null); null without a record.
  returned: when the start history is on
  type: dict
  sample: {"started_at": 1764892800.0, "verdict": "ready", "verdict_after": 1640.0, "engine_version": "0.5.4",
           "phases": {"starting": 20.0, "loading": 960.0, "initializing": 660.0}, "page_cache": "cold"}
budgets:
  description: How the C(auto) budgets were found, in one line.
  returned: when stall_timeout or timeout is auto
  type: str
  sample: "auto budgets from 3 earlier start(s): stall_timeout 11m00s (longest silence 6m40s x1.5 + 60s)"
source:
  description:
    - Where the weights come from while they arrive other than from the local disk, during
      C(starting) and C(loading); null otherwise.
    - I(kind) is C(download) (a hub download into the cache's C(.incomplete) files), C(stream) (reads
      from a socket, as the Run:ai model streamer makes) or C(infiniband) (bytes received by the host's
      HCAs, as an RDMA load from a peer brings them); I(bytes) since the wait began, I(rate) in bytes/s,
      I(file) the download's repository and file, I(expected) its total where known.
  returned: always
  type: dict
  sample: {"kind": "download", "bytes": 436207616, "rate": 31457280.0, "file": "org/k26 model-00003-of-00064.safetensors",
           "expected": null}
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.modelwake.serving.plugins.module_utils.readiness.config import (
    DEFAULT_STALL_TIMEOUT, DEFAULT_TIMEOUT, build_config)
from ansible_collections.modelwake.serving.plugins.module_utils.common.errors import ModelWakeError
from ansible_collections.modelwake.serving.plugins.module_utils.host.hold import read_hold
from ansible_collections.modelwake.serving.plugins.module_utils.readiness.probe import HostProbe
from ansible_collections.modelwake.serving.plugins.module_utils.readiness import follow
from ansible_collections.modelwake.serving.plugins.module_utils.readiness.start_memory import (
    module_memory, resolve_budgets)
from ansible_collections.modelwake.serving.plugins.module_utils.readiness.waiter import wait_for_ready

ARGUMENT_SPEC = dict(
    url=dict(type="str", required=True),
    engine=dict(type="str", choices=["sglang", "vllm", "auto"], default="auto"),
    unit=dict(type="str"),
    pid=dict(type="int"),
    log_path=dict(type="path"),
    ready_check=dict(type="str", choices=["completion", "health", "models"], default="completion"),
    model=dict(type="str"),
    api_key=dict(type="str", no_log=True),
    timeout=dict(type="raw", default=DEFAULT_TIMEOUT),
    stall_timeout=dict(type="raw", default=DEFAULT_STALL_TIMEOUT),
    poll_interval=dict(type="float", default=5),
    completion_timeout=dict(type="int", default=30),
    model_path=dict(type="path"),
    expected_bytes=dict(type="int"),
    disk_read_rate=dict(type="int"),
    tensor_parallel=dict(type="int", default=1),
    gpus=dict(type="list", elements="int"),
    progress_path=dict(type="path"),
    py_spy=dict(type="str", default="auto"),
    stacks_interval=dict(type="float", default=0),
    peers=dict(type="list", elements="dict", options=dict(name=dict(type="str", required=True),
                                                          address=dict(type="str", required=True))),
    peer_port=dict(type="int"),
    hold_file=dict(type="path"),
    engine_version=dict(type="str"),
    history=dict(type="str", default="auto"),
    fleet_hosts=dict(type="list", elements="str"),  # the action plugin's; never reaches the module
)

# Set only by the action plugin of the same name (plugins/action/wait_for_model_ready.py), which
# follows the wait from the controller (plugins/module_utils/readiness/follow.py): {"interval": s}.
INTERNAL_ARGUMENT_SPEC = dict(
    _follow=dict(type="dict", options=dict(interval=dict(type="float", required=True))),
)


def main():
    module = AnsibleModule(
        argument_spec=dict(ARGUMENT_SPEC, **INTERNAL_ARGUMENT_SPEC),
        supports_check_mode=True,  # it only observes; in check mode it looks once
    )
    # Popped, so the result's invocation is the same as without the action plugin.
    follow_options = module.params.pop("_follow")
    module.params.pop("fleet_hosts")
    # Checked here rather than by AnsibleModule, so that this failure too returns phase and elapsed.
    if (module.params["unit"] is None) == (module.params["pid"] is None):
        module.fail_json(msg="exactly one of unit and pid is required (got %s)" % (
            "both" if module.params["unit"] is not None else "neither"), phase="failed", elapsed=0)
    if module.check_mode:
        module.params["timeout"] = 0
    try:
        config = build_config(module.params)
        memory = module_memory(config, module.params["history"], module.params["engine_version"])
        config, budgets = resolve_budgets(config, memory)
        probe = HostProbe(config)
        if follow_options and config.timeout:
            # Checked input, a probe that found the server: the rest of the wait runs detached.
            module.exit_json(changed=False, _follow=follow.start(config, probe, follow_options["interval"],
                                                                 memory=memory, budgets=budgets))
        result = wait_for_ready(config, probe, memory=memory)
        if budgets:
            result["budgets"] = budgets
    except ModelWakeError as exc:
        module.fail_json(msg=str(exc), phase="failed", elapsed=getattr(exc, "elapsed", 0))
    # Through warn(): passing `warnings` to exit_json is deprecated in ansible-core 2.19.
    for warning in result.pop("warnings", []):
        module.warn(warning)
    if module.params["hold_file"]:
        hold = read_hold(module.params["hold_file"])
        result["hold"] = hold.as_dict() if hold is not None else None
    failed = result.pop("failed")
    if failed:
        module.fail_json(changed=False, **result)
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
