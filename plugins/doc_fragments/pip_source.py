# Copyright: (c) modelwake contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The options naming where pip takes packages from (their argument spec: pyenv.pip_source_options())."""
from __future__ import annotations


class ModuleDocFragment(object):

    # pip_transaction, venv_restore.
    DOCUMENTATION = r"""
options:
  find_links:
    description: Local directories of wheels on the host.
    type: list
    elements: path
    default: []
  no_index:
    description: Do not contact any index (an air-gapped host); needs I(find_links).
    type: bool
    default: false
  index_url:
    description: Index to use instead of pip's configured one. Empty keeps pip's configuration.
    type: str
    default: ""
"""
