# Copyright: (c) modelwake contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action plugin for wait_for_model_ready: live progress on the controller while it waits.

A module cannot print while it runs: Ansible shows its result when it ends, so a 20-minute start
would be 20 minutes of silence. This plugin, which Ansible picks for every task that uses the
module (same name), starts the module once: it checks its input and leaves the wait to a detached
process on the host, which writes its latest look to a 0600 file (plugins/module_utils/readiness/
follow.py). Every `modelwake_progress_interval` seconds (default 25) the plugin reads that file with
one shell command, which returns at once when the wait ends, and prints one line per host, without -v:

    wait_for_model_ready [k26-1]: loading 1m40s | read 1.2 GiB / 2.0 GiB (61 %) at 50.0 MiB/s |
    shards 39/64 | ETA 16s | GPU x8 240.0 GiB / 764.7 GiB | log: Loading safetensors checkpoint ...

The final result is the one a single long call returns (same keys, `elapsed` from the true start,
all phases), plus `progress`: the last line, for a stdout callback that prints only results, and
`unit`, the unit waited on. The lines go to stdout with the default callback and to stderr with any
other, so that a machine-readable stdout (the json callback) stays intact. With any other callback
each look is also a structured event: the `v2_runner_on_async_poll` callback that Ansible sends for a
background job it polls (which the wait is), with the look as its result (`modelwake_look: true`,
the line as `progress`). ansible-runner makes it a `runner_on_async_poll` event, so AWX and any
runner consumer follow the wait without reading text (modelwake_runner/cli.py). No following with
task-level `async` (the module then runs in the background as before) or with `modelwake_progress_interval: 0`; `timeout: 0`
and check mode look once and print nothing.
"""
from __future__ import annotations

import collections
import concurrent.futures
import fcntl
import hashlib
import json
import os
import shlex
import threading
import time

from ansible import constants as C
from ansible.errors import AnsibleConnectionFailure, AnsibleError
from ansible.plugins.action import ActionBase
from ansible.utils.display import Display
from ansible.utils.vars import merge_hash
from ansible_collections.modelwake.serving.plugins.module_utils.common.formatting import duration, size
from ansible_collections.modelwake.serving.plugins.module_utils.common.units import MIB
from ansible_collections.modelwake.serving.plugins.module_utils.common.atomic import replace_file
from ansible_collections.modelwake.serving.plugins.module_utils.readiness import fleet
from ansible_collections.modelwake.serving.plugins.module_utils.readiness.follow import (
    CLEANUP_COMMAND, FOLLOW_COMMAND, parse_read)
from ansible_collections.modelwake.serving.plugins.module_utils.readiness.history import usual_line
from ansible_collections.modelwake.serving.plugins.module_utils.readiness.status import source_words
from ansible_collections.modelwake.serving.plugins.plugin_utils.host_actions import host_action

display = Display()

# Seconds between two reads of the wait's progress: a line at least every 30 s with the read's own
# round trip. A read is one shell command on the host (a few ms of CPU), not a Python start.
DEFAULT_PROGRESS_INTERVAL = 25
INTERVAL_VAR = "modelwake_progress_interval"
# Callbacks whose stdout is for people: progress lines go there; with any other, to stderr.
HUMAN_CALLBACKS = ("default", "ansible.builtin.default", "minimal", "ansible.builtin.minimal",
                   "oneline", "ansible.builtin.oneline", "yaml", "community.general.yaml",
                   "dense", "community.general.dense", "debug", "community.general.debug")


def progress_line(host, result, info):
    """One line about one host's wait, from a look's result and its progress info."""
    parts = ["%s %s" % (result.get("phase"), duration(result.get("elapsed") or 0))]
    read, expected = result.get("bytes_read"), info.get("expected_bytes")
    if read is not None:
        text = "read %s" % size(read)
        if expected:
            # Of the weights: readahead and imports can read more than the model; that is 100 %.
            text += " / %s (%d %%)" % (size(expected), min(100, int(100.0 * read / expected)))
        if result.get("read_rate") is not None:
            text += " at %s/s" % size(result["read_rate"])
        parts.append(text)
    if result.get("source"):
        parts.append(source_words(result["source"]))  # weights from the network: a download, a stream
    if result.get("bottleneck"):
        parts.append(result["bottleneck"])  # a load far below the disk's measured rate, and what to try
    if result.get("shards"):
        parts.append("shards %d/%d" % tuple(result["shards"]))
    if result.get("eta") is not None:
        parts.append("ETA %s" % duration(result["eta"]))
    gpus = result.get("gpu") or []
    used = [g.get("memory_used_mib") for g in gpus if g.get("memory_used_mib") is not None]
    if used:
        text = "GPU x%d %s" % (len(gpus), size(sum(used) * MIB))
        if info.get("gpu_total_mib"):
            text += " / %s" % size(info["gpu_total_mib"] * MIB)
        parts.append(text)
    if result.get("where"):
        parts.append(result["where"])  # the ranks' stacks, read during a silent phase
    if result.get("usual"):
        # The host's earlier starts: `usual: loading 16m00s, initializing 11m00s | ~2m00s left`.
        in_phase = max(0.0, (result.get("elapsed") or 0) - (result.get("since") or 0))
        parts.append(usual_line(result["usual"], result.get("phase"), in_phase, result.get("eta")))
    if info.get("log_line"):
        parts.append("log: %s" % info["log_line"])
    return "wait_for_model_ready [%s]: %s" % (host, " | ".join(parts))


def progress_interval(value):
    """Seconds between progress lines from the variable's value: a number of seconds, 0 for no progress lines."""
    if value is None:
        return DEFAULT_PROGRESS_INTERVAL
    try:
        interval = float(value)
    except (TypeError, ValueError):
        interval = -1
    if interval < 0:
        raise AnsibleError("%s must be a number of seconds (0 turns live progress off), got %r"
                           % (INTERVAL_VAR, value))
    return interval


def lines_to_stderr(callback=None):
    """Whether progress lines must stay off stdout: the stdout callback is not one for people."""
    callback = callback if callback is not None else C.DEFAULT_STDOUT_CALLBACK
    return callback not in HUMAN_CALLBACKS


def ended_without_verdict(state, data, follow):
    """The result of a wait whose process on the host ended before it wrote its verdict."""
    last = (data or {}).get("result") or {}
    elapsed = last.get("elapsed", 0)
    if state == "rebooted":
        msg = ("failed: the host rebooted during the wait (boot id %s): the server start it watched is gone"
               % follow.get("boot_id"))
    elif data is None:
        msg = "failed: the wait's file on the host (%s) is gone: its temporary files were cleaned" % follow["path"]
    else:
        msg = ("failed: the wait's process on the host (pid %s) ended without a verdict (killed?), in phase %s"
               % (follow["pid"], last.get("phase")))
    return dict(last, failed=True, phase="failed", msg=msg, elapsed=elapsed)


class Gap(object):
    """A host that stopped answering during its wait (a dropped SSH connection, a network cut). The wait
    goes on on the host by itself, so the gap judges nothing: the controller looks again every interval
    until the host answers, and gives it up as unreachable only once the wait's own budget is spent,
    when the host's wait has its verdict in any case."""

    def __init__(self, began, budget_left, interval):
        self.began = began
        self.give_up_at = began + max(budget_left, 0) + interval
        self.interval = interval
        self.said = False  # its line said once (on a fleet's board, where the fleet's line counts it after)

    def line(self, host, now, error):
        first = (str(error).strip().splitlines() or ["no answer"])[0]
        return ("wait_for_model_ready [%s]: unreachable for %s (%s); the wait goes on on the host, looked at "
                "again every %s" % (host, duration(now - self.began), first[:160], duration(self.interval)))

    def over(self, now):
        return now >= self.give_up_at

    def answered_line(self, host, now, restarted):
        text = "wait_for_model_ready [%s]: answering again after %s" % (host, duration(now - self.began))
        if restarted:
            # Its lease ran out (no reads for that long): it ended itself, and a new one looks from now.
            text += "; the wait had ended itself without its controller, a new one looks from now"
        return text


class FleetBoard(object):
    """Where one task's waits meet on the controller once it waits on more than fleet.LINES_PER_HOST_UP_TO
    hosts: each worker writes its host's latest look into a directory of Ansible's local temporary
    directory (made before the workers fork, removed when ansible-playbook ends), and whichever worker
    finds the fleet's line due prints it, so one summary line per interval reaches the screen, not one
    line per host."""

    def __init__(self, task_uuid, batch, interval, root=None):
        # Per batch too: a play with `serial` runs the same task (the same uuid) again for the next wave.
        wave = hashlib.sha1(",".join(sorted(batch)).encode("utf-8")).hexdigest()[:12]
        self.directory = os.path.join(root or C.DEFAULT_LOCAL_TMP, "modelwake-fleet-%s-%s" % (task_uuid, wave))
        self.batch = list(batch)
        self.interval = interval
        os.makedirs(self.directory, exist_ok=True)

    def post(self, key, look):
        """This host's latest look (or its verdict): its phase and message."""
        name = key.replace("/", "_") + ".json"
        replace_file(os.path.join(self.directory, name),
                     json.dumps({"key": key, "phase": look.get("phase"), "msg": look.get("msg")}), mode=0o600)

    def looks(self):
        found = {}
        for name in os.listdir(self.directory):
            if name.endswith(".json"):
                try:
                    with open(os.path.join(self.directory, name)) as handle:
                        look = json.load(handle)
                except (OSError, ValueError):
                    continue  # being replaced: the next line has it
                found[look["key"]] = look
        return found

    def line_if_due(self, now=None):
        """The fleet's line when the last one is an interval old (or every host of the batch has its
        verdict), else None. Workers take turns under a lock, so the line is said once per interval."""
        now = time.time() if now is None else now
        with open(os.path.join(self.directory, ".said"), "a+") as said:
            fcntl.flock(said, fcntl.LOCK_EX)
            said.seek(0)
            last = float(said.read() or 0)
            looks = self.looks()
            host_of = dict((key, key.split("/", 1)[0]) for key in looks)
            hosts = set(host_of.values())
            ended = [key for key, look in looks.items() if look.get("phase") in fleet.ENDED]
            everyone_ended = len(ended) == len(looks) and hosts >= set(self.batch)
            if now - last < self.interval and not everyone_ended:
                return None
            if everyone_ended and last < 0:
                return None  # the last line is said already
            said.seek(0)
            said.truncate()
            said.write("-1" if everyone_ended else "%f" % now)
        # A host is named by its name; by its unit too where it waits on more than one.
        per_host = collections.Counter(host_of.values())
        named = dict((key if per_host[host_of[key]] > 1 else host_of[key], look) for key, look in looks.items())
        return fleet.summary_line(named, not_looked=len(set(self.batch) - hosts))


def look_callback(host, task, look):
    """Hand one look to the controller's callbacks as Ansible hands an async job's poll: a
    v2_runner_on_async_poll callback from this worker process. Returns whether it was sent.

    The worker's queue to the controller's main process is the one its display already uses; the
    types are ansible-core 2.19's own. Where they differ (another ansible-core), only the line is left.
    """
    final_queue = getattr(display, "_final_q", None)
    if final_queue is None:
        return False
    try:
        from ansible.executor.task_queue_manager import CallbackSend  # pylint: disable=import-outside-toplevel
        from ansible.executor.task_result import _WireTaskResult  # pylint: disable=import-outside-toplevel
        final_queue.put(CallbackSend(method_name="v2_runner_on_async_poll", wire_task_result=_WireTaskResult(
            host_name=host, task_uuid=task._uuid, return_data=look, task_fields=task.dump_attrs())))
    except (ImportError, TypeError, AttributeError) as exc:
        display.vvv("wait_for_model_ready [%s]: no structured progress event: %s" % (host, exc))
        return False
    return True


def with_phase(reply):
    """The module's reply, with the phase and elapsed its RETURN docs promise on every failure.

    The module sets them itself; a failure before its code runs (AnsibleModule refusing an option's
    type, no Python on the host) has neither: it failed at once.
    """
    if reply.get("failed") and "phase" not in reply:
        reply = dict(reply, phase="failed", elapsed=0)
    return reply


def fleet_summary(results):
    """The fleet task's own message: how many hosts ended how, the bad ones named."""
    counts = collections.Counter(r.get("phase") or ("unreachable" if r.get("unreachable") else "failed")
                                 for r in results.values())
    bad = sorted(host for host, r in results.items() if r.get("phase") != "ready")
    words = ", ".join("%d %s" % (counts[phase], phase) for phase in sorted(counts))
    return "%s%s" % (words, ": not ready: %s" % ", ".join(bad) if bad else "")


# Ansible builds a module's payload (its module_utils found, zipped, cached) with caches that are not
# made for threads: a fleet wait builds one host's at a time. Sending and running it are in parallel.
_BUILD_LOCK = threading.Lock()


class ActionModule(ActionBase):

    _supports_check_mode = True  # the module only observes: check mode runs it as usual
    _supports_async = True
    fleet_member = False  # one host's wait of a fleet_hosts task (_run_fleet): its verdict is said as it comes

    def _configure_module(self, *args, **kwargs):
        with _BUILD_LOCK:
            return super(ActionModule, self)._configure_module(*args, **kwargs)

    def run(self, tmp=None, task_vars=None):
        task_vars = task_vars or {}
        fleet_hosts = self._task.args.get("fleet_hosts")
        if fleet_hosts is not None:
            return self._run_fleet(fleet_hosts, task_vars)
        result = super(ActionModule, self).run(tmp, task_vars)
        del tmp  # no longer has any effect
        interval = progress_interval(self._templar.template(task_vars.get(INTERVAL_VAR)))
        wrap_async = self._task.async_val and not self._connection.has_native_async
        if self._task.async_val or not interval:
            # One call, as without this plugin: async_status polls a background wait.
            result = merge_hash(result, with_phase(self._execute_module(task_vars=task_vars, wrap_async=wrap_async)))
            if not wrap_async:
                self._remove_tmp_path(self._connection._shell.tmpdir)
            return self._with_unit(result)
        host = task_vars.get("inventory_hostname", "?")
        try:
            def start_wait():
                return self._execute_module(module_args=dict(self._task.args, _follow={"interval": interval}),
                                            task_vars=task_vars)
            reply = start_wait()
            follow = reply.pop("_follow", None)
            if follow:
                batch = task_vars.get("ansible_play_batch") or [host]
                board = (FleetBoard(self._task._uuid, batch, interval) if len(batch) > fleet.LINES_PER_HOST_UP_TO
                         else None)
                reply = self._follow(host, follow, interval, board, start_wait)
        finally:
            self._remove_tmp_path(self._connection._shell.tmpdir)
        return self._with_unit(merge_hash(result, with_phase(reply)))

    def _run_fleet(self, names, task_vars):
        """fleet_hosts: this one task follows the wait of every host named, each over its own connection, so no
        host's wait queues behind `forks` others. Returns {"hosts": {name: that host's result}}, never failed
        itself: a run_once task that fails fails every host, and each host's verdict is its own."""
        if not self._task.run_once:
            raise AnsibleError("fleet_hosts needs run_once: true on the task (one task follows every host's wait); "
                               "without it each host would follow them all")
        if not isinstance(names, list) or not all(isinstance(name, str) for name in names):
            raise AnsibleError("fleet_hosts must be a list of inventory host names, got %r" % (names,))

        def run_one(bound):
            try:
                return bound.action.run(task_vars=bound.task_vars)
            except AnsibleConnectionFailure as exc:
                return {"unreachable": True, "failed": True, "msg": "unreachable: %s" % exc}
            except AnsibleError as exc:
                return {"failed": True, "phase": "failed", "elapsed": 0, "msg": str(exc)}
            finally:
                try:
                    bound.action._connection.close()
                except Exception:  # pylint: disable=broad-except
                    pass

        names = list(dict.fromkeys(names))  # in order, each once
        results, running = {}, {}
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, len(names))) as pool:
            for name in names:
                # Set up here, one host after the other; each wait starts as soon as its host is set up.
                try:
                    bound = host_action(self, name, task_vars, drop_args=("fleet_hosts",))
                except AnsibleError as exc:
                    results[name] = {"failed": True, "phase": "failed", "elapsed": 0,
                                     "msg": "the wait could not be set up for %s: %s" % (name, exc)}
                    continue
                bound.action.fleet_member = True
                running[name] = pool.submit(run_one, bound)
            for name, future in running.items():
                results[name] = future.result()
        results = dict((name, results[name]) for name in names)
        return {"changed": False, "hosts": results, "msg": fleet_summary(results)}

    def _with_unit(self, result):
        """The unit waited on, beside the verdict: which of a host's services a verdict is about."""
        unit = self._task.args.get("unit")
        if unit and "unit" not in result:
            result = dict(result, unit=unit)
        return result

    def _look_event(self, host, look, line, job):
        """One look as a structured event, for a stdout callback that is not for people."""
        data = self._with_unit(dict(look, modelwake_look=True, ansible_job_id=job, started=1, finished=0))
        data.pop("failed", None)
        if line:
            data["progress"] = line.split(": ", 1)[1]
        look_callback(host, self._task, data)

    def _board_key(self, host):
        unit = self._task.args.get("unit")
        return "%s/%s" % (host, unit) if unit else host

    def _to_board(self, board, host, look, to_stderr):
        """Post a look and say the fleet's line when due. The board is for the screen only: a wait never fails
        for it. Under no_log it holds no cause and, until the verdict, no phase: `waiting`, as the host's own
        line says."""
        phase = look.get("phase")
        if self._task.no_log and phase not in fleet.ENDED:
            phase = "waiting"
        try:
            board.post(self._board_key(host), {"phase": phase, "msg": None if self._task.no_log else look.get("msg")})
            line = board.line_if_due()
        except OSError as exc:
            display.vvv("wait_for_model_ready [%s]: no fleet line: %s" % (host, exc))
            return
        if line:
            display.display("wait_for_model_ready: %s" % line, stderr=to_stderr)

    def _read_gap(self, host, gap, error, interval, board, to_stderr):
        """A read that found no connection: say so (once per gap on a fleet's board, else every interval),
        wait out the interval, and return the gap; raise the connection's error once the gap is over."""
        now = time.monotonic()
        if gap.over(now):
            raise error
        if board is None or not gap.said:
            display.display(gap.line(host, now, error), stderr=to_stderr)
            gap.said = True
        if board is not None:
            self._to_board(board, host, {"phase": fleet.UNREACHABLE}, to_stderr)
        time.sleep(max(0.0, gap.began + interval * (1 + int((now - gap.began) / interval)) - now))
        return gap

    def _follow(self, host, follow, interval, board=None, start_wait=None):
        """Read the wait's file every interval until it holds the verdict; print a line each time, or with
        a board (a fleet), post the look there, print the fleet's line when due and this host's at its end.
        A host that stops answering is looked at again every interval (Gap); a wait that ended itself for
        lack of reads meanwhile is started again (start_wait: the module's first call)."""
        def commands(follow):
            """The read of this wait's file, its cleanup's words, the job's name in events."""
            quoted = dict((key, shlex.quote(str(value))) for key, value in follow.items())
            return (FOLLOW_COMMAND.format(interval=int(max(1, round(interval))), **quoted), quoted,
                    "modelwake-wait-%s" % follow.get("pid"))
        read, quoted, job = commands(follow)
        to_stderr = lines_to_stderr()
        line = None
        done = False
        budgets_said = False
        began = time.monotonic()
        gap = None
        try:
            while True:
                tried = time.monotonic()
                try:
                    answer = self._low_level_execute_command(read, sudoable=True)
                except AnsibleConnectionFailure as exc:
                    budget_left = float(follow.get("timeout") or 0) - (tried - began)
                    gap = self._read_gap(host, gap or Gap(tried, budget_left, interval), exc, interval, board,
                                         to_stderr)
                    continue
                state, data = parse_read(answer.get("stdout", ""), follow)
                if gap is not None:
                    # Its files gone with no reboot: the wait's lease ran out during the gap.
                    ended_itself = state == "gone" and data is None and start_wait is not None
                    display.display(gap.answered_line(host, time.monotonic(), ended_itself), stderr=to_stderr)
                    gap = None
                    if ended_itself:
                        reply = start_wait()
                        follow = reply.pop("_follow", None)
                        if not follow:
                            done = True  # the module's own answer: an input error, or a look's verdict
                            line = None
                            break
                        read, quoted, job = commands(follow)
                        began = time.monotonic()
                        continue
                if state == "done":
                    done = True
                    reply = data["result"]
                    line = progress_line(host, reply, data.get("info") or {})
                    break
                if state != "running":
                    done = True
                    reply = ended_without_verdict(state, data, follow)
                    break
                if not data:
                    continue
                if board is not None:
                    # A fleet: the look goes to the board and the structured events; the screen gets the fleet's line.
                    look = {"elapsed": data["result"].get("elapsed") or 0} if self._task.no_log else dict(
                        data["result"], log_line=(data.get("info") or {}).get("log_line"))
                    line = progress_line(host, data["result"], data.get("info") or {})
                    self._to_board(board, host, {"phase": data["result"].get("phase")}, to_stderr)
                    if to_stderr:
                        self._look_event(host, look, None if self._task.no_log else line, job)
                    continue
                if not budgets_said and (data.get("info") or {}).get("budgets"):
                    # The auto budgets' derivation: once, at the start of the wait.
                    budgets_said = True
                    display.display("wait_for_model_ready [%s]: %s" % (host, data["info"]["budgets"]), stderr=to_stderr)
                if self._task.no_log:
                    # The log line and the numbers are part of the result no_log hides.
                    line = "wait_for_model_ready [%s]: waiting, %s (details hidden: no_log)" % (
                        host, duration(data["result"].get("elapsed") or 0))
                    look = {"elapsed": data["result"].get("elapsed") or 0}
                else:
                    line = progress_line(host, data["result"], data.get("info") or {})
                    look = dict(data["result"], log_line=(data.get("info") or {}).get("log_line"))
                display.display(line, stderr=to_stderr)
                if to_stderr:
                    self._look_event(host, look, line, job)
        finally:
            # Interrupted (the connection lost, the play stopped): the wait must not go on looking
            # on the host for nobody. Best effort: without a connection, its lease ends it.
            cleanup = CLEANUP_COMMAND.format(**quoted)
            if not done:
                cleanup = "kill %s 2>/dev/null; %s" % (quoted["pid"], cleanup)
            try:
                self._low_level_execute_command(cleanup, sudoable=True)
            except Exception as exc:  # pylint: disable=broad-except
                display.vvv("wait_for_model_ready [%s]: could not clean up the wait's files: %s" % (host, exc))
        reply.setdefault("changed", False)
        if line and not self._task.no_log:
            reply["progress"] = line.split(": ", 1)[1]
        if (board is not None or self.fleet_member) and done:
            # This host's verdict, once (on a fleet's board, or in a fleet_hosts task, whose own result is one for
            # all hosts), and the fleet's line when it is due (or when this was the last verdict).
            if not self._task.no_log:
                said = line if reply.get("phase") == "ready" and line else "wait_for_model_ready [%s]: %s" % (
                    host, reply.get("msg"))
                display.display(said, stderr=to_stderr)
            if board is not None:
                self._to_board(board, host, reply, to_stderr)
        elif done and reply.get("phase") != "ready" and (self._task.retries or 0) > 0 and not self._task.no_log:
            # A wait retried on the next start (model_service_failed_start: retry): Ansible's retry line shows
            # no result, so each failed start's verdict is said here.
            display.display("wait_for_model_ready [%s]: %s" % (host, reply.get("msg")), stderr=to_stderr)
        return reply
