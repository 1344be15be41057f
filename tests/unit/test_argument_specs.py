"""Every role's meta/argument_specs.yml agrees with its defaults/main.yml.

Like prometheus-community/ansible's lint_arguments_spec.sh: the same variable names on both sides,
the same default values, and every option typed and described. Written over roles/*, so each new
role is covered as it lands.
"""
import glob
import os

import pytest
import yaml

from tests.helpers import ROOT

ROLES = sorted(os.path.basename(os.path.dirname(p)) for p in glob.glob(os.path.join(ROOT, "roles", "*", "")))


def load(role, *parts):
    path = os.path.join(ROOT, "roles", role, *parts)
    if not os.path.exists(path):
        return None
    with open(path) as handle:
        return yaml.safe_load(handle) or {}


def test_there_are_roles_to_check():
    assert "inference_env" in ROLES


@pytest.mark.parametrize("role", ROLES)
def test_role_has_an_argument_spec(role):
    spec = load(role, "meta", "argument_specs.yml")
    assert spec is not None, "roles/%s/meta/argument_specs.yml is missing" % role
    assert "main" in spec.get("argument_specs", {}), "roles/%s: argument_specs has no 'main' entry point" % role


@pytest.mark.parametrize("role", ROLES)
def test_spec_and_defaults_name_the_same_variables_with_the_same_defaults(role):
    spec = (load(role, "meta", "argument_specs.yml") or {}).get("argument_specs", {}).get("main", {})
    options = spec.get("options") or {}
    defaults = load(role, "defaults", "main.yml") or {}
    assert sorted(set(defaults) - set(options)) == [], "roles/%s: defaults missing from argument_specs" % role
    # A spec option without a default in defaults/ must be required (no silent undefined variable).
    unbacked = sorted(n for n, o in options.items() if n not in defaults and not o.get("required"))
    assert unbacked == [], "roles/%s: options neither in defaults/main.yml nor required" % role
    mismatched = dict((n, (options[n].get("default"), v)) for n, v in defaults.items() if options[n].get("default") != v)
    assert mismatched == {}, "roles/%s: argument_specs default != defaults/main.yml (spec, defaults): %r" % (role, mismatched)


@pytest.mark.parametrize("role", ROLES)
def test_every_option_is_typed_described_and_prefixed(role):
    options = ((load(role, "meta", "argument_specs.yml") or {}).get("argument_specs", {}).get("main", {}).get("options")
               or {})
    for name, option in options.items():
        assert name.startswith(role + "_"), "roles/%s: %s is not prefixed with the role name" % (role, name)
        assert option.get("type"), "roles/%s: %s has no type" % (role, name)
        assert option.get("description"), "roles/%s: %s has no description" % (role, name)
        if option.get("type") == "list":
            assert option.get("elements"), "roles/%s: list option %s has no elements" % (role, name)


def checkout_yaml():
    """Every *.yml of the checkout, each once: the walk does not follow links (glob's `**` does, and
    ansible_collections/modelwake/serving links back to the root, so it read every file again at each level
    down to the kernel's limit of links in a path, where an open() failed with ELOOP)."""
    for directory, subdirectories, files in os.walk(ROOT):
        subdirectories[:] = sorted(name for name in subdirectories if not name.startswith("."))
        for name in sorted(files):
            if name.endswith(".yml"):
                yield os.path.join(directory, name)


def entry_points_used_by_callers():
    """{(role, entry point)} of every include_role/import_role with tasks_from outside the role itself."""
    used = set()
    for path in checkout_yaml():
        relative = os.path.relpath(path, ROOT)
        if relative.startswith((".venv", "molecule" + os.sep + ".")) or "/." in relative:
            continue
        with open(path) as handle:
            text = handle.read()
        if "tasks_from" not in text:
            continue
        for document in yaml.safe_load_all(text):
            for task in walk_tasks(document):
                include = task.get("ansible.builtin.include_role") or task.get("ansible.builtin.import_role") or {}
                if not isinstance(include, dict) or "tasks_from" not in include:
                    continue
                role = include["name"].split(".")[-1]
                if relative.startswith(os.path.join("roles", role) + os.sep):
                    continue
                used.add((role, os.path.splitext(include["tasks_from"])[0]))
    return used


def walk_tasks(node):
    if isinstance(node, list):
        for item in node:
            for task in walk_tasks(item):
                yield task
    elif isinstance(node, dict):
        yield node
        for key in ("block", "rescue", "always", "tasks", "pre_tasks", "post_tasks", "handlers"):
            for task in walk_tasks(node.get(key)):
                yield task


def test_every_entry_point_a_playbook_uses_is_declared_with_typed_and_described_options():
    used = entry_points_used_by_callers()
    assert ("model_service", "preflight") in used, used  # the walk finds deploy-model.yml's
    for role, entry in sorted(used):
        specs = (load(role, "meta", "argument_specs.yml") or {}).get("argument_specs", {})
        assert entry in specs, "roles/%s: tasks_from %s is used by a playbook but not declared in argument_specs" % (
            role, entry)
        main = specs["main"].get("options") or {}
        for name, option in (specs[entry].get("options") or {}).items():
            assert option.get("type") and option.get("description"), "roles/%s %s: %s untyped or undescribed" % (
                role, entry, name)
            # An entry point's option is main's (the same variable, the same meaning) or the includer's own input.
            assert name.startswith("_%s_" % role) or option == main.get(name), (
                "roles/%s %s: %s differs from main's" % (role, entry, name))
