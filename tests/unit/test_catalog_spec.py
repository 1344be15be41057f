"""The catalog's spec (lookup catalog_entry_problems) against the entries, the mapping and the roles.

The spec is one table in Python; these tests keep it equal to what it stands for: the keys that
playbooks/vars/catalog-entry.yml maps, the types and choices of the role variables each key
feeds (the roles' meta/argument_specs.yml), and the mapping's fallbacks equal to the roles' defaults.
"""
import os
import re

import pytest
import yaml

from ansible_collections.modelwake.serving.plugins.lookup.catalog_entry_problems import CATALOG, entry_problems

from tests.helpers import ROOT
ROLES = ["gpu_preflight", "inference_env", "model_service"]
# role_var: "{{ modelwake_deploy.KEY | default(FALLBACK) }}" (or without the default)
MAPPING = re.compile(r"^(\w+): \"\{\{ modelwake_deploy\.(\w+)(?: \| default\((.*)\))? \}\}\"$")
K26 = {"engine": "sglang", "engine_version": "0.5.9", "unit": "sglang-k26", "port": 30001,
       "model_path": "/srv/models/Kimi-K2.6", "tp": 8, "gpus": [0, 1, 2, 3, 4, 5, 6, 7],
       "extra_args": ["--trust-remote-code"], "conflicts": ["sglang-k26-ddtree"], "stall_timeout": 600}


def mapping():
    """[(role variable, catalog key, fallback or None)] of playbooks/vars/catalog-entry.yml."""
    rows = []
    with open(os.path.join(ROOT, "playbooks", "vars", "catalog-entry.yml")) as handle:
        for line in handle:
            match = MAPPING.match(line.strip())
            if match and match.group(1) == "_modelwake_venv":
                # Both roles' venv variables read it.
                rows += [(role_var, "venv", match.group(3)) for role_var in ("inference_env_venv", "model_service_venv")]
            elif match:
                rows.append(match.groups())
    return rows


def role_specs():
    options, defaults = {}, {}
    for role in ROLES:
        with open(os.path.join(ROOT, "roles", role, "meta", "argument_specs.yml")) as handle:
            for entry_point in yaml.safe_load(handle)["argument_specs"].values():
                options.update(entry_point["options"])
        with open(os.path.join(ROOT, "roles", role, "defaults", "main.yml")) as handle:
            defaults.update(yaml.safe_load(handle) or {})
    return options, defaults


def test_the_spec_has_exactly_the_keys_the_mapping_reads():
    fed = set(key for key, spec in CATALOG.items() if not spec.get("controller_only"))
    assert fed == set(key for _, key, _ in mapping())


def test_share_gpus_is_true_or_false():
    assert entry_problems(dict(K26, share_gpus=True), "k26") == []
    assert entry_problems(dict(K26, share_gpus="yes"), "k26") == ["modelwake_models.k26.share_gpus must be true or false, got 'yes'"]


@pytest.mark.parametrize("role_var,key,fallback", mapping())
def test_each_key_has_the_type_and_choices_of_the_role_variables_it_feeds(role_var, key, fallback):
    options, defaults = role_specs()
    option = options[role_var]
    kind = {"path": "str", "raw": "str"}.get(option.get("type", "str"), option.get("type", "str"))
    assert CATALOG[key]["type"] == kind
    assert CATALOG[key].get("elements") == option.get("elements")
    assert CATALOG[key].get("choices") == option.get("choices")
    if fallback is not None:
        # The playbook layer's fallback is the role's own default.
        assert yaml.safe_load(fallback.replace("'", '"')) == defaults[role_var], role_var


def test_a_valid_entry_has_no_problems():
    assert entry_problems(K26, "k26") == []
    # Versions and numbers written as strings, as YAML users do.
    assert entry_problems(dict(K26, port="30001", engine_version=0.6), "k26") == []


@pytest.mark.parametrize("change,problem", [
    ({"stall_timout": 300}, "modelwake_models.k26.stall_timout is not a catalog key: did you mean stall_timeout?"),
    ({"gpu_free": 1000}, "modelwake_models.k26.gpu_free is not a catalog key: did you mean gpu_free_mib?"),
    ({"zzz": 1}, "modelwake_models.k26.zzz is not a catalog key: valid keys are api_key, compressed_tensors_version,"),
    ({"port": "thirty"}, "modelwake_models.k26.port must be an integer, got 'thirty'"),
    ({"gpus": "0,1"}, "modelwake_models.k26.gpus must be a list, got '0,1'"),
    ({"gpus": [0, "one"]}, "modelwake_models.k26.gpus must be a list of ints, got [0, 'one']"),
    ({"engine": "sglng"}, "modelwake_models.k26.engine must be one of sglang, vllm, got 'sglng'"),
    ({"verify_checksums": "yes"}, "modelwake_models.k26.verify_checksums must be true or false, got 'yes'"),
    ({"env": ["A=1"]}, "modelwake_models.k26.env must be a mapping, got ['A=1']"),
    ({"safetensors_load_strategy": "fast"},
     "modelwake_models.k26.safetensors_load_strategy must be one of , lazy, eager, prefetch, torchao, got 'fast'"),
    ({"prefetch": "always"}, "modelwake_models.k26.prefetch must be one of auto, on, off, got 'always'"),
    ({"model_loader_extra_config": '{"num_threads": 8}'}, "modelwake_models.k26.model_loader_extra_config must be a mapping"),
])
def test_a_bad_entry_is_named_key_by_key(change, problem):
    problems = entry_problems(dict(K26, **change), "k26")
    assert len(problems) == 1 and problems[0].startswith(problem), problems


def test_a_bare_yaml_on_or_off_is_the_prefetch_mode_it_reads_as():
    # `prefetch: on` in YAML is true: the catalog takes it as the operator wrote it.
    assert entry_problems(dict(K26, prefetch=True, load_format="fastsafetensors"), "k26") == []
    assert entry_problems(dict(K26, prefetch=False, model_loader_extra_config={"num_threads": 8}), "k26") == []


def test_missing_required_keys_and_a_non_mapping():
    assert entry_problems({"engine": "vllm", "unit": "u"}, "m") == [
        "modelwake_models.m.port is required (an integer)", "modelwake_models.m.model_path is required (a string)"]
    assert entry_problems("sglang", "m")[0].startswith("modelwake_models.m must be a mapping of settings")
