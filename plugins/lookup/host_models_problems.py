# Copyright: (c) modelwake contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What keeps the models one host serves from running side by side, checked before anything runs."""
from __future__ import annotations

DOCUMENTATION = r"""
name: host_models_problems
author: modelwake contributors (@modelwake)
version_added: "1.1.0"
short_description: Why the models listed for one host cannot be served together, one readable line each
description:
  - Checks the models one host serves (C(modelwake_host_models)) against each other, with their
    catalog entries (C(modelwake_models)), so that a run refuses the list before it changes anything.
  - Each model needs its own systemd unit, TCP port and GPUs; two models must not name each other's
    unit in C(conflicts) (they replace each other, they are not served together); two models that
    share a virtual environment must want the same engine, engine version and compressed-tensors.
  - A name missing from the catalog is reported too. Returns an empty list when the models fit.
    Reads nothing but its arguments.
options:
  _terms:
    description: The model catalog (C(modelwake_models)).
    type: list
    elements: dict
    required: true
  models:
    description: The names of the models the host serves, in deployment order.
    type: list
    elements: str
    required: true
  host:
    description: The inventory host, used in the messages.
    type: str
    required: true
"""

EXAMPLES = r"""
- name: Check that the host's models can run side by side
  ansible.builtin.assert:
    that: _problems | length == 0
    fail_msg: "{{ _problems | join('; ') }}"
  vars:
    _problems: >-
      {{ lookup('modelwake.serving.host_models_problems', modelwake_models, models=modelwake_host_models,
                host=inventory_hostname, wantlist=True) }}
"""

RETURN = r"""
_raw:
  description: One line per problem, each naming the models, the catalog keys and how to fix it.
  type: list
  elements: str
"""

import itertools

from ansible.plugins.lookup import LookupBase

# inference_env's default venv (playbooks/vars/catalog-entry.yml): entries without "venv" share it.
DEFAULT_VENV = "/opt/modelwake/venv"
# What a shared venv holds: two models wanting different values cannot share it.
VENV_CONTENTS = ("engine", "engine_version", "compressed_tensors_version")


def _gpus(entry):
    try:
        return set(int(gpu) for gpu in entry.get("gpus") or [])
    except (TypeError, ValueError):
        return set()  # a malformed list is catalog_entry_problems' to report


def _pair_problems(first, second, a, b, where):
    both = "%s: %s and %s" % (where, first, second)
    problems = []
    if str(a.get("unit")) == str(b.get("unit")):
        problems.append("%s are both unit %s (modelwake_models.%s.unit, modelwake_models.%s.unit): give each "
                        "model its own unit" % (both, a.get("unit"), first, second))
    if str(a.get("port")) == str(b.get("port")):
        problems.append("%s both listen on port %s (modelwake_models.%s.port, modelwake_models.%s.port): give "
                        "each model its own port" % (both, a.get("port"), first, second))
    shared = sorted(_gpus(a) & _gpus(b))
    if shared:
        problems.append("%s both use GPU %s (modelwake_models.%s.gpus, modelwake_models.%s.gpus): give each "
                        "model its own GPUs, or serve them from different hosts"
                        % (both, ", ".join(str(gpu) for gpu in shared), first, second))
    if str(b.get("unit")) in (a.get("conflicts") or []) or str(a.get("unit")) in (b.get("conflicts") or []):
        problems.append("%s conflict (modelwake_models.*.conflicts names the other's unit): they replace each "
                        "other, list only one of them for this host" % both)
    if a.get("venv", DEFAULT_VENV) == b.get("venv", DEFAULT_VENV):
        differ = [key for key in VENV_CONTENTS if str(a.get(key, "")) != str(b.get(key, ""))]
        if differ:
            problems.append("%s share the venv %s but want different %s: give one of them its own "
                            "modelwake_models.NAME.venv" % (both, a.get("venv", DEFAULT_VENV), ", ".join(differ)))
    return problems


def host_models_problems(catalog, models, host):
    """The problems of serving models (names in catalog) together on host ([] when they fit)."""
    where = "modelwake_host_models on %s" % host
    if not isinstance(models, (list, tuple)):
        return ["%s must be a list of catalog names, got %r" % (where, models)]
    problems = []
    known = []
    for name in models:
        if name in known:
            problems.append("%s lists %s twice" % (where, name))
        elif not isinstance(catalog, dict) or name not in catalog:
            problems.append("%s: %s is not in the model catalog (modelwake_models: %s)"
                            % (where, name, ", ".join(sorted(catalog)) if isinstance(catalog, dict) else "none"))
        elif isinstance(catalog[name], dict):
            known.append(name)
    for first, second in itertools.combinations(known, 2):
        problems += _pair_problems(first, second, catalog[first], catalog[second], where)
    return problems


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        self.set_options(var_options=variables, direct=kwargs)
        models = self.get_option("models")
        host = self.get_option("host")
        return [problem for catalog in terms for problem in host_models_problems(catalog, models, host)]
