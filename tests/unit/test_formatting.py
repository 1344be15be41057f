"""common/formatting.py: the one place durations, sizes and HTTP answers are written (status, messages, progress)."""
import pytest

from ansible_collections.modelwake.serving.plugins.module_utils.common.formatting import GIB, MIB, duration, http_result, mib, size


@pytest.mark.parametrize("seconds, text", [
    (0, "0s"), (42, "42s"), (44.6, "45s"), (59.4, "59s"), (60, "1m00s"), (372, "6m12s"), (843, "14m03s"),
    (905, "15m05s"), (965, "16m05s"), (3600 + 125, "1h02m"), (5400, "1h30m"), (7260, "2h01m"), (-3, "0s"),
])
def test_duration(seconds, text):
    assert duration(seconds) == text


@pytest.mark.parametrize("count, digits, text", [
    (5 * MIB, 1, "5.0 MiB"), (412 * MIB, 0, "412 MiB"), (412.6 * MIB, 0, "413 MiB"), (0, 0, "0 MiB"),
    (GIB - 1, 1, "1024.0 MiB"), (GIB, 1, "1.0 GiB"), (3 * GIB, 0, "3.0 GiB"), (240 * GIB, 1, "240.0 GiB"),
])
def test_size(count, digits, text):
    assert size(count, mib_digits=digits) == text


def test_mib_stays_in_mib():
    assert mib(2.5 * GIB) == "2560.0 MiB" and mib(12.5 * MIB) == "12.5 MiB"


def test_http_result():
    assert http_result({"kind": "status", "code": 503}) == "503"
    assert http_result({"kind": "refused"}) == "refused"
    assert http_result({"kind": "timeout", "error": "no answer in 5 s"}) == "timeout (no answer in 5 s)"
    assert http_result(None) == "not asked"
