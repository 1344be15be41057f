"""The inference_env modules' DOCUMENTATION agrees with their argument spec (ansible-test cannot run here).

Both are read from the source (ast + YAML), so the modules need not be importable outside Ansible.
"""
import ast
import os

import pytest
import yaml

LIBRARY = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "library")
MODULES = ["python_env_facts", "compressed_tensors_requirement", "pip_transaction"]


def module_constants(name):
    with open(os.path.join(LIBRARY, name + ".py")) as handle:
        tree = ast.parse(handle.read())
    found = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            if node.targets[0].id in ("DOCUMENTATION", "EXAMPLES", "RETURN", "ARGUMENT_SPEC"):
                found[node.targets[0].id] = ast.literal_eval(node.value)
    return found


@pytest.mark.parametrize("name", MODULES)
def test_documentation_matches_the_argument_spec(name):
    consts = module_constants(name)
    assert set(consts) == {"DOCUMENTATION", "EXAMPLES", "RETURN", "ARGUMENT_SPEC"}
    doc = yaml.safe_load(consts["DOCUMENTATION"])
    assert doc["module"] == name
    spec, options = consts["ARGUMENT_SPEC"], doc["options"]
    assert sorted(spec) == sorted(options)
    for option, rules in spec.items():
        documented = options[option]
        assert documented.get("description"), "%s.%s has no description" % (name, option)
        for key in ("type", "required", "default", "choices", "elements"):
            assert documented.get(key) == rules.get(key), "%s.%s: %s differs (doc %r, spec %r)" % (
                name, option, key, documented.get(key), rules.get(key))


@pytest.mark.parametrize("name", MODULES)
def test_examples_and_return_are_valid_yaml(name):
    consts = module_constants(name)
    assert yaml.safe_load(consts["EXAMPLES"])
    returned = yaml.safe_load(consts["RETURN"])
    assert returned and all(value.get("description") and value.get("returned") for value in returned.values())
