"""The collection's layout rules: which module_utils package may import which, what runs on hosts.

plugins/module_utils is split by concern, each package allowed to import only the ones below it:

    common       errors, formatting, running commands             (nothing of ours)
    host         /proc, GPUs, logs, systemd, HTTP probes           common
    readiness    phases, classifier, STATUS= text, probe, waiter   common, host
    launcher     the Type=notify launcher, sd_notify               common, host, readiness
    preflight    GPU holders, model directory                      common, host
    python_env   venv facts, pip transactions                      common

Inside module_utils every import of our own code is relative (so the same files run on the host as
the launcher's `modelwake` package) and everything else is the standard library (managed hosts
have nothing more); modules import module_utils by FQCN. What runs on a managed host parses as
Python 3.9.
"""
import ast
import glob
import os
import re
import subprocess
import sys

import pytest
import yaml

from ansible_collections.modelwake.serving.plugins.lookup.launcher_sources import closure
from tests.helpers import ROOT, launcher_package

MODULE_UTILS = os.path.join(ROOT, "plugins", "module_utils")
FQCN_UTILS = "ansible_collections.modelwake.serving.plugins.module_utils"
ALLOWED = {
    "common": set(),
    "host": {"common"},
    "readiness": {"common", "host"},
    "launcher": {"common", "host", "readiness"},
    "preflight": {"common", "host"},
    "python_env": {"common"},
}
# Imported only when present, behind an ImportError guard. None today: NVML is the driver's own
# library, bound with ctypes (host/nvml.py).
OPTIONAL = {}


def utils_files():
    return sorted(os.path.relpath(p, MODULE_UTILS) for p in glob.glob(os.path.join(MODULE_UTILS, "*", "*.py")))


def imports(path):
    """(level, dotted module, imported names) of every import in the file, nested ones included."""
    with open(path) as handle:
        tree = ast.parse(handle.read(), path)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(0, alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            found.append((node.level, node.module or "", [alias.name for alias in node.names]))
    return found


def test_every_package_has_its_place_in_the_layering():
    packages = sorted(d for d in os.listdir(MODULE_UTILS) if os.path.isdir(os.path.join(MODULE_UTILS, d))
                      and d != "__pycache__")
    assert packages == sorted(ALLOWED)
    # Nothing at the top level: every file belongs to a concern.
    assert not [f for f in os.listdir(MODULE_UTILS) if f.endswith(".py")]


@pytest.mark.parametrize("path", utils_files())
def test_module_utils_import_only_the_packages_below_them_and_the_standard_library(path):
    package = path.split(os.sep)[0]
    for level, module, names in imports(os.path.join(MODULE_UTILS, path)):
        if level == 0:
            top = module.split(".")[0]
            assert top not in ("ansible", "ansible_collections", "modelwake"), \
                "%s: `import %s`: our code is imported relatively, Ansible never" % (path, module)
            assert top in sys.stdlib_module_names or top in OPTIONAL.get(path, ()), \
                "%s imports %s, which is not in the standard library" % (path, module)
        elif level == 1:
            continue  # its own package
        else:
            assert level == 2, "%s: a relative import reaches above module_utils" % path
            target = module.split(".")[0] if module else names[0]
            assert target in ALLOWED[package], "%s (%s) may not import %s: allowed %s" % (
                path, package, target, sorted(ALLOWED[package]) or "nothing of ours")


@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(ROOT, "plugins", "modules", "*.py"))),
                         ids=os.path.basename)
def test_modules_import_module_utils_by_fqcn_and_only_basic_from_ansible(path):
    for level, module, _names in imports(path):
        assert level == 0, "%s: a module cannot import relatively" % path
        if module.startswith("ansible_collections."):
            assert module.startswith(FQCN_UTILS + "."), "%s imports %s" % (path, module)
            assert module.split(".")[5] in ALLOWED
        elif module.split(".")[0] == "ansible":
            assert module == "ansible.module_utils.basic", "%s imports %s" % (path, module)


def test_the_launcher_needs_neither_preflight_nor_python_env_nor_followed_waits():
    files = closure(["launcher.launch"])
    assert "launcher/launch.py" in files and "readiness/classifier.py" in files
    assert "readiness/status.py" in files  # the writer of STATUS= uses the reader's definition
    assert not [f for f in files if f.startswith(("preflight/", "python_env/"))]
    assert "readiness/follow.py" not in files  # only the module's wait, followed from the controller


def test_the_launcher_runs_from_only_what_the_role_installs(tmp_path):
    lib = launcher_package.install(str(tmp_path))
    env = dict((k, v) for k, v in os.environ.items() if k != "PYTHONPATH")
    # As the unit runs it (the script's directory is sys.path[0]) and as `python -m modelwake launch`.
    for argv in ([sys.executable, os.path.join(lib, "modelwake-launch"), "--help"],
                 [sys.executable, "-m", "modelwake", "launch", "--help"]):
        proc = subprocess.run(argv, cwd=lib, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              universal_newlines=True, timeout=60)
        assert proc.returncode == 0 and "--stall-timeout" in proc.stdout, proc.stdout
    installed = sorted(os.path.relpath(p, os.path.join(lib, "modelwake"))
                       for p in glob.glob(os.path.join(lib, "modelwake", "**", "*.py"), recursive=True))
    assert installed == sorted(closure(["launcher.launch"]) + ["__init__.py", "__main__.py"])


# Exceptions that are not failures: control flow the code raises and catches itself.
SIGNALS = {"launcher/supervisor.py": {"StopRequested"}, "readiness/follow.py": {"ControllerGone"}}


def test_every_exception_of_ours_is_a_modelwake_error():
    """One hierarchy: a caller's `except ModelWakeError` catches every failure modelwake reports."""
    plugins = os.path.join(ROOT, "plugins")
    classes = {}  # name -> (file, base names)
    for path in glob.glob(os.path.join(plugins, "**", "*.py"), recursive=True):
        with open(path) as handle:
            tree = ast.parse(handle.read(), path)
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and node.bases:
                bases = [getattr(base, "id", getattr(base, "attr", "")) for base in node.bases]
                classes[node.name] = (os.path.relpath(path, MODULE_UTILS if "module_utils" in path else plugins),
                                      bases)

    def is_error(name, seen=()):
        if name == "ModelWakeError":
            return True
        if name not in classes or name in seen:
            return False
        return any(is_error(base, seen + (name,)) for base in classes[name][1])

    exceptions = [name for name, (path, bases) in classes.items()
                  if name.endswith(("Error", "Failed")) or "Exception" in bases]
    assert "LoadError" in exceptions and "SystemdError" in exceptions  # the walk sees modules and utils
    outside = [(classes[name][0], name) for name in exceptions
               if name != "ModelWakeError" and not is_error(name)
               and name not in SIGNALS.get(classes[name][0], set())]
    assert not outside, "exceptions outside ModelWakeError: %s" % outside


def managed_host_files():
    files = glob.glob(os.path.join(ROOT, "plugins", "modules", "*.py"))
    files += glob.glob(os.path.join(MODULE_UTILS, "**", "*.py"), recursive=True)
    files += glob.glob(os.path.join(ROOT, "roles", "model_service", "files", "modelwake", "*.py"))
    files.append(os.path.join(ROOT, "roles", "model_service", "files", "modelwake-launch"))
    return sorted(files)


def test_what_runs_on_managed_hosts_parses_as_python_3_9():
    # Managed hosts may run Python 3.9: no `match`, no parenthesised context managers.
    files = managed_host_files()
    assert len(files) > 30
    for path in files:
        with open(path) as handle:
            ast.parse(handle.read(), path, feature_version=(3, 9))


def role_files():
    return sorted(p for p in glob.glob(os.path.join(ROOT, "roles", "*", "**", "*"), recursive=True)
                  if os.path.isfile(p) and p.endswith((".yml", ".j2")))


@pytest.mark.parametrize("path", role_files(), ids=lambda p: os.path.relpath(p, ROOT))
def test_roles_reach_nothing_outside_themselves_or_the_collection(path):
    # No path arithmetic out of the role (role_path ~ '/../..'), no playbook's or inventory's
    # directory, no test settings from the environment (the tests' cache): those belong to the
    # inventories that need them (inventories/demo, the Molecule scenarios, the tests' own).
    with open(path) as handle:
        text = handle.read()
    for needle in ("role_path ~ '/..", "role_path }}/..", "playbook_dir", "inventory_dir", "MODELWAKE_CACHE",
                   "engines/sim"):
        assert needle not in text, "%s mentions %s" % (os.path.relpath(path, ROOT), needle)


@pytest.mark.parametrize("role", sorted(os.listdir(os.path.join(ROOT, "roles"))))
def test_every_include_of_a_role_is_tagged_with_the_role(role):
    with open(os.path.join(ROOT, "roles", role, "tasks", "main.yml")) as handle:
        tasks = yaml.safe_load(handle)
    includes = [t for t in tasks if any(k.endswith(("import_tasks", "include_tasks")) for k in t)]
    assert includes
    for task in includes:
        assert role in task.get("tags", []), "%s: %r has no tag %s" % (role, task["name"], role)


def every_role_file():
    return sorted(p for p in glob.glob(os.path.join(ROOT, "roles", "**", "*"), recursive=True) if os.path.isfile(p))


def test_the_roles_know_nothing_of_the_simulator():
    # roles/ holds what an operator deploys: the simulated engine is set up by the demo and test
    # inventories (generic options: extra wheel directories, the engine's command, read-write paths).
    simulator = re.compile(r"\bsim\b|modelwake[-_]sim|simulat", re.IGNORECASE)
    found = []
    for path in every_role_file():
        with open(path, errors="replace") as handle:
            for number, line in enumerate(handle, 1):
                if simulator.search(line):
                    found.append("%s:%d: %s" % (os.path.relpath(path, ROOT), number, line.strip()))
    assert every_role_file() and found == [], "\n".join(found)
