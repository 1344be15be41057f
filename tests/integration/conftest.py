"""The order in which pytest-xdist hands out the integration tests (`make integration`).

`--dist loadscope` keeps a file's tests on one worker (its guest and fixtures are built once) and
gives each class of test_molecule_scenarios.py a worker of its own. With `--no-loadscope-reorder` it
hands the scopes out in collection order, two per worker to begin with: the files that take
minutes go first, each followed on its worker by a short one, so that the longest is not the last
to start. Durations are from a 2-core machine; scopes not listed keep their usual order after these.
"""
import os

FIRST = [
    "test_vllm_deploy.py",                       # ~11 min: the real vLLM CPU build and its fault matrix
    "test_molecule_scenarios.py::TestDeploy",    # ~10 min: two guests, crash, reboots, rolling restart
    "test_deploy_lifecycle.py",                  # ~6 min: interrupted deploys, preflight, stop/start
    "test_timeline_playbook.py",                 # short ones, queued behind the three above
    "test_benchmark.py",
    "test_deploy_inventories.py",
    "test_sim_sglang_deploy.py",                 # ~5 min
    "test_molecule_scenarios.py::TestNotify",    # ~4 min
    "test_inference_env.py",                     # ~4 min
    "test_module_sim.py",                        # ~3 min
    "test_collection_install.py",                # ~2-3 min: a guest deployed by FQCN from the tarball
    "test_stacks_sim.py",                        # ~2-3 min, busy: ranks spinning in native calls
]


def scope(item):
    """xdist's loadscope unit of an item: its file, or its file and class."""
    parts = item.nodeid.split("::")
    name = os.path.basename(parts[0])
    return name + "::" + parts[1] if len(parts) > 2 else name


def pytest_collection_modifyitems(items):
    # A stable sort: the tests of one file keep their order (some build on the one before).
    items.sort(key=lambda item: FIRST.index(scope(item)) if scope(item) in FIRST else len(FIRST))
