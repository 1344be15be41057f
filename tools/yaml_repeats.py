#!/usr/bin/env python3
"""Find blocks written twice in the roles' and playbooks' YAML (the duplicate finders read no YAML).

Reads every task list - a role's tasks and handlers, the plays' pre_tasks, tasks, post_tasks and
handlers, and inside them block, rescue and always - and reports:
  - a task written twice: two tasks equal but for their names, of MIN_TASK_LINES lines or more;
  - a module call copied with small changes: two calls of one module that pass MIN_SHARED_ARGS or
    more arguments with the same values;
  - a run of WINDOW consecutive tasks equal but for their names, found in two places.
A call of an included task file or role is not compared: it is how a thing written once is used.
What is written once and used twice belongs in an included task file, a loop or module_defaults.

    tools/yaml_repeats.py [ROOT]     exit status 1 and one line per finding; 0 when there is none
"""
import glob
import os
import sys

import yaml

MIN_TASK_LINES = 4
MIN_SHARED_ARGS = 5
WINDOW = 3
# The files that hold task lists, relative to the repository root.
TASK_FILE_PATTERNS = (
    "roles/*/tasks/*.yml",
    "roles/*/handlers/*.yml",
    "playbooks/*.yml",
    "playbooks/tasks/*.yml",
    "deploy-k26.yml",
    "molecule/*/*.yml",
)
PLAY_TASK_LISTS = ("pre_tasks", "tasks", "post_tasks", "handlers")
# A call of an included task file or role is how a thing written once is used: never a repetition.
INCLUDES = {"include_tasks", "import_tasks", "include_role", "import_role"}
BLOCK_LISTS = ("block", "rescue", "always")
# Keywords of a task that are not its module (what ansible-core's Task and Block accept).
TASK_KEYWORDS = {
    "name", "when", "register", "loop", "loop_control", "vars", "tags", "notify", "listen",
    "changed_when", "failed_when", "delegate_to", "delegate_facts", "run_once", "become",
    "become_user", "become_method", "no_log", "check_mode", "diff", "ignore_errors",
    "ignore_unreachable", "until", "retries", "delay", "environment", "args", "module_defaults",
    "any_errors_fatal", "async", "poll", "throttle", "timeout", "connection", "collections",
    "debugger", "action", "local_action", "block", "rescue", "always",
} | {key for key in ("with_items", "with_dict", "with_list", "with_fileglob", "with_sequence")}


def task_lists(document):
    """The top-level task lists of one YAML file: a playbook's plays' lists, or the file itself."""
    if not isinstance(document, list):
        return []
    if any(isinstance(item, dict) and ("hosts" in item or "import_playbook" in item) for item in document):
        return [play[key] for play in document if isinstance(play, dict)
                for key in PLAY_TASK_LISTS if isinstance(play.get(key), list)]
    return [document]


def all_task_lists(tasks):
    """This list and every block, rescue and always list nested in it."""
    yield tasks
    for task in tasks:
        if isinstance(task, dict):
            for key in BLOCK_LISTS:
                if isinstance(task.get(key), list):
                    yield from all_task_lists(task[key])


def is_include(task):
    return isinstance(task, dict) and any(key.split(".")[-1] in INCLUDES for key in task)


def without_name(task):
    return dict((key, value) for key, value in task.items() if key != "name")


def normalised(task):
    """The task as text, without its name: equal texts are the same task."""
    if not isinstance(task, dict):
        return yaml.safe_dump(task)
    return yaml.safe_dump(without_name(task), sort_keys=True, default_flow_style=False)


def module_call(task):
    """(module, its arguments as a dict) of a task, or None for a block or free-form arguments."""
    if not isinstance(task, dict):
        return None
    modules = [key for key in task if key not in TASK_KEYWORDS]
    if len(modules) != 1 or not isinstance(task[modules[0]], dict):
        return None
    return modules[0], task[modules[0]]


def shared_arguments(first, second):
    return sorted(key for key in first if key in second
                  and yaml.safe_dump(first[key], sort_keys=True) == yaml.safe_dump(second[key], sort_keys=True))


def label(place):
    path, task = place
    return "%s (%s)" % (path, task.get("name", "unnamed") if isinstance(task, dict) else "?")


def read_task_lists(root):
    """(path relative to root, task list) of every task list of the project, in a stable order."""
    found = []
    for pattern in TASK_FILE_PATTERNS:
        for path in sorted(glob.glob(os.path.join(root, pattern))):
            with open(path) as handle:
                document = yaml.safe_load(handle)
            relative = os.path.relpath(path, root)
            for tasks in task_lists(document):
                found += [(relative, nested) for nested in all_task_lists(tasks)]
    return found


def findings(lists):
    """One line per repetition found in the (path, task list) pairs."""
    places = [(path, task) for path, tasks in lists for task in tasks if not is_include(task)]
    problems = []
    seen = {}
    for place in places:
        text = normalised(place[1])
        if len(text.splitlines()) >= MIN_TASK_LINES:
            if text in seen:
                problems.append("task written twice: %s and %s" % (label(seen[text]), label(place)))
            else:
                seen[text] = place
    calls = [(place, module_call(place[1])) for place in places]
    calls = [(place, call) for place, call in calls if call is not None]
    for index, (place, (module, args)) in enumerate(calls):
        for other, (other_module, other_args) in calls[index + 1:]:
            if module != other_module or normalised(place[1]) == normalised(other[1]):
                continue  # equal tasks are reported above (when long enough)
            shared = shared_arguments(args, other_args)
            if len(shared) >= MIN_SHARED_ARGS:
                problems.append("%s called twice with the same %s: %s and %s"
                                % (module, ", ".join(shared), label(place), label(other)))
    windows = {}
    for path, tasks in lists:
        for start in range(len(tasks) - WINDOW + 1):
            key = tuple(normalised(task) for task in tasks[start:start + WINDOW])
            if key in windows:
                problems.append("%d tasks in a row written twice: %s and %s"
                                % (WINDOW, label(windows[key]), label((path, tasks[start]))))
            else:
                windows[key] = (path, tasks[start])
    return problems


def main(argv):
    root = argv[1] if len(argv) > 1 else os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    problems = findings(read_task_lists(root))
    for problem in problems:
        print(problem)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
