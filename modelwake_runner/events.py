"""ansible-runner's events, as the few JSON objects a pipeline follows a deploy by.

ansible-runner hands over every Ansible callback as an event (a dict: `event`, `event_data` with
`host`, `task`, `res`, ...). Of those this keeps what matters to someone waiting on model servers,
one object per line:

    {"event": "task_start", "host": "k26-1", "task": "Wait for the model service to be ready"}
    {"event": "task_end", "host": "k26-1", "task": "...", "status": "ok|changed|failed|skipped|unreachable"}
    {"event": "progress", "host": "k26-1", "unit": "sglang-k26.service", "phase": "loading", "elapsed": 95,
     "bytes_read": ..., "read_rate": ..., "eta": ..., "shards": [39, 64], "log_line": "...", "where": "...",
     "stacks": [...], "bottleneck": "loading at 575 MiB/s, 12x below ...", "line": "loading 1m35s | read ..."}
    {"event": "verdict", "host": "k26-1", "unit": "sglang-k26.service", "phase": "ready", "elapsed": 412,
     "msg": "...", "phases": [...], "evidence": {...}}
    {"event": "recap", "hosts": {"k26-1": {"ok": 63, "changed": 2, "failed": 0, ...}}}

A `progress` object is one look of wait_for_model_ready's live progress (its action plugin sends each
look as an async-poll callback, `runner_on_async_poll` here); a `verdict` is the end of one such wait
(or one look, for status). What ansible-runner censors for a no_log task stays censored: this reads
nothing else.

A playbook that never starts (no ansible-playbook to run, a playbook or option Ansible refuses)
gives no event of its own, only ansible-runner's or Ansible's text: why_not_started() turns that
text into the reason the `end` object carries.
"""
import os
import sys

WAIT_ACTION = "wait_for_model_ready"
# A look's keys a pipeline may want; the rest of the result (cost, internals) stays out.
LOOK_KEYS = ("unit", "phase", "elapsed", "bytes_read", "read_rate", "fraction", "eta", "shards", "gpu",
             "log_line", "where", "stacks", "stacks_unavailable", "since", "last_progress", "source",
             "usual", "start_eta", "slower_than_usual", "bottleneck")
# bottleneck: a load far below the disk's measured rate (docs/readiness.md, "Slow loads").
# usual, start_eta, slower_than_usual, last_start, budgets: the host's record of earlier starts (docs/operating.md).
VERDICT_KEYS = ("unit", "phase", "elapsed", "msg", "phases", "evidence", "where", "stacks", "restarts", "pid", "hold",
                "usual", "start_eta", "slower_than_usual", "last_start", "budgets", "bottleneck")
TASK_END = {"runner_on_ok": "ok", "runner_on_failed": "failed", "runner_on_skipped": "skipped",
            "runner_on_unreachable": "unreachable"}
ITEM_END = {"runner_item_on_ok": "ok", "runner_item_on_failed": "failed"}
RECAP_COUNTS = ("ok", "changed", "failures", "dark", "skipped", "rescued", "ignored")
RECAP_NAMES = {"failures": "failed", "dark": "unreachable"}
# The text kept from before the playbook started: enough for Ansible's error and its hint.
UNSTARTED_LINES = 10
# What ansible-runner says when it cannot execute the command it built.
NOT_FOUND = "The command was not found or was not executable"


def is_wait(data):
    action = data.get("resolved_action") or data.get("task_action") or ""
    return action.split(".")[-1] == WAIT_ACTION


def pick(source, keys):
    return dict((key, source[key]) for key in keys if source.get(key) is not None)


class Events(object):
    """Turns runner events into ours; keeps each host's and unit's latest verdict and the recap."""

    def __init__(self):
        self.verdicts = {}  # (host, unit) -> the verdict object last seen
        self.recap = None
        self.started = False  # whether the playbook itself ran (any event of a play, task or host)
        self.text_before_start = []  # what was printed before that: the reason it never started

    def translate(self, event):
        """The objects one runner event gives (often none)."""
        kind = event.get("event") or ""
        if kind.startswith(("playbook_on_", "runner_on_", "runner_item_on_")):
            self.started = True
        elif kind == "verbose" and not self.started and (event.get("stdout") or "").strip():
            lines = self.text_before_start + event["stdout"].strip().splitlines()
            self.text_before_start = lines[-UNSTARTED_LINES:]
        data = event.get("event_data") or {}
        host = data.get("host")
        if kind == "runner_on_start":
            return [{"event": "task_start", "host": host, "task": data.get("task")}]
        if kind == "runner_on_async_poll":
            res = data.get("res") or {}
            if not res.get("modelwake_look"):
                return []
            look = dict(pick(res, LOOK_KEYS), event="progress", host=host, task=data.get("task"))
            if res.get("progress"):
                look["line"] = res["progress"]
            return [look]
        if kind in TASK_END:
            res = data.get("res") or {}
            status = TASK_END[kind]
            if status == "ok" and res.get("changed"):
                status = "changed"
            end = {"event": "task_end", "host": host, "task": data.get("task"), "status": status}
            if status == "failed":
                end["msg"] = res.get("msg")
                end["ignored"] = bool(data.get("ignore_errors"))
            objects = [end]
            if is_wait(data) and status != "skipped" and "results" not in res:
                objects.insert(0, self._verdict(host, data, res, failed=status == "failed"))
            return objects
        if kind in ITEM_END and is_wait(data):
            return [self._verdict(host, data, data.get("res") or {}, failed=kind == "runner_item_on_failed")]
        if kind == "playbook_on_stats":
            hosts = {}
            for count in RECAP_COUNTS:
                for name, value in (data.get(count) or {}).items():
                    hosts.setdefault(name, dict((RECAP_NAMES.get(c, c), 0) for c in RECAP_COUNTS))
                    hosts[name][RECAP_NAMES.get(count, count)] = value
            self.recap = hosts
            return [{"event": "recap", "hosts": hosts}]
        return []

    def _verdict(self, host, data, res, failed):
        verdict = dict(pick(res, VERDICT_KEYS), event="verdict", host=host, task=data.get("task"))
        if "phase" not in verdict:  # censored (no_log) or refused before any look
            verdict["phase"] = "failed" if failed else None
        self.verdicts[(host, res.get("unit"))] = verdict
        return verdict

    def why_not_started(self, rc):
        """Why the playbook never started, from ansible-runner's or Ansible's own words and the exit
        status; None when it started (its failures are then in the events) or ended well."""
        if self.started or rc == 0:
            return None
        said = " ".join(line.strip() for line in self.text_before_start if line.strip())
        if NOT_FOUND in said or rc == 127:
            here = os.path.dirname(sys.executable)
            return ("ansible-playbook did not start (%s): it is looked for beside this Python (%s), then on PATH. "
                    "Run the toolchain's Python, .venv/bin/python -m modelwake_runner, from the checkout "
                    "(make venv creates .venv)" % (said or "exit status %s" % rc, here))
        return "the playbook did not start (exit status %s): %s" % (rc, said or "ansible-playbook printed nothing")

    def all_ready(self):
        """Whether the run ended with every host reachable and failing nothing, and every wait's
        last verdict for a host and unit `ready`."""
        if not self.recap:
            return False
        if any(counts["failed"] or counts["unreachable"] for counts in self.recap.values()):
            return False
        return all(verdict.get("phase") == "ready" for verdict in self.verdicts.values())
