"""Where things are in the checkout, computed once from this file's place in it."""
import os

# tests/helpers/paths.py -> the repository root (also the modelwake.serving collection's root).
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# The controller toolchain (`make venv`): the tests run its Ansible, never one on the developer's PATH.
VENV_BIN = os.path.join(ROOT, ".venv", "bin")
ANSIBLE = os.path.join(VENV_BIN, "ansible")
ANSIBLE_PLAYBOOK = os.path.join(VENV_BIN, "ansible-playbook")

TOOLS = os.path.join(ROOT, "tools")
TESTHOSTS = os.path.join(TOOLS, "testhosts")
# The simulated engine's source: the PYTHONPATH of every `python -m modelwake_sim` a test starts.
SIM_PATH = os.path.join(ROOT, "engines", "sim")
# Where playbooks/demo-model.yml builds the simulator's wheels (tools/sim_wheels.py) for the test hosts,
# as inventories/demo names it: the suite's cache, outside the repository.
SIM_WHEELS = os.path.join(os.environ.get("MODELWAKE_CACHE") or os.path.expanduser("~/.cache/modelwake"), "sim-wheels")
# Test doubles (the fake NVML library and calls, the scripted nvidia-smi) and recorded data.
FAKES = os.path.join(ROOT, "tests", "fakes")
FIXTURES = os.path.join(ROOT, "tests", "fixtures")
