"""A fleet from one controller: one play waits on N hosts at once (bench/fleet.yml), N = 1, 8, 32, 128.

Each host is this machine over a local connection, with a simulated engine of its own (sglang, TP 1, one
scripted GPU); the last host's engine crashes while it loads (the host whose wait a fork queue reaches last),
the others start normally. What a host leaves
out: its own CPU, disk and network (every engine and wait shares this machine's cores, so the starts
stretch as N grows; the lags below are measured from each engine's own events, not from a schedule).

For N > 1 the play runs twice: a wait per host (each holds one of the `forks` workers until its verdict),
then one run_once task that follows every host's wait (`fleet_hosts`) and a task that judges each host.

Per N: the wall time until every healthy host's verdict reached the play, the lag from each host's true
event (its ready line, or the crashed engine's exit, stamped as they happen) to its verdict in the play
(the play's `ok:`/`fatal:` line for that host, stamped as it is read), the controller's CPU (ansible-playbook
and its forks, and the module's start on each host, which a local connection runs under the forks; the
detached waits on the hosts are not the controller's), its peak memory (the process tree's resident set,
sampled), and the output lines per minute. The checkout's ansible.cfg holds forks = 8.
"""
import os
import re
import subprocess
import sys
import tempfile
import threading
import time

from bench import simrun
from tests.helpers import ANSIBLE_PLAYBOOK, ROOT, free_port, poll
from tests.helpers.simharness import descendants

HERE = os.path.dirname(os.path.abspath(__file__))
COUNTS = (1, 8, 32, 128)
# A ~20 s start on a quiet machine: 1 s imports, the bench's 192 MiB model at 16 MiB/s, 5 s init, 1 s warm-up.
SIM_ARGS = ["--tp", "1", "--fake-gpus", "--fake-gpu-count", "1", "--disable-cuda-graph", "--start-seconds", "1",
            "--load-rate-mib", "16", "--init-seconds", "5", "--warmup-seconds", "1"]
CRASH_ARGS = ["--fault", "crash1:loading", "--fault-after", "3"]
POLL = 5.0  # the module's look interval: 128 waits looking once a second would take this machine's 2 cores
PROGRESS_INTERVAL = 10
VERDICT_LINE = re.compile(r"^(?P<verdict>ok|changed|fatal|failed): \[(?P<host>bench-fleet-\d+)\]")
# With one task following every wait, a host's verdict is its own line, said once as it comes.
ONE_TASK_VERDICT_LINE = re.compile(r"^wait_for_model_ready \[(?P<host>bench-fleet-\d+)\]: (?P<verdict>ready|failed|stalled|timeout)\b")
TARGET_LAG_S = 10.0


def _inventory(path, sims, model, gpu_dirs, one_task):
    lines = ["bench_fleet:", "  hosts:"]
    for index, sim in enumerate(sims):
        lines += ["    bench-fleet-%03d:" % index,
                  "      ansible_connection: local",
                  "      ansible_python_interpreter: %s" % sys.executable,
                  "      bench_fleet_url: %s" % sim.url,
                  "      bench_fleet_pid: %d" % sim.proc.pid,
                  "      bench_fleet_log: %s" % sim.log_path,
                  "      bench_fleet_model: %s" % model,
                  "      bench_fleet_gpu_dir: %s" % gpu_dirs[index],
                  "      bench_fleet_poll: %s" % POLL,
                  "      bench_fleet_one_task: %s" % ("true" if one_task else "false")]
    with open(path, "w") as handle:
        handle.write("\n".join(lines) + "\n")
    return path


class TreeMemory(object):
    """The peak of the summed resident set of a process and its descendants, sampled every half second."""

    def __init__(self, pid):
        self.pid = pid
        self.peak_kib = 0
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run)
        self.thread.daemon = True
        self.thread.start()

    def _run(self):
        while not self.done.wait(0.5):
            total = 0
            for pid in [self.pid] + descendants(self.pid):
                try:
                    with open("/proc/%d/status" % pid) as handle:
                        total += sum(int(line.split()[1]) for line in handle if line.startswith("VmRSS:"))
                except (OSError, ValueError, IndexError):
                    continue
            self.peak_kib = max(self.peak_kib, total)

    def stop(self):
        self.done.set()
        self.thread.join(5)


def run_level(count, model, work, env, crash=True, one_task=False):
    """Start `count` engines (the last one crashing while it loads, with `crash`), wait on them all in one
    play; the level's figures. The play's output is kept beside the engines' logs (play.log)."""
    base = tempfile.mkdtemp(prefix="fleet-%d-" % count, dir=work)
    sims, gpu_dirs, ports = [], [], set()
    try:
        for index in range(count):
            port = free_port()
            while port in ports:  # a port released by free_port() can come back for the next engine
                port = free_port()
            ports.add(port)
            gpu_dir = os.path.join(base, "gpu-%03d" % index)
            os.makedirs(gpu_dir)
            gpu_dirs.append(gpu_dir)
            args = SIM_ARGS + (CRASH_ARGS if crash and index == count - 1 else [])
            sims.append(simrun.SimRun("sglang", model, os.path.join(base, "engine-%03d.log" % index), args, port=port,
                                      env={"MODELWAKE_FAKE_GPU_DIR": gpu_dir}).start())
        inventory = _inventory(os.path.join(base, "hosts.yml"), sims, model, gpu_dirs, one_task)
        argv = [ANSIBLE_PLAYBOOK, "-i", inventory, os.path.join(HERE, "fleet.yml"),
                "-e", "modelwake_progress_interval=%d" % PROGRESS_INTERVAL]
        started = time.time()
        proc = subprocess.Popen(argv, cwd=ROOT, env=dict(os.environ, **env), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, universal_newlines=True)
        memory = TreeMemory(proc.pid)
        verdicts, lines = {}, 0
        log = open(os.path.join(base, "play.log"), "w")
        for line in iter(proc.stdout.readline, ""):
            lines += 1
            log.write(line)
            match = (ONE_TASK_VERDICT_LINE if one_task else VERDICT_LINE).match(line)
            if match and match.group("host") not in verdicts:
                verdicts[match.group("host")] = (time.time(), "ok" if match.group("verdict") == "ready" else match.group("verdict"))
        _pid, status, usage = os.wait4(proc.pid, 0)
        log.close()
        ended = time.time()
        memory.stop()
        if crash:
            poll(lambda: sims[-1].exit_time is not None, 15)  # the crashed engine's exit, stamped by its reaper
        lags, healthy_ends, crash_seen, not_ready = [], [], None, {}
        for index, sim in enumerate(sims):
            host = "bench-fleet-%03d" % index
            crashed = crash and index == count - 1
            truth = sim.exit_time if crashed else sim.first(simrun.READY_LINE["sglang"])
            seen = verdicts.get(host)
            if seen is None or truth is None:
                lag = None
            else:
                lag = round(seen[0] - truth, 1)
            if crashed:
                crash_seen = {"verdict": seen[1] if seen else None, "lag_s": lag}
            else:
                lags.append(lag)
                if seen:
                    healthy_ends.append(seen[0])
                if seen is None or seen[1] not in ("ok", "changed") or truth is None:
                    not_ready[host] = {"verdict": seen[1] if seen else None, "ready_line": truth is not None}
        measured = [lag for lag in lags if lag is not None]
        wall = ended - started
        cpu = usage.ru_utime + usage.ru_stime
        return {
            "hosts": count,
            "rc": os.waitstatus_to_exitcode(status),
            "wall_to_all_ready_s": round(max(healthy_ends) - started, 1) if healthy_ends else None,
            "healthy_lag_max_s": max(measured) if measured else None,
            "healthy_lag_median_s": sorted(measured)[len(measured) // 2] if measured else None,
            "healthy_not_ready": not_ready,  # a healthy host without ready in the play, or without its ready line
            "crash": crash_seen,
            "controller_cpu_s": round(cpu, 1),
            "controller_cores": round(cpu / wall, 2) if wall else None,
            "controller_peak_mib": round(memory.peak_kib / 1024.0, 1),
            "controller_mib_per_host": round(memory.peak_kib / 1024.0 / count, 1),
            "output_lines_per_min": round(lines / (wall / 60.0), 1) if wall else None,
            "play_s": round(wall, 1),
        }
    finally:
        for sim in sims:
            sim.stop()


def measure(model, work, env, counts=COUNTS):
    result = {"status": "not measured", "levels": [], "poll_s": POLL, "progress_interval_s": PROGRESS_INTERVAL,
              "sim_args": SIM_ARGS, "target_lag_s": TARGET_LAG_S}
    for count in counts:
        # One host alone twice, healthy and crashing: the lags the larger fleets are held to. A fleet: a wait
        # per host (the forks' queue), then one task following every host's wait (fleet_hosts).
        runs = ((False, False), (True, False)) if count == 1 else ((True, False), (True, True))
        for crash, one_task in runs:
            print("bench: fleet of %d%s%s" % (count, ", the last host crashing" if crash else "",
                                              ", one task following every wait" if one_task else ""), flush=True)
            result["levels"].append(dict(run_level(count, model, work, env, crash, one_task), crash_host=crash,
                                         one_task=one_task))
    result["status"] = "measured"
    return result
