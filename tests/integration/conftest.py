"""Scheduling of the integration tests under pytest-xdist (`make integration` runs them with -n).

Most files share one costly set-up across their tests (a guest with a deployed model, a built
wheelhouse): a file's tests stay together on one worker (`--dist loadgroup`, the group being the
file) unless a test names its own group, as each Molecule scenario does.
"""
import pytest


def pytest_collection_modifyitems(items):
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(item.module.__name__))
