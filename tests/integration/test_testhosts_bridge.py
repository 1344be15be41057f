"""The private bridge lives exactly as long as some guest runs (its own module: the guest of
test_testhosts.py lives for that whole module)."""
import os

import pytest

from test_testhosts import status, tool

pytestmark = pytest.mark.slow


def test_down_of_the_last_guest_removes_the_bridge():
    name = "mwt-last"
    others = [n for n, g in status().items() if g["state"] == "running"]
    if others:
        pytest.skip("other guests are running (%s): the bridge is theirs too" % ", ".join(others))
    try:
        tool("up", name)
        assert os.path.isdir("/sys/class/net/mwbr0")
    finally:
        tool("down", name)
    assert not os.path.exists("/sys/class/net/mwbr0")
