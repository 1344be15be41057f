# Copyright: (c) modelwake contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The option naming the GPUs a deployment needs."""
from __future__ import annotations


class ModuleDocFragment(object):

    # gpu_holders, gpu_health.
    DOCUMENTATION = r"""
options:
  gpus:
    description: Indices of the GPUs the deployment needs. Empty means every GPU found.
    type: list
    elements: int
    default: []
"""
