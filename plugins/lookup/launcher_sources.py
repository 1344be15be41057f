# Copyright: (c) modelwake contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The module_utils files the Type=notify launcher imports: what the model_service role installs."""
from __future__ import annotations

DOCUMENTATION = r"""
name: launcher_sources
author: modelwake contributors (@modelwake)
version_added: "1.0.0"
short_description: The collection's module_utils files a host-side entry point imports
description:
  - Follows the relative imports of the given module_utils modules, file by file, and returns every
    file they need, each package's C(__init__.py) included. The model_service role copies exactly
    these under the host's C(modelwake) package, so the launcher gets only what it imports.
  - Reads the collection it belongs to, wherever it is installed; no path outside it is involved.
options:
  _terms:
    description:
      - Entry modules, dotted and relative to C(plugins/module_utils).
      - Without any, the launcher (C(launcher.launch)).
    type: list
    elements: str
    required: false
"""

EXAMPLES = r"""
- name: Install the launcher's package
  ansible.builtin.copy:
    src: "{{ item.src }}"
    dest: "/opt/modelwake/lib/modelwake/{{ item.path }}"
    mode: "0644"
  loop: "{{ lookup('modelwake.serving.launcher_sources', wantlist=True) }}"
"""

RETURN = r"""
_raw:
  description: One entry per file, sorted by path.
  type: list
  elements: dict
  contains:
    path:
      description: The file's path relative to C(plugins/module_utils), for example C(readiness/classifier.py).
      type: str
    src:
      description: The file's absolute path on the controller.
      type: str
"""

import ast
import os

from ansible.errors import AnsibleLookupError
from ansible.plugins.lookup import LookupBase

MODULE_UTILS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "module_utils")
LAUNCHER = "launcher.launch"


def _module_file(root, dotted):
    """The file of a dotted module under root: a module file or a package's __init__.py, else None."""
    base = os.path.join(root, *dotted.split("."))
    for path in (base + ".py", os.path.join(base, "__init__.py")):
        if os.path.isfile(path):
            return path
    return None


def relative_imports(root, dotted):
    """Dotted names of the modules `dotted` imports relatively (`from ..host import procfs` included)."""
    path = _module_file(root, dotted)
    with open(path) as handle:
        tree = ast.parse(handle.read(), path)
    package = dotted.split(".") if path.endswith("__init__.py") else dotted.split(".")[:-1]
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom) or not node.level:
            continue
        if node.level - 1 > len(package):
            raise ValueError("%s: a relative import reaches above module_utils" % path)
        base = package[:len(package) - node.level + 1]
        target = base + (node.module.split(".") if node.module else [])
        found.append(".".join(target))
        for alias in node.names:  # `from ..host import procfs`: procfs is a module of its own
            candidate = ".".join(target + [alias.name])
            if _module_file(root, candidate):
                found.append(candidate)
    return found


def closure(entries, root=MODULE_UTILS):
    """Relative paths of every file the entries need, the packages' __init__.py included, sorted."""
    seen, todo = set(), list(entries)
    while todo:
        dotted = todo.pop()
        if dotted in seen:
            continue
        if _module_file(root, dotted) is None:
            raise ValueError("%s: no such module under %s" % (dotted, root))
        seen.add(dotted)
        parts = dotted.split(".")
        for depth in range(1, len(parts)):  # the packages above it
            if _module_file(root, ".".join(parts[:depth])):
                todo.append(".".join(parts[:depth]))
        todo.extend(relative_imports(root, dotted))
    return sorted(os.path.relpath(_module_file(root, dotted), root) for dotted in seen)


class LookupModule(LookupBase):

    def run(self, terms, variables=None, **kwargs):
        self.set_options(var_options=variables, direct=kwargs)
        try:
            paths = closure(terms or [LAUNCHER])
        except (OSError, SyntaxError, ValueError) as exc:
            raise AnsibleLookupError("launcher_sources: %s" % exc)
        return [{"path": path, "src": os.path.join(MODULE_UTILS, path)} for path in paths]
