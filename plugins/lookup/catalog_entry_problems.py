# Copyright: (c) modelwake contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What is wrong with a model catalog entry (modelwake_models.NAME), checked before anything runs."""
from __future__ import annotations

DOCUMENTATION = r"""
name: catalog_entry_problems
author: modelwake contributors (@modelwake)
version_added: "1.0.0"
short_description: The problems of a model catalog entry, one readable line each
description:
  - Checks one entry of C(modelwake_models) against the catalog's spec (C(CATALOG) in this file,
    kept equal to the roles' argument specs by the unit tests) - required keys, types, list
    elements and choices - and rejects unknown keys, naming the closest valid key, so that a typo
    such as C(stall_timout) is an error instead of a silently ignored setting.
  - Returns an empty list for a valid entry. Reads nothing but its arguments.
options:
  _terms:
    description: The catalog entry (a mapping).
    type: list
    elements: dict
    required: true
  name:
    description: The entry's name in C(modelwake_models), used in the messages.
    type: str
    required: true
"""

EXAMPLES = r"""
- name: Check the catalog entry
  ansible.builtin.assert:
    that: _problems | length == 0
    fail_msg: "{{ _problems | join('; ') }}"
  vars:
    _problems: "{{ lookup('modelwake.serving.catalog_entry_problems', modelwake_models.k26, name='k26', wantlist=True) }}"
"""

RETURN = r"""
_raw:
  description: One line per problem, each naming the key (C(modelwake_models.NAME.KEY)) and how to fix it.
  type: list
  elements: str
"""

import difflib

from ansible.plugins.lookup import LookupBase

# Every key an entry may have: its type, the type of a list's elements, its choices, whether it is
# required. The roles' variables each key feeds are in playbooks/vars/catalog-entry.yml; a
# controller_only key feeds none (the controller's checks read it from the catalog).
CATALOG = {
    "engine": {"type": "str", "choices": ["sglang", "vllm"], "required": True},
    "unit": {"type": "str", "required": True},
    "port": {"type": "int", "required": True},
    "model_path": {"type": "str", "required": True},
    "engine_version": {"type": "str"},
    "engine_package": {"type": "str"},
    "compressed_tensors_version": {"type": "str"},
    "venv": {"type": "str"},
    "served_model_name": {"type": "str"},
    "host": {"type": "str"},
    "tp": {"type": "int"},
    "gpus": {"type": "list", "elements": "int"},
    # Two models on the same GPUs both set it (host_models_problems; it feeds no role variable).
    "share_gpus": {"type": "bool", "controller_only": True},
    "gpu_free_mib": {"type": "int"},
    "verify_checksums": {"type": "bool"},
    "conflicts": {"type": "list", "elements": "str"},
    "extra_args": {"type": "list", "elements": "str"},
    "env": {"type": "dict"},
    "api_key": {"type": "str"},
    "limits": {"type": "dict"},
    "nodes_group": {"type": "str"},
    # Seconds, or auto: from the host's record of earlier starts (docs/operating.md, "Start history").
    "ready_timeout": {"type": "str", "seconds_or_auto": True},
    "stall_timeout": {"type": "str", "seconds_or_auto": True},
    "expected_load_seconds": {"type": "int"},
    # Containers (docs/containers.md): the runtime, the image by name, its pinned ID, an archive.
    "runtime": {"type": "str", "choices": ["venv", "podman", "docker"]},
    "image": {"type": "str"},
    "image_id": {"type": "str"},
    "image_archive": {"type": "str"},
    "container_command": {"type": "list", "elements": "str"},
    # How the weights are read (docs/operating.md, "Prefetch and the engines' loaders").
    "prefetch": {"type": "str", "choices": ["auto", "on", "off"]},
    "load_format": {"type": "str"},
    "safetensors_load_strategy": {"type": "str", "choices": ["", "lazy", "eager", "prefetch", "torchao"]},
    "model_loader_extra_config": {"type": "dict"},
}
TYPE_NAMES = {"str": "a string", "int": "an integer", "bool": "true or false", "list": "a list",
              "dict": "a mapping"}


def _is(kind, value):
    """Does value have the catalog type kind? YAML's own types; numbers and versions written as strings pass."""
    if kind == "str":
        return isinstance(value, (str, int, float)) and not isinstance(value, bool)
    if kind == "int":
        return (isinstance(value, int) and not isinstance(value, bool)) or (
            isinstance(value, str) and value.strip().lstrip("-").isdigit())
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "list":
        return isinstance(value, (list, tuple))
    return isinstance(value, dict)


def entry_problems(entry, name):
    """The problems of one catalog entry, in a stable order ([] when it is valid)."""
    where = "modelwake_models.%s" % name
    if not isinstance(entry, dict):
        return ["%s must be a mapping of settings (engine, unit, port, model_path, ...), got %r" % (where, entry)]
    problems = []
    for key in sorted(set(entry) - set(CATALOG)):
        close = difflib.get_close_matches(str(key), list(CATALOG), n=1)
        problems.append("%s.%s is not a catalog key: %s" % (
            where, key, "did you mean %s?" % close[0] if close else "valid keys are %s" % ", ".join(sorted(CATALOG))))
    for key, spec in CATALOG.items():
        if key not in entry:
            if spec.get("required"):
                problems.append("%s.%s is required (%s)" % (where, key, TYPE_NAMES[spec["type"]]))
            continue
        value = entry[key]
        if isinstance(value, bool) and "on" in spec.get("choices", []):
            value = "on" if value else "off"  # YAML reads a bare on/off as true/false
        if spec.get("seconds_or_auto"):
            if not (_is("int", value) or value == "auto"):
                problems.append("%s.%s must be an integer (seconds) or auto, got %r" % (where, key, value))
        elif not _is(spec["type"], value):
            problems.append("%s.%s must be %s, got %r" % (where, key, TYPE_NAMES[spec["type"]], value))
        elif spec.get("elements") and not all(_is(spec["elements"], item) for item in value):
            problems.append("%s.%s must be a list of %ss, got %r" % (where, key, spec["elements"], value))
        elif spec.get("choices") and value not in spec["choices"]:
            problems.append("%s.%s must be one of %s, got %r" % (where, key, ", ".join(spec["choices"]), value))
    return problems


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        self.set_options(var_options=variables, direct=kwargs)
        name = self.get_option("name")
        return [problem for entry in terms for problem in entry_problems(entry, name)]
