"""The host's modelwake package, laid out as the model_service role installs it (tasks/launcher.yml).

The role's own entry files plus the module_utils files the launcher imports, as the collection's
launcher_sources lookup lists them: tests run the launcher from this copy, never from the source
tree, so a file the launcher needs but the role would not install fails them.
"""
import os
import shutil

from ansible_collections.modelwake.serving.plugins.lookup.launcher_sources import MODULE_UTILS, closure
from tests.helpers.paths import ROOT

ROLE_FILES = os.path.join(ROOT, "roles", "model_service", "files")


def install(dest):
    """Install into dest (the role's /opt/modelwake/lib); returns the PYTHONPATH entry, dest itself."""
    package = os.path.join(dest, "modelwake")
    files = [(os.path.join(ROLE_FILES, "modelwake", name), name) for name in ("__init__.py", "__main__.py")]
    files += [(os.path.join(MODULE_UTILS, path), path) for path in closure(["launcher.launch"])]
    for src, path in files:
        target = os.path.join(package, path)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copyfile(src, target)
    shutil.copyfile(os.path.join(ROLE_FILES, "modelwake-launch"), os.path.join(dest, "modelwake-launch"))
    return dest
