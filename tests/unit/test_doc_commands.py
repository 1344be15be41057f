"""The commands the README, docs/, the roles' READMEs and the playbooks' hints give run as written.

Each command is taken from the text (fenced sh blocks; inline `ansible-playbook ...`, `make ...`,
`.venv/bin/...`, `tools/...` and `python -m ...` spans; the hints the roles and playbooks print) and
checked against the checkout: every path it names exists, every make target is the Makefile's, every
option is one its program takes. Those that can run without test hosts do, from a new shell (a PATH
without the venv) that has done what the README says once: `. .venv/bin/activate`. `ansible-playbook`
runs with `--syntax-check`, the project's tools with `--help`; `ansible HOST -m MODULE` has its
module looked up with `ansible-doc`. So a renamed playbook, option, target or path fails here.
"""
import functools
import glob
import os
import re
import shlex
import subprocess

import pytest

from modelwake_runner import cli

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOCS = ["README.md"] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md"))) + \
    sorted(glob.glob(os.path.join(ROOT, "roles", "*", "README.md")))
HINT_SOURCES = sorted(glob.glob(os.path.join(ROOT, "roles", "*", "*", "*.yml")) +
                      glob.glob(os.path.join(ROOT, "playbooks", "*.yml")) + [os.path.join(ROOT, "deploy-k26.yml")])
# What the README tells a new shell to do once, before any of its commands.
ACTIVATE = ". .venv/bin/activate"
# A new shell's PATH: the system's directories, not the venv's.
NEW_SHELL_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

PROGRAMS = ("ansible-playbook", "ansible-doc", "ansible-galaxy", "ansible", "make", "molecule", "yamllint",
            "ansible-lint", "python", "python3", ".venv/bin/", "tools/")
INLINE = re.compile(r"`((?:ansible-playbook|ansible-doc|ansible-galaxy|ansible|make|molecule|yamllint|ansible-lint)"
                    r" [^`]+|(?:\.venv/bin/|tools/)[^`]+|python3? -m [^`]+)`")
FENCED = re.compile(r"^```(?:sh|bash|shell)\n(.*?)^```", re.S | re.M)
HINT = re.compile(r"((?:ansible-playbook|\.venv/bin/python -m modelwake_runner|python -m modelwake_runner) [^\"'(]+)")
# A placeholder the reader fills in: HOST, NAME..., <unit>, [--run -1], …, a|b alternatives.
PLACEHOLDER = re.compile(r"\b[A-Z]{2,}\b|<[^>]*>|\[|…|\\\||\|")
# Paths of the checkout a command may name; bench/out is what the bench writes.
CHECKOUT_DIRS = ("playbooks", "inventories", "tools", "tests", "bench", "roles", "molecule", "docs", "monitoring",
                 "engines", "deploy-k26.yml", "ansible.cfg", ".venv")
# Programs that start hosts, engines or tests: their names and paths are checked, they are not run.
NOT_RUN = ("make", "molecule", "yamllint", "ansible-lint")


def _relative(path):
    return os.path.relpath(path, ROOT) if os.path.isabs(path) else path


def split_line(line):
    """A command line's commands: split at `&&`, `;` and `|` outside quotes."""
    parts, current, quote = [], "", None
    i = 0
    while i < len(line):
        char = line[i]
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif line.startswith(" && ", i) or line.startswith(" ; ", i) or line.startswith(" | ", i):
            parts.append(current)
            current, i = "", i + (4 if line.startswith(" && ", i) else 3)
            continue
        current += char
        i += 1
    return [part.strip() for part in parts + [current] if part.strip()]


def split_shell(text):
    """The commands of a shell block: continuation lines joined, comments dropped, lists split."""
    commands = []
    for line in text.replace("\\\n", " ").splitlines():
        line = re.sub(r"\s{2,}#.*$", "", line).strip()
        if line and not line.startswith("#"):
            commands.extend(split_line(line))
    return commands


def documented_commands():
    """(where, command) for every command the docs and the hints give, in order."""
    found = []
    for path in DOCS:
        with open(os.path.join(ROOT, path)) as handle:
            text = handle.read()
        where = _relative(path)
        for block in FENCED.finditer(text):
            found.extend((where, command) for command in split_shell(block.group(1)))
        for span in INLINE.finditer(text):
            found.extend((where, command) for command in split_shell(span.group(1)))
    for path in HINT_SOURCES:
        with open(path) as handle:
            lines = [line for line in handle if not line.lstrip().startswith("#")]
        for line in lines:
            for hint in HINT.finditer(line.replace("{{ inventory_hostname }}", "demo-k26")):
                found.append((_relative(path), hint.group(1).strip()))
    unique = []
    for where, command in found:
        if program_words(command)[1][:1] and program_words(command)[1][0].startswith(PROGRAMS) \
                and (where, command) not in unique:
            unique.append((where, command))
    return unique



def program_words(command):
    """(the leading VAR=value assignments, the program and its arguments)."""
    argv = shlex.split(command)
    assignments = []
    while argv and re.match(r"^[A-Z_]+=", argv[0]):
        assignments.append(argv.pop(0))
    return assignments, argv


COMMANDS = documented_commands()


def has_placeholder(command):
    return bool(PLACEHOLDER.search(command))


def checkout_paths(argv):
    """The arguments that name a file of the checkout (not a placeholder, not what the bench writes)."""
    paths = []
    for index, arg in enumerate(argv):
        if index and argv[index - 1] == "-m":
            continue  # `python -m bench.run`: a module's name, not a path
        value = arg.split("=", 1)[-1] if arg.startswith("-") else arg
        value = value.lstrip("@")
        if value.startswith(CHECKOUT_DIRS) and not has_placeholder(value) and not value.startswith("bench/out") \
                and "*" not in value:
            paths.append(value)
    return paths


@functools.lru_cache(maxsize=None)
def new_shell(command):
    """Run `command` in the checkout from a new shell that did what the README says first."""
    env = {"HOME": os.environ.get("HOME", "/root"), "PATH": NEW_SHELL_PATH, "LANG": "C.UTF-8"}
    proc = subprocess.run(["bash", "-c", "%s && %s" % (ACTIVATE, command)], cwd=ROOT, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True, timeout=300)
    return proc.returncode, proc.stdout


def makefile_targets():
    with open(os.path.join(ROOT, "Makefile")) as handle:
        return set(re.findall(r"^([a-z][a-z-]*):", handle.read(), re.M))


def options_of(argv):
    """The long options the words give, also those inside `[--a|--b]` alternatives."""
    return sorted(set(re.findall(r"(?<![\w-])(--[a-z][\w-]*)", " ".join(argv))))


def assert_options_in_help(argv_for_help, options, where, command, assignments=()):
    rc, out = new_shell(" ".join(shlex.quote(arg) for arg in list(assignments) + argv_for_help) + " --help")
    assert rc == 0, "%s: `%s --help` failed:\n%s" % (where, " ".join(argv_for_help), out[-2000:])
    for option in options:
        assert re.search(r"(^|[\s,\[])%s\b" % re.escape(option), out), \
            "%s: `%s` gives %s, which `%s --help` does not list" % (where, command, option, " ".join(argv_for_help))


def test_the_docs_give_commands_and_the_readme_says_how_a_new_shell_gets_the_toolchain():
    kinds = set(command.split()[0] for _where, command in COMMANDS)
    assert {"ansible-playbook", "ansible", "ansible-doc", "make", ".venv/bin/python"} <= kinds, kinds
    assert any(where.startswith("roles/") for where, command in COMMANDS if command.startswith("ansible-playbook"))
    with open(os.path.join(ROOT, "README.md")) as handle:
        assert "`%s`" % ACTIVATE in handle.read()
    assert os.path.exists(os.path.join(ROOT, ".venv", "bin", "activate"))
    # The new shell of these tests has no toolchain but what the activation gives.
    assert all(not os.path.exists(os.path.join(entry, "ansible-playbook")) for entry in NEW_SHELL_PATH.split(":"))


@pytest.mark.parametrize("where, command", COMMANDS, ids=["%s: %s" % pair for pair in COMMANDS])
def test_a_documented_command_names_what_exists_and_runs(where, command):
    assignments, argv = program_words(command)
    program = argv[0]
    for path in checkout_paths(argv):
        assert os.path.exists(os.path.join(ROOT, path)), "%s: `%s` names %s, which the checkout lacks" % (
            where, command, path)
    if program == "make":
        targets = [arg for arg in argv[1:] if not arg.startswith("-") and "=" not in arg]
        assert set(targets) <= makefile_targets(), "%s: `%s`: no such make target" % (where, command)
        return
    if program in NOT_RUN:
        rc, out = new_shell("command -v %s" % program)
        assert rc == 0, "%s: `%s`: %s is not in the toolchain" % (where, command, program)
        return
    if program == "ansible-playbook":
        assert [arg for arg in argv if arg.endswith(".yml")], "%s: `%s` names no playbook" % (where, command)
        if not has_placeholder(command):
            rc, out = new_shell(command + " --syntax-check")
            assert rc == 0, "%s: `%s --syntax-check` failed:\n%s" % (where, command, out[-3000:])
        return
    if program == "ansible":
        module = argv[argv.index("-m") + 1]
        rc, out = new_shell("ansible-doc -t module %s" % shlex.quote(module))
        assert rc == 0 and module.split(".")[-1] in out, "%s: `%s`: no module %s:\n%s" % (where, command, module, out)
        return
    if program == "ansible-doc":
        rc, out = new_shell(command)
        assert rc == 0 and argv[-1].split(".")[-1] in out, "%s: `%s` failed:\n%s" % (where, command, out[-2000:])
        return
    if program == "ansible-galaxy":
        assert_options_in_help(argv[:3], options_of(argv[3:]), where, command)
        return
    module_args = argv[argv.index("-m") + 1:] if "-m" in argv[:3] else None
    if module_args and module_args[0] == "modelwake_runner":
        if module_args[1:] and not has_placeholder(command):
            cli.build_parser().parse_args(module_args[1:])  # exits (SystemExit) on a renamed command or option
        rc, out = new_shell(" ".join(argv[:argv.index("-m") + 2]) + " --help")
        assert rc == 0 and "deploy" in out, out
        return
    if module_args and module_args[0] == "modelwake_sim" and assignments:  # without: a host's command, as a unit runs it
        subcommand = module_args[1:2]
        assert_options_in_help(argv[:argv.index("-m") + 2] + subcommand, options_of(module_args[2:]), where, command,
                               assignments)
        return
    if module_args:  # pytest and the like: the paths are what can go stale
        return
    script = next((arg for arg in argv if arg.startswith("tools/")), None)
    if script and os.path.isfile(os.path.join(ROOT, script)):
        with open(os.path.join(ROOT, script)) as handle:
            argparse_tool = "argparse" in handle.read()
        rest = argv[argv.index(script) + 1:]
        if argparse_tool and rest and not rest[0].startswith("-") and not has_placeholder(rest[0]):
            # The subcommand exists, and takes every option the docs give it.
            assert_options_in_help(argv[:argv.index(script) + 2], options_of(rest[1:]), where, command)
        elif argparse_tool and rest:
            assert_options_in_help(argv[:argv.index(script) + 1], options_of(rest), where, command)


def test_the_hints_the_playbooks_print_are_among_the_checked_commands():
    hints = [command for where, command in COMMANDS if where.startswith(("roles/", "playbooks/"))
             and where.endswith(".yml")]
    assert "ansible-playbook playbooks/status.yml -l demo-k26" in hints


def github_anchor(heading):
    """The anchor GitHub gives a markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors_of(path):
    with open(path) as handle:
        text = re.sub(r"^```.*?^```", "", handle.read(), flags=re.S | re.M)
    return set(github_anchor(line.lstrip("#")) for line in text.splitlines() if line.startswith("#"))


LINKED_PAGES = DOCS + ["CHANGELOG.md", "bench/REPORT.md"]


@pytest.mark.parametrize("page", LINKED_PAGES, ids=[_relative(page) for page in LINKED_PAGES])
def test_every_link_of_the_docs_leads_to_a_file_and_heading_of_the_checkout(page):
    path = os.path.join(ROOT, page)
    with open(path) as handle:
        text = handle.read()
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"^[a-z]+://", target):
            continue
        file_part, _, anchor = target.partition("#")
        linked = os.path.normpath(os.path.join(os.path.dirname(path), file_part)) if file_part else path
        assert os.path.exists(linked), "%s links to %s, which the checkout lacks" % (_relative(page), target)
        if anchor and linked.endswith(".md"):
            assert anchor in anchors_of(linked), "%s links to %s: no such heading" % (_relative(page), target)
