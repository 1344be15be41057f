"""The order in which pytest-xdist hands out the integration tests (`make integration`).

`--dist loadscope` keeps a file's tests on one worker (its guest and fixtures are built once) and
gives each class of test_molecule_scenarios.py a worker of its own. With `--no-loadscope-reorder` it
hands the scopes out in collection order, two per worker to begin with (one to each, then a second), then one more to a worker
when it starts its last: the files that take minutes go first, longest first, so that no long one is
the last to start (one started late leaves a single busy worker for minutes at the end). Durations
are worker-time from a cold run on a 2-core machine; scopes not listed keep their usual order after
these. A test that passed only on its rerun has its first failure printed at the end of the run.
"""
import os

FIRST = [
    # Longest first, one to each of the four workers, each followed on its worker by a short one; then
    # the rest longest first, to whichever worker frees up. Worker-time from the cold run of 2026-12-05.
    "test_vllm_deploy.py",                       # ~18 min: the caches, the real vLLM CPU build, its faults, its image
    "test_deploy_lifecycle.py",                  # ~11 min: interrupted deploys, preflight, stop/start
    "test_molecule_scenarios.py::TestDeploy",    # ~7 min: two guests, changed variable, rolling restart
    "test_podman_guest.py",                      # ~7 min: Podman, an image loaded, 7 deploys, the repair's image
    "test_timeline_playbook.py",                 # short ones, queued behind the four above
    "test_benchmark.py",
    "test_deploy_inventories.py",
    "test_file_tree.py",
    "test_history_guest.py",                     # ~5.5 min: seven starts and a real hang
    "test_inference_env.py",                     # ~4.5 min
    # A guest deploy that mostly waits on round trips (~3 min, one core mostly idle): handed out
    # early, its waits overlap the others' work instead of making the run's tail alone.
    "test_collection_install.py",
    "test_sim_sglang_deploy.py",                 # ~4 min
    "test_docker_guest.py",                      # ~4 min: Docker installed, an image loaded
    "test_molecule_scenarios.py::TestNotify",    # ~4 min
    "test_two_node.py",                          # ~3.5 min: two guests
    "test_module_sim.py",                        # ~2 min
    "test_inference_env_real.py",                # ~2 min: the real torch venv
    "test_hold_guest.py",
    "test_live_progress.py",
    "test_turns_guest.py",
    "test_stacks_sim.py",                        # busy: ranks spinning in native calls
    "test_molecule_scenarios.py::TestDefault",
]


def scope(item):
    """xdist's loadscope unit of an item: its file, or its file and class."""
    parts = item.nodeid.split("::")
    name = os.path.basename(parts[0])
    return name + "::" + parts[1] if len(parts) > 2 else name


def pytest_collection_modifyitems(items):
    # A stable sort: the tests of one file keep their order (some build on the one before).
    items.sort(key=lambda item: FIRST.index(scope(item)) if scope(item) in FIRST else len(FIRST))


# A test that failed and then passed its rerun still failed once: `-rR` only names it, so its failure
# is printed at the end of the run too, or the cause of a flaky test is lost with the green result.
RERUN_FAILURES = []


# Where each test's time fell in the run (MODELWAKE_TEST_TIMELINE, set by `make integration`): one
# tab-separated line per phase of a test - start, stop (epoch seconds), worker, phase, outcome, test -
# so that a run's idle tail or a late start can be traced to the test that made it.
TIMELINE = os.environ.get("MODELWAKE_TEST_TIMELINE")


def pytest_runtest_logreport(report):
    if report.outcome == "rerun":
        RERUN_FAILURES.append(report)
    if TIMELINE and "PYTEST_XDIST_WORKER" not in os.environ:  # the controller: every worker's reports
        worker = getattr(getattr(getattr(report, "node", None), "gateway", None), "id", "-")
        with open(TIMELINE, "a") as handle:
            handle.write("%.1f\t%.1f\t%s\t%s\t%s\t%s\n"
                         % (report.start, report.stop, worker, report.when, report.outcome, report.nodeid))


def pytest_terminal_summary(terminalreporter):
    if not RERUN_FAILURES:
        return
    terminalreporter.section("failed before passing on a rerun")
    for report in RERUN_FAILURES:
        terminalreporter.write_sep("_", report.nodeid)
        # The end holds the assertion and its message (a Molecule scenario's: its failed step).
        terminalreporter.write_line(report.longreprtext[-12000:])
