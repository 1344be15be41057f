"""A machine-readable stdout callback for tests: the whole run as one JSON document at its end,
shaped like ansible.posix.json ({"plays": [{"tasks": [{"task": {"name"}, "hosts": {host: result}}]}],
"stats": {...}}). ansible-core ships none, and what it checks is generic: nothing else may write to
stdout while it is in use."""
import json

from ansible.plugins.callback import CallbackBase


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "stdout"
    CALLBACK_NAME = "results_json"

    def __init__(self, display=None):
        super().__init__(display)
        self.plays = []

    def v2_playbook_on_play_start(self, play):
        self.plays.append({"play": {"name": play.get_name()}, "tasks": []})

    def v2_playbook_on_task_start(self, task, is_conditional):
        self.plays[-1]["tasks"].append({"task": {"name": task.get_name()}, "hosts": {}})

    def _record(self, result, **extra):
        self.plays[-1]["tasks"][-1]["hosts"][result._host.get_name()] = dict(result._result, **extra)

    def v2_runner_on_ok(self, result):
        self._record(result)

    def v2_runner_on_failed(self, result, ignore_errors=False):
        self._record(result, failed=True)

    def v2_runner_on_skipped(self, result):
        self._record(result, skipped=True)

    def v2_runner_on_unreachable(self, result):
        self._record(result, unreachable=True)

    def v2_playbook_on_stats(self, stats):
        summary = dict((host, stats.summarize(host)) for host in sorted(stats.processed))
        self._display.display(json.dumps({"plays": self.plays, "stats": summary}, sort_keys=True, default=str))
