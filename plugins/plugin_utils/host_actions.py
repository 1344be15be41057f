# Copyright: (c) modelwake contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""One task's action for other hosts of the play, from the one worker that runs it (`run_once`).

Why: Ansible runs a task on at most `forks` hosts at a time, each in a worker that the task holds until
its host's result. A wait holds its worker for the whole start (minutes), so with more hosts than forks
the next hosts' waits queue behind the first ones: a fleet's last hosts are looked at only after the first
are ready. A wait that is only reads of a file on each host needs no worker per host: one worker opens each
host's connection and follows every wait at once (plugins/action/wait_for_model_ready.py, `fleet_hosts`).

Each host gets what its own worker would have: the task loaded again from its source and templated with
that host's variables (its arguments and `environment`), the host's connection with its options (user,
port, become) and the action plugin bound to both. This is what ansible-core's TaskExecutor does before it
runs an action (ansible/executor/task_executor.py, `_execute`); its steps are taken one by one here
because the action must not run yet. Connections are opened one after the other: the plugin loaders are
not made for threads.
"""
from __future__ import annotations

from ansible._internal._templating._engine import TemplateEngine
from ansible.errors import AnsibleError
from ansible.executor.task_executor import TaskExecutor
from ansible.playbook.play_context import PlayContext
from ansible.playbook.task import Task
from ansible.template import Templar


class HostAction(object):
    """An action bound to one host: run it with `action.run(task_vars=task_vars)`."""

    def __init__(self, name, action, task_vars):
        self.name = name
        self.action = action
        self.task_vars = task_vars


def _task_for(task, variable_manager, loader, drop_args):
    """The task loaded again from its source (the running one holds the first host's templated values),
    without the arguments in drop_args: they are the running task's, and are not templated again."""
    again = Task.load(task._ds, block=task._parent, role=task._role, variable_manager=variable_manager, loader=loader)
    again._uuid = task._uuid  # one task: its events, and the fleet's board, are keyed by it
    again.run_once = False
    for name in drop_args:
        again.args.pop(name, None)
    return again


def host_action(action, name, task_vars, drop_args=()):
    """The action plugin `action` (a running ActionBase) for host `name`: a HostAction. drop_args: the task's
    arguments that only the running action reads (e.g. the list of hosts, which would be templated again per
    host). Raises AnsibleError when the host's task or connection cannot be set up (a variable that does not
    template, an unknown connection plugin)."""
    hostvars = task_vars["hostvars"]
    variable_manager, loader = hostvars._variable_manager, hostvars._loader
    host = hostvars._inventory.get_host(name)
    if host is None:
        raise AnsibleError("%s is not a host of the inventory" % name)
    play = action._task.get_play()
    task = _task_for(action._task, variable_manager, loader, drop_args)
    variables = variable_manager.get_vars(play=play, host=host, task=task, include_hostvars=True,
                                          _hosts=task_vars.get("ansible_play_batch"),
                                          _hosts_all=task_vars.get("ansible_play_hosts_all"))
    templar = TemplateEngine(loader=loader, variables=variables)
    task.post_validate(templar=templar)

    base = PlayContext(play=play)
    # A password given on the command line (-k, -K) reaches the first host's play context only.
    base.password, base.become_pass = action._play_context.password, action._play_context.become_pass
    executor = TaskExecutor(host, task, variables, base, loader, action._shared_loader_obj, None, variable_manager)
    context = base.set_task_and_variable_override(task=task, variables=variables, templar=templar)
    context.post_validate(templar=templar)
    if not context.remote_addr:
        context.remote_addr = host.address
    context.update_vars(variables)
    executor._play_context = context
    kind = templar.template(variables["ansible_connection"]) if variables.get("ansible_connection") else task.connection
    connection = executor._get_connection(variables, templar, kind)
    executor._connection = connection
    executor._set_connection_options(variables, templar)
    task_vars_here = variables.copy()
    connection.update_vars(task_vars_here)
    templar.available_variables = task_vars_here
    connection._play_context = context.set_task_and_variable_override(task=task, variables=task_vars_here,
                                                                      templar=templar)
    bound = action._shared_loader_obj.action_loader.get(
        action._task.resolved_action or action._task.action, task=task, connection=connection,
        play_context=connection._play_context, loader=loader, templar=Templar._from_template_engine(templar),
        shared_loader_obj=action._shared_loader_obj)
    return HostAction(name, bound, task_vars_here)
