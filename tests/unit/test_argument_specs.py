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
