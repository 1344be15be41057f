"""The private bridge lives exactly as long as some guest runs (its own module: the guest of
test_testhosts.py lives for that whole module)."""
import os

import pytest

from tests.integration.test_testhosts import tool

pytestmark = pytest.mark.slow


def test_down_of_the_last_guest_removes_the_bridge():
    name = "mwt-last"
    ports = "/sys/class/net/mwbr0/brif"
    if os.path.isdir(ports) and os.listdir(ports):
        pytest.skip("other guests are on the bridge (%s): it is theirs too" % ", ".join(os.listdir(ports)))
    try:
        tool("up", name)
        assert os.path.isdir("/sys/class/net/mwbr0")
    finally:
        tool("down", name)
    assert not os.path.exists("/sys/class/net/mwbr0")
