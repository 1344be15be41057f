# Copyright: (c) modelwake contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The options naming one package to install at a pinned version, and how its install is verified."""
from __future__ import annotations


class ModuleDocFragment(object):

    # pip_transaction (into a venv), image_repair (into an image derived from a container image).
    DOCUMENTATION = r"""
options:
  name:
    description: Distribution name to install.
    type: str
    required: true
  version:
    description: Version to require.
    type: str
    required: true
  match:
    description: C(exact) installs C(name==version); C(minimum) accepts any C(name>=version) and installs the newest allowed.
    type: str
    choices: [exact, minimum]
    default: exact
  protect:
    description: Distributions pip may not replace; each installed one is constrained to its current version.
    type: list
    elements: str
    default: []
  verify_module:
    description: Module to import, to verify the package, in the Python it is installed for (the venv, the image). Empty skips the import check.
    type: str
    default: ""
  verify_attribute:
    description: Dotted attribute of I(verify_module) holding an enum whose members are checked.
    type: str
    default: ""
  verify_values:
    description: Enum values that must exist, both as values and as member names (C(-) becomes C(_)).
    type: list
    elements: str
    default: []
"""
