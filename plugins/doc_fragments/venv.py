# Copyright: (c) modelwake contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The option naming the virtual environment a module reads or changes."""
from __future__ import annotations


class ModuleDocFragment(object):

    # python_env_facts, pip_transaction, venv_restore (the last two also need pip in it: their requirements).
    DOCUMENTATION = r"""
options:
  venv:
    description: Absolute path of the virtual environment.
    type: path
    required: true
"""
