"""Every Molecule scenario (molecule/*/molecule.yml), each run whole by `molecule test -s NAME`.

They are tests of their own here so that `make test` schedules them next to the other guest-based
tests (pytest-xdist `--dist loadscope`: a test file's functions share a worker, each class here gets
its own) instead of after them: each mostly waits on its guests. `make molecule` still runs them directly. A scenario's guests are removed afterwards even
when Molecule itself could not (its destroy step failed, or the run was killed at the time limit).
"""
import os
import shutil
import subprocess

import pytest
import yaml

from tests.helpers import ROOT, TESTHOSTS, VENV_BIN

MOLECULE_DIR = os.path.join(ROOT, "molecule")
MOLECULE = os.path.join(VENV_BIN, "molecule")
# The longest scenario takes about 6 minutes on a quiet 2-core machine.
SCENARIO_TIMEOUT = 1500


def scenarios():
    return sorted(name for name in os.listdir(MOLECULE_DIR)
                  if os.path.isfile(os.path.join(MOLECULE_DIR, name, "molecule.yml")))


def guest_names(scenario):
    with open(os.path.join(MOLECULE_DIR, scenario, "molecule.yml")) as handle:
        return [platform["name"] for platform in yaml.safe_load(handle)["platforms"]]


pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0 or shutil.which("systemd-nspawn") is None,
                       reason="test hosts need root and systemd-nspawn (make system-deps)"),
]


def run_scenario(scenario):
    try:
        # Molecule runs ansible-config, ansible-playbook and pytest by name: the toolchain's, also
        # when this test is run outside `make`.
        env = dict(os.environ, PATH=os.path.dirname(MOLECULE) + os.pathsep + os.environ.get("PATH", ""))
        proc = subprocess.run([MOLECULE, "test", "-s", scenario], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, universal_newlines=True, timeout=SCENARIO_TIMEOUT)
    finally:
        subprocess.run([TESTHOSTS, "down"] + guest_names(scenario), stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
    # The end of Molecule's output names the failed step and shows its play.
    assert proc.returncode == 0, proc.stdout[-30000:]


# One class per scenario: `--dist loadscope` gives each class its own worker.
class TestDefault(object):
    def test_scenario_passes(self):
        run_scenario("default")


class TestDeploy(object):
    def test_scenario_passes(self):
        run_scenario("deploy")


class TestNotify(object):
    def test_scenario_passes(self):
        run_scenario("notify")


def test_every_scenario_has_its_class():
    classes = [name[len("Test"):].lower() for name in globals() if name.startswith("Test")]
    assert sorted(classes) == scenarios()
