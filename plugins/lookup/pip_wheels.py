# Copyright: (c) modelwake contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The pip wheels the controller has, best first: what bootstraps pip on a host without it.

Found without a download where the controller has one (almost always: the Python running Ansible
bundles one for ensurepip); downloaded once into the controller's cache only where it has none and
pip can reach an index from there. The hosts themselves never need an index.
"""
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
  - Then in O(download_dir), where an earlier run downloaded one. Only when none of these has a wheel,
    the controller's pip downloads the newest pip wheel there, with the controller's own pip
    configuration, 10 s per connection attempt and no retry. A controller that cannot reach an index
    gets an empty list quickly, and the role says how to supply a wheel.
  - Returns paths of C(pip-*-py3-none-any.whl) files; an empty list when there is none anywhere.
options:
  _terms:
    description: Directories to look in first (empty strings are skipped).
    type: list
    elements: str
    required: false
  download_dir:
    description:
      - Controller directory for a downloaded pip wheel; an empty string turns the download off.
      - Default C($XDG_CACHE_HOME/modelwake/pip-wheels), else C(~/.cache/modelwake/pip-wheels).
    type: str
    required: false
"""

EXAMPLES = r"""
- name: Pick the pip wheel to send
  ansible.builtin.set_fact:
    pip_wheel: "{{ lookup('modelwake.serving.pip_wheels', inference_env_wheelhouse, wantlist=True) | first | default('') }}"

- name: The same, never downloading
  ansible.builtin.set_fact:
    pip_wheel: "{{ lookup('modelwake.serving.pip_wheels', download_dir='', wantlist=True) | first | default('') }}"
"""

RETURN = r"""
_raw:
  description: Paths of pip wheels on the controller, best first.
  type: list
  elements: str
"""

import glob
import os
import subprocess
import sys

from ansible.plugins.lookup import LookupBase
from ansible.module_utils.compat.version import LooseVersion

DISTRIBUTION_WHEELS = "/usr/share/python-wheels"
# A controller without a route to an index must not stall the play: one bounded attempt.
DOWNLOAD_CONNECT_TIMEOUT_S = 10
DOWNLOAD_TIMEOUT_S = 120


def default_download_dir():
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "modelwake", "pip-wheels")


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


def wheels_in(place):
    if not place or not os.path.isdir(place):
        return []
    return newest_first(glob.glob(os.path.join(place, "pip-*-py3-none-any.whl")))


def download_pip_wheel(directory, python=sys.executable):
    """Download the newest pip wheel into `directory` with the controller's pip and its configuration;
    return its path, or None (no pip on the controller, no index within reach). Never raises."""
    try:
        os.makedirs(directory, exist_ok=True)
        subprocess.run([python, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
                        "--disable-pip-version-check", "--no-input", "--retries", "0",
                        "--timeout", str(DOWNLOAD_CONNECT_TIMEOUT_S), "--dest", directory, "pip"],
                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       timeout=DOWNLOAD_TIMEOUT_S, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    downloaded = wheels_in(directory)
    return downloaded[0] if downloaded else None


def pip_wheels(first_dirs=(), bundle=None, distribution=DISTRIBUTION_WHEELS, download_dir=""):
    """The pip wheels of the places in order, each place's newest first; a download into
    `download_dir` (unless empty) only when no place has one."""
    places = [d for d in first_dirs if d] + [bundle if bundle is not None else ensurepip_bundle(), distribution,
                                             download_dir]
    found = []
    for place in places:
        found += [path for path in wheels_in(place) if path not in found]
    if not found and download_dir:
        downloaded = download_pip_wheel(download_dir)
        if downloaded:
            found.append(downloaded)
    return found


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        self.set_options(var_options=variables, direct=kwargs)
        download_dir = self.get_option("download_dir")
        if download_dir is None:
            download_dir = default_download_dir()
        return pip_wheels(first_dirs=[str(term) for term in terms], download_dir=download_dir)
