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
  - GPUs are read as the roles read them everywhere, an empty or absent C(gpus) meaning every GPU of
    the host. Two models whose GPUs meet are refused, naming the GPUs they would share, unless both
    entries set C(share_gpus=true), which shares them on purpose, their launchers starting them one at
    a time (C(model_service_gpu_turns)).
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


# An empty or absent `gpus`: the model uses every GPU of the host (gpu_preflight, model_service and the
# launcher's turns all read it so).
EVERY_GPU = "every GPU of the host"


def _gpus(entry):
    """The GPU indices the entry uses, or EVERY_GPU."""
    gpus = entry.get("gpus") or []
    if not gpus:
        return EVERY_GPU
    try:
        return set(int(gpu) for gpu in gpus)
    except (TypeError, ValueError):
        return set()  # a malformed list is catalog_entry_problems' to report


def _shared_gpus(a, b):
    """The GPUs two entries would share, in words ('' when none)."""
    first, second = _gpus(a), _gpus(b)
    if first is EVERY_GPU and second is EVERY_GPU:
        return EVERY_GPU
    shared = second if first is EVERY_GPU else first if second is EVERY_GPU else first & second
    return "GPU " + ", ".join(str(gpu) for gpu in sorted(shared)) if shared else ""


def _gpu_problem(first, second, a, b, both):
    """Two models on the same GPUs are refused unless both entries say they share them on purpose."""
    shared = _shared_gpus(a, b)
    if not shared or (a.get("share_gpus") is True and b.get("share_gpus") is True):
        return []
    empty = [name for name, entry in ((first, a), (second, b)) if _gpus(entry) is EVERY_GPU]
    keys = "modelwake_models.%s.gpus, modelwake_models.%s.gpus" % (first, second)
    if empty:
        keys += "; %s: every GPU of the host" % " and ".join("an empty %s.gpus" % name for name in empty)
    return ["%s both use %s (%s): give each model its own GPUs, serve them from different hosts, or set "
            "share_gpus: true in both entries to share them, started one at a time" % (both, shared, keys)]


def _pair_problems(first, second, a, b, where):
    both = "%s: %s and %s" % (where, first, second)
    problems = []
    if str(a.get("unit")) == str(b.get("unit")):
        problems.append("%s are both unit %s (modelwake_models.%s.unit, modelwake_models.%s.unit): give each "
                        "model its own unit" % (both, a.get("unit"), first, second))
    if str(a.get("port")) == str(b.get("port")):
        problems.append("%s both listen on port %s (modelwake_models.%s.port, modelwake_models.%s.port): give "
                        "each model its own port" % (both, a.get("port"), first, second))
    problems += _gpu_problem(first, second, a, b, both)
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
