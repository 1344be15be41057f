"""library/completion_load.py without a server: docs = argument spec, input checks, percentiles."""

import pytest
import yaml
from ansible.module_utils import basic
from ansible.module_utils.testing import patch_module_args

from ansible_collections.modelwake.serving.plugins.modules import completion_load
from tests.helpers.modules import AnsibleFailJson, fail_json


def test_the_api_key_is_no_log():
    # That DOCUMENTATION and the argument spec agree is ansible-test sanity's (validate-modules).
    assert completion_load.ARGUMENT_SPEC["api_key"]["no_log"] is True



@pytest.mark.parametrize("values, p, expected", [
    ([3.0], 50, 3.0), ([3.0], 99, 3.0),
    ([1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 50, 5), ([1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 90, 9),
    ([1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 99, 10), ([10, 1, 5], 50, 5),
])
def test_percentile_is_nearest_rank(values, p, expected):
    assert completion_load.percentile(values, p) == expected


GOOD = {"url": "http://127.0.0.1:30001", "levels": [1, 2], "requests_per_level": 4, "max_tokens": 8,
        "level_timeout": 10.0, "request_timeout": 5.0}


@pytest.mark.parametrize("change, message", [
    ({"url": "http://10.0.0.5:30001"}, "url must be a loopback address (127.0.0.1, ::1, localhost): run the benchmark "
                                       "on the server itself; got host '10.0.0.5'"),
    # A DNS name that starts like a loopback address is not one: it can resolve anywhere.
    ({"url": "http://127.evil.example:30001"}, "url must be a loopback address (127.0.0.1, ::1, localhost): run "
                                               "the benchmark on the server itself; got host '127.evil.example'"),
    ({"url": "127.0.0.1:30001"}, "url must be http(s)://HOST:PORT, got '127.0.0.1:30001'"),
    ({"levels": []}, "levels must be a non-empty list of positive integers, got []"),
    ({"levels": [1, 0]}, "levels must be a non-empty list of positive integers, got [1, 0]"),
    ({"requests_per_level": 0}, "requests_per_level must be at least 1, got 0"),
    ({"max_tokens": -1}, "max_tokens must be at least 1, got -1"),
    ({"level_timeout": 0.0}, "level_timeout must be more than 0 seconds, got 0.0"),
])
def test_bad_input_names_the_field(change, message):
    with pytest.raises(completion_load.LoadError) as info:
        completion_load.check_params(dict(GOOD, **change))
    assert str(info.value) == message


@pytest.mark.parametrize("url", ["http://127.0.0.1:1", "http://localhost:8000", "http://[::1]:8000",
                                 "https://127.10.0.1:443"])
def test_loopback_urls_pass(url):
    completion_load.check_params(dict(GOOD, url=url))


def test_the_module_fails_at_once_and_sends_nothing(monkeypatch):
    monkeypatch.setattr(basic.AnsibleModule, "fail_json", fail_json)
    monkeypatch.setattr(completion_load, "_call", lambda *a, **k: pytest.fail("no request may be sent"))
    with patch_module_args({"url": "http://192.0.2.1:30001", "model": "k26"}):
        with pytest.raises(AnsibleFailJson) as info:
            completion_load.main()
    result = info.value.args[0]
    assert result["elapsed"] == 0 and result["levels"] == []
    assert result["msg"].startswith("url must be a loopback address")
