#!/usr/bin/python
# Copyright: (c) modelwake contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Read the GPUs and the processes holding them, and say which may be stopped (GPU preflight)."""
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: gpu_holders
short_description: Report the GPUs, the processes holding their memory, and what blocks a deployment
description:
  - Reads every GPU (NVML through the driver's C(libnvidia-ml.so.1), else C(nvidia-smi)) and every compute process with
    its PID, user, systemd unit (from C(/proc/<pid>/cgroup)), command line and memory per GPU.
  - Sorts the holders of the needed GPUs into the service's own processes (C(own)), processes
    of units that may be stopped (C(stoppable)) and everything else (C(foreign)), and reports
    the GPUs where foreign processes hold more than I(max_foreign_mib).
  - Never changes anything; the C(gpu_preflight) role decides what to stop or to fail on.
extends_documentation_fragment:
  - modelwake.serving.gpus
options:
  service_unit:
    description: The unit being deployed; its own processes never block.
    type: str
  stop_units:
    description: Units whose processes may be stopped to free the GPUs.
    type: list
    elements: str
    default: []
  max_foreign_mib:
    description: Memory (MiB) foreign processes may hold on a needed GPU before it blocks.
    type: int
    default: 1024
  min_free_mib:
    description:
      - Memory (MiB) each needed GPU must have free once own and stoppable holders are gone.
      - 0 uses the weights' even share, I(model_bytes) divided by the needed GPUs; 0 with no model_bytes skips the check.
    type: int
    default: 0
  model_bytes:
    description: Size of the model's weights, for the default of I(min_free_mib).
    type: int
    default: 0
author: modelwake contributors (@modelwake)
notes:
  - Supports check mode; it never changes anything.
"""

EXAMPLES = r"""
- name: Read who holds the GPUs
  modelwake.serving.gpu_holders:
    gpus: [0, 1, 2, 3, 4, 5, 6, 7]
    service_unit: sglang-k26
    stop_units: [sglang-k26-ddtree]
    max_foreign_mib: 1024
  register: gpu_preflight_holders
"""

RETURN = r"""
backend:
  description: How the GPUs were read, C(nvml), C(nvidia-smi) or C(none) (no GPU tool answered).
  returned: always
  type: str
backend_error:
  description: Why NVML or nvidia-smi could not be used, when one failed.
  returned: always
  type: str
gpus:
  description:
    - Every GPU found. C(memory_used_mib) as C(nvidia-smi) shows it; C(memory_free_mib) what can still be allocated
      (the driver's reserved memory is in neither), null where the reader cannot tell.
  returned: always
  type: list
  elements: dict
  sample: [{"index": 0, "uuid": "GPU-0", "memory_used_mib": 55000, "memory_total_mib": 97887, "memory_free_mib": 42272,
            "utilization": 0}]
needed:
  description: Indices of the needed GPUs.
  returned: always
  type: list
  elements: int
missing_gpus:
  description: Needed GPU indices that do not exist on this host.
  returned: always
  type: list
  elements: int
holders:
  description:
    - Processes holding memory on needed GPUs, with C(verdict) own, stoppable or foreign.
    - C(container) is the container a holder runs in (C(id), C(name)) or null; C(label) is its host PID,
      followed by that container's name and short ID.
  returned: always
  type: list
  elements: dict
  sample: [{"pid": 4242, "user": "root", "unit": "session-3.scope", "cmdline": "python ddtree.py",
            "gpus": {"0": 55000}, "verdict": "foreign", "container": null, "label": "4242"}]
blocking_gpus:
  description: Needed GPUs where foreign processes hold more than max_foreign_mib.
  returned: always
  type: list
  elements: int
blocking:
  description: The foreign holders on blocking GPUs.
  returned: always
  type: list
  elements: dict
stop_units:
  description: Units from stop_units that hold needed GPUs and would be stopped.
  returned: always
  type: list
  elements: str
min_free_mib:
  description: The free memory (MiB) each needed GPU was checked for; 0 when not checked.
  returned: always
  type: int
short_gpus:
  description: Needed GPUs with less than min_free_mib free, even after own and stoppable holders are gone.
  returned: always
  type: list
  elements: dict
gpu_table:
  description: Readable lines, one per GPU.
  returned: always
  type: list
  elements: str
holder_table:
  description: Readable lines, one per holder (PID, user, unit, verdict, memory per GPU, command).
  returned: always
  type: list
  elements: str
blocking_table:
  description: Like holder_table, for the blocking holders only.
  returned: always
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.modelwake.serving.plugins.module_utils.preflight.holders import survey


ARGUMENT_SPEC = {
    "gpus": {"type": "list", "elements": "int", "default": []},
    "service_unit": {"type": "str"},
    "stop_units": {"type": "list", "elements": "str", "default": []},
    "max_foreign_mib": {"type": "int", "default": 1024},
    "min_free_mib": {"type": "int", "default": 0},
    "model_bytes": {"type": "int", "default": 0},
}


def main():
    module = AnsibleModule(
        argument_spec=ARGUMENT_SPEC,
        supports_check_mode=True,
    )
    params = module.params
    for name in ("max_foreign_mib", "min_free_mib", "model_bytes"):
        if params[name] < 0:
            module.fail_json(msg="%s must be 0 or more, got %d" % (name, params[name]))
    if any(index < 0 for index in params["gpus"]):
        module.fail_json(msg="gpus must be GPU indices (0 or more), got %s" % params["gpus"])
    result = survey(
        needed=params["gpus"],
        service_unit=params["service_unit"],
        stop_units=params["stop_units"],
        max_foreign_mib=params["max_foreign_mib"],
        min_free_mib=params["min_free_mib"],
        model_bytes=params["model_bytes"],
    )
    for key in ("holders", "blocking"):
        # JSON object keys are strings; say so explicitly instead of letting it happen.
        result[key] = [dict(h, gpus=dict((str(i), m) for i, m in h["gpus"].items())) for h in result[key]]
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
