# Copyright: (c) modelwake contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The pip wheels the controller already has, best first: what bootstraps pip on a host without it."""
from __future__ import annotations

DOCUMENTATION = r"""
name: pip_wheels
author: modelwake contributors (@modelwake)
version_added: "1.0.0"
short_description: The pip wheels on the controller, best first, to bootstrap pip offline
description:
  - A venv without pip whose interpreter has no C(ensurepip) (Debian without C(python3-venv), a venv
    made by uv) gets pip from a wheel sent from the controller. This finds one without a download.
  - Looks, in this order, in the given directories (a wheelhouse), in the C(ensurepip) bundle of the
    Python that runs Ansible, and in the distribution's wheel directory C(/usr/share/python-wheels)
    (Debian's C(python3-pip-whl)). Within each place the newest version comes first.
  - Returns paths of C(pip-*-py3-none-any.whl) files; an empty list when there is none anywhere.
options:
  _terms:
    description: Directories to look in first (empty strings are skipped).
    type: list
    elements: str
    required: false
"""

EXAMPLES = r"""
- name: Pick the pip wheel to send
  ansible.builtin.set_fact:
    pip_wheel: "{{ lookup('modelwake.serving.pip_wheels', inference_env_wheelhouse, wantlist=True) | first | default('') }}"
"""

RETURN = r"""
_raw:
  description: Paths of pip wheels on the controller, best first.
  type: list
  elements: str
"""

import glob
import os

from ansible.plugins.lookup import LookupBase
from ansible.module_utils.compat.version import LooseVersion

DISTRIBUTION_WHEELS = "/usr/share/python-wheels"


def ensurepip_bundle():
    """The directory of the wheels this Python's ensurepip installs from (None when it has none)."""
    try:
        import ensurepip  # pylint: disable=import-outside-toplevel
    except ImportError:
        return None
    return os.path.join(os.path.dirname(ensurepip.__file__), "_bundled")


def newest_first(paths):
    """pip-X-py3-none-any.whl paths ordered by X, newest first (as versions, never as strings)."""
    return sorted(paths, key=lambda path: LooseVersion(os.path.basename(path).split("-")[1]), reverse=True)


def pip_wheels(first_dirs=(), bundle=None, distribution=DISTRIBUTION_WHEELS):
    places = [d for d in first_dirs if d] + [bundle if bundle is not None else ensurepip_bundle(), distribution]
    found = []
    for place in places:
        if place and os.path.isdir(place):
            found += [path for path in newest_first(glob.glob(os.path.join(place, "pip-*-py3-none-any.whl")))
                      if path not in found]
    return found


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        return pip_wheels(first_dirs=[str(term) for term in terms])
