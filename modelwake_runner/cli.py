"""`python -m modelwake_runner deploy|status|stop`: the project's playbooks through ansible-runner, their
events as JSON lines on stdout (modelwake_runner/events.py), for pipelines and scripts.

    python -m modelwake_runner deploy -i inventories/production -e modelwake_deploy_model=k26
    python -m modelwake_runner status -i inventories/production --limit k26-1

Exit status: deploy and status 0 when every host ended without a failure and every model service
waited on or looked at is ready, 1 otherwise; stop 0 when the play succeeded; 2 for bad arguments.
The run's own files (ansible-runner's artifacts: every event, the whole output) stay in
--artifacts DIR when given, else in a temporary directory removed at the end. Nothing is printed
but the JSON lines: Ansible's human output is in the artifacts (stdout). When the playbook cannot
start at all (no ansible-playbook, an inventory or playbook Ansible refuses), the `end` object's
`error` and stderr say why.

The playbooks run with the Ansible installed beside this Python (`.venv/bin/ansible-playbook` for
`.venv/bin/python`), wherever PATH points: the interpreter's directory comes first on ansible-playbook's PATH.
"""
import argparse
import json
import os
import shutil
import sys
import tempfile

from modelwake_runner.events import Events

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLAYBOOKS = {
    "deploy": "deploy-k26.yml",
    "status": "playbooks/status.yml",
    "stop": "playbooks/stop.yml",
}
# Commands whose exit status is about the model services' readiness, not only the play's.
READINESS_COMMANDS = ("deploy", "status")


def build_parser():
    parser = argparse.ArgumentParser(prog="python -m modelwake_runner", description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=sorted(PLAYBOOKS), help="which playbook to run")
    parser.add_argument("-i", "--inventory", action="append", default=[],
                        help="inventory path (repeatable); default: the one in ansible.cfg (inventories/demo)")
    parser.add_argument("-e", "--extra-vars", action="append", default=[], metavar="KEY=VALUE|@FILE|JSON",
                        help="extra variables, as ansible-playbook takes them (repeatable)")
    parser.add_argument("--limit", help="hosts to run on (an Ansible pattern)")
    parser.add_argument("--artifacts", help="keep ansible-runner's private data directory here")
    return parser


def extra_vars(values, parser_error):
    """ansible-playbook's -e forms: KEY=VALUE, @FILE (JSON or YAML) and a JSON object."""
    merged = {}
    for value in values:
        if value.startswith("@"):
            import yaml  # pylint: disable=import-outside-toplevel
            try:
                with open(value[1:]) as handle:
                    loaded = yaml.safe_load(handle) or {}
            except (OSError, yaml.YAMLError) as exc:
                parser_error("-e %s: %s" % (value, exc))
        elif value.lstrip().startswith("{"):
            try:
                loaded = json.loads(value)
            except ValueError as exc:
                parser_error("-e: not a JSON object (%s): fix it, or give KEY=VALUE" % exc)
        elif "=" in value:
            key, _, val = value.partition("=")
            loaded = {key.strip(): val}
        else:
            parser_error("-e %r: give KEY=VALUE, @FILE or a JSON object" % value)
        if not isinstance(loaded, dict):
            parser_error("-e %s: not a mapping of variables" % value)
        merged.update(loaded)
    return merged


def emit(obj, out=sys.stdout):
    out.write(json.dumps(obj, sort_keys=True, default=str) + "\n")
    out.flush()


def path_with_interpreter_dir(path):
    """PATH with this interpreter's directory first: ansible-runner starts `ansible-playbook` from PATH,
    and the one that belongs to this Python (its venv's) is beside it, whether or not the caller's
    shell has the venv on PATH."""
    here = os.path.dirname(sys.executable)
    return os.pathsep.join([here] + [entry for entry in path.split(os.pathsep) if entry and entry != here])


def run_playbook(playbook, private_dir, inventories=(), extravars=None, limit=None, on_object=None,
                 timeout=None, env=None):
    """Run a playbook of this checkout through ansible-runner, its record kept in `private_dir`.
    Each of our objects goes to `on_object` as it comes; `env` adds to the environment ansible-playbook
    inherits from this process. Returns (ansible-runner's Runner, Events)."""
    import ansible_runner  # pylint: disable=import-outside-toplevel

    events = Events()

    def on_event(event):
        for obj in events.translate(event):
            if on_object:
                on_object(obj)
        return True  # keep ansible-runner's own record of the event in the artifacts

    os.makedirs(private_dir, exist_ok=True)
    envvars = dict(env or {}, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    envvars["PATH"] = path_with_interpreter_dir(envvars.get("PATH", os.environ.get("PATH", "")))
    runner = ansible_runner.run(
        private_data_dir=private_dir, project_dir=ROOT, playbook=os.path.join(ROOT, playbook),
        inventory=[os.path.abspath(path) for path in inventories] or None,
        extravars=extravars or None, limit=limit, envvars=envvars, timeout=timeout,
        quiet=True, event_handler=on_event)
    return runner, events


def run(command, inventories=(), extravars=None, limit=None, artifacts=None, out=sys.stdout):
    """Run one command's playbook; write our events to `out`; return the exit status."""
    private = artifacts or tempfile.mkdtemp(prefix="modelwake-run-")
    emit({"event": "start", "command": command, "playbook": PLAYBOOKS[command]}, out)
    try:
        runner, events = run_playbook(PLAYBOOKS[command], private, inventories, extravars, limit,
                                      on_object=lambda obj: emit(obj, out))
        if command in READINESS_COMMANDS:
            ok = runner.rc == 0 and events.all_ready()
        else:
            ok = runner.rc == 0
        # The last verdict of each host and unit, evidence included: a failed run's last line says why.
        verdicts = [events.verdicts[key] for key in sorted(events.verdicts, key=str)]
        end = {"event": "end", "status": runner.status, "rc": runner.rc, "ok": ok, "verdicts": verdicts}
        error = events.why_not_started(runner.rc)
        if error:
            end["error"] = error
            sys.stderr.write("python -m modelwake_runner %s: %s\n" % (command, error))
        emit(end, out)
        return 0 if ok else 1
    finally:
        if not artifacts:
            shutil.rmtree(private, ignore_errors=True)


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    return run(args.command, args.inventory, extra_vars(args.extra_vars, parser.error), args.limit, args.artifacts)
