#!/usr/bin/python
# Copyright: (c) modelwake contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Read the GPUs' health and say what refuses a deployment (GPU preflight)."""
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: gpu_health
short_description: Report the GPUs' health and the problems that refuse a deployment
description:
  - Reads, per needed GPU, persistence mode, the remapped rows (pending remaps, remapping failures) and the
    NVSwitch fabric registration (NVML through the driver's C(libnvidia-ml.so.1), else C(nvidia-smi)); the driver
    version and the newest CUDA version it supports; on a host with NVSwitches (C(/proc/driver/nvidia-nvswitch/devices))
    the state of C(nvidia-fabricmanager.service).
  - Reads the CUDA version the engine's torch was built for from I(venv) and compares it with the driver's.
  - Returns one message per problem, naming the GPU and the fix; never changes anything. The C(gpu_preflight)
    role refuses on them.
extends_documentation_fragment:
  - modelwake.serving.gpus
options:
  venv:
    description: The engine's virtual environment, whose torch's CUDA build the driver must support. Empty skips that check.
    type: str
    default: ""
  require_persistence:
    description: Refuse a needed GPU with persistence mode off (else only warn).
    type: bool
    default: true
  require_fabric_manager:
    description: Refuse when the fabric manager is missing or down on an NVSwitch host (else only warn).
    type: bool
    default: true
  require_remapped_rows:
    description: Refuse a needed GPU with a row-remapping failure or a pending remap (else only warn).
    type: bool
    default: true
  require_driver_for_cuda:
    description: Refuse a driver whose CUDA version is older than the engine's torch build (else only warn).
    type: bool
    default: true
author: modelwake contributors (@modelwake)
notes:
  - Supports check mode; it never changes anything.
"""

EXAMPLES = r"""
- name: Read the GPUs' health
  modelwake.serving.gpu_health:
    gpus: [0, 1, 2, 3, 4, 5, 6, 7]
    venv: /opt/modelwake/venv
  register: gpu_preflight_health
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
driver_version:
  description: The NVIDIA driver's version, null when not read.
  returned: always
  type: str
  sample: 580.95.05
cuda_version:
  description: The newest CUDA version the driver supports, null when not read.
  returned: always
  type: str
  sample: "13.0"
torch:
  description: The engine's torch (C(torch_version), C(cuda) it was built for, C(path) of its version.py, C(note) when not compared).
  returned: always
  type: dict
gpus:
  description:
    - The needed GPUs' health. C(persistence_mode) true, false or null (not read); C(remapped_rows) null where the GPU
      has no row remapping (before Ampere); C(fabric) null where the GPU is on no NVSwitch fabric or NVML cannot tell.
  returned: always
  type: list
  elements: dict
  sample: [{"index": 0, "uuid": "GPU-0", "persistence_mode": true,
            "remapped_rows": {"correctable": 0, "uncorrectable": 0, "pending": false, "failure": false},
            "fabric": {"state": "completed", "status": 0}, "notes": []}]
nvswitch_devices:
  description: The NVSwitches the kernel module drives; empty on a host without them.
  returned: always
  type: list
  elements: str
fabric_manager:
  description: LoadState and ActiveState of nvidia-fabricmanager.service, asked on NVSwitch hosts only.
  returned: always
  type: dict
notes:
  description: What was not read or not compared, and why (a GPU's own notes prefixed with C(GPU <index>:)).
  returned: always
  type: list
  elements: str
problems:
  description: One message per problem that refuses the deployment, naming the GPU and the fix.
  returned: always
  type: list
  elements: str
waived_problems:
  description: The problems of the checks turned off; they refuse nothing.
  returned: always
  type: list
  elements: str
health_table:
  description: Readable lines, the driver's and one per GPU.
  returned: always
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.modelwake.serving.plugins.module_utils.host.gpu import GpuReader
from ansible_collections.modelwake.serving.plugins.module_utils.host.gpu_health import read_health
from ansible_collections.modelwake.serving.plugins.module_utils.preflight import health as preflight_health


ARGUMENT_SPEC = {
    "gpus": {"type": "list", "elements": "int", "default": []},
    "venv": {"type": "str", "default": ""},
    "require_persistence": {"type": "bool", "default": True},
    "require_fabric_manager": {"type": "bool", "default": True},
    "require_remapped_rows": {"type": "bool", "default": True},
    "require_driver_for_cuda": {"type": "bool", "default": True},
}


def main():
    module = AnsibleModule(
        argument_spec=ARGUMENT_SPEC,
        supports_check_mode=True,
    )
    params = module.params
    if any(index < 0 for index in params["gpus"]):
        module.fail_json(msg="gpus must be GPU indices (0 or more), got %s" % params["gpus"])
    reader = GpuReader(gpus=params["gpus"] or None)
    health = read_health(reader)
    torch = preflight_health.torch_cuda_build(params["venv"])
    require = {
        preflight_health.PERSISTENCE: params["require_persistence"],
        preflight_health.FABRIC_MANAGER: params["require_fabric_manager"],
        preflight_health.REMAPPED_ROWS: params["require_remapped_rows"],
        preflight_health.DRIVER_FOR_CUDA: params["require_driver_for_cuda"],
    }
    verdict = preflight_health.judge(health, torch, require)
    notes = (health["notes"] + ["GPU %d: %s" % (gpu["index"], note) for gpu in health["gpus"] for note in gpu["notes"]]
             + ([torch["note"]] if torch["note"] else []))
    module.exit_json(
        changed=False,
        backend=health["backend"],
        backend_error=reader.error,
        driver_version=health["driver_version"],
        cuda_version=health["cuda_version"],
        torch=torch,
        gpus=health["gpus"],
        nvswitch_devices=health["nvswitch_devices"],
        fabric_manager=health["fabric_manager"],
        notes=notes,
        problems=verdict["problems"],
        waived_problems=verdict["waived"],
        health_table=preflight_health.health_table(health, torch),
    )


if __name__ == "__main__":
    main()
