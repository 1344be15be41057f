"""http_probe against a real http.server on loopback: refused, 503, 200, timeout, reset, auth."""
import json
import time

import pytest

from ansible_collections.modelwake.serving.plugins.module_utils.host import http_probe
from tests.helpers.http_server import SECRET, Server
from tests.helpers.network import free_port as closed_port


@pytest.fixture
def server():
    srv = Server()
    yield srv
    srv.close()


def test_refused_when_nothing_listens():
    result = http_probe.request("http://127.0.0.1:%d/health" % closed_port())
    assert result["kind"] == "refused"
    found = http_probe.probe_ready("http://127.0.0.1:%d" % closed_port())
    assert found["listening"] is False and found["ready"] is False and found["models"] is None


def test_status_codes_and_bodies(server):
    server.routes[("GET", "/health")] = (503, {"detail": "starting"})
    result = http_probe.request(server.url + "/health")
    assert (result["kind"], result["code"]) == ("status", 503)
    assert "starting" in result["body"]
    server.routes[("GET", "/health")] = (200, b"")
    assert http_probe.request(server.url + "/health")["code"] == 200


def test_slow_answer_is_a_timeout(server):
    server.routes[("GET", "/health")] = "hang"
    result = http_probe.request(server.url + "/health", timeout=0.3)
    assert result["kind"] == "timeout" and "0.3" in result["error"]


def test_reset_connection_is_an_error_with_text(server):
    server.routes[("GET", "/health")] = "reset"
    result = http_probe.request(server.url + "/health")
    assert result["kind"] == "error" and result["error"]


def test_api_key_is_sent_as_bearer_and_never_returned(server):
    server.routes[("GET", "/health")] = (200, b"")
    server.routes[("GET", "/v1/models")] = (200, {"data": [{"id": "kimi"}]})
    server.routes[("POST", "/v1/completions")] = (200, {"choices": [{"text": "4"}]})
    found = http_probe.probe_ready(server.url, api_key=SECRET)
    assert found["ready"] is True and found["model"] == "kimi"
    assert all(req["headers"]["Authorization"] == "Bearer " + SECRET for req in server.seen)
    assert SECRET not in json.dumps(found)


def test_completion_check_resolves_the_model_and_sends_the_agreed_request(server):
    server.routes[("GET", "/health")] = (200, b"")
    server.routes[("GET", "/v1/models")] = (200, {"object": "list", "data": [{"id": "/root/models/Kimi-K2.6"}, {"id": "x"}]})
    server.routes[("POST", "/v1/completions")] = (200, {"choices": [{"text": " 4"}]})
    found = http_probe.probe_ready(server.url + "/")
    assert found["ready"] is True
    post = [req for req in server.seen if req["method"] == "POST"][0]
    assert post["path"] == "/v1/completions"
    assert post["body"] == {"model": "/root/models/Kimi-K2.6", "prompt": "2+2=", "max_tokens": 4, "temperature": 0}


def test_given_model_skips_the_model_list(server):
    server.routes[("GET", "/health")] = (200, b"")
    server.routes[("POST", "/v1/completions")] = (200, {"choices": [{"text": "4"}]})
    assert http_probe.probe_ready(server.url, model="tiny")["ready"] is True
    assert [req["path"] for req in server.seen] == ["/health", "/v1/completions"]


def test_sglang_warming_up_models_200_is_not_ready_unless_models_is_the_check(server):
    server.routes[("GET", "/health")] = (503, b"")
    server.routes[("GET", "/v1/models")] = (200, {"data": [{"id": "kimi"}]})
    found = http_probe.probe_ready(server.url)
    assert found["listening"] is True and found["ready"] is False
    assert found["completion"] is None  # not asked while /health says 503
    # ready_check=models believes the static list (documented: SGLang answers it before ready).
    assert http_probe.probe_ready(server.url, ready_check="models")["ready"] is True
    assert http_probe.probe_ready(server.url, ready_check="health")["ready"] is False


def test_vllm_hung_engine_health_200_but_completion_times_out(server):
    server.routes[("GET", "/health")] = (200, b"")
    server.routes[("POST", "/v1/completions")] = "hang"
    found = http_probe.probe_ready(server.url, model="tiny", completion_timeout=0.3)
    assert found["health"]["code"] == 200
    assert found["completion"]["kind"] == "timeout"
    assert found["ready"] is False
    assert http_probe.probe_ready(server.url, ready_check="health")["ready"] is True


@pytest.mark.parametrize("answer", [(200, {"choices": []}), (200, b"not json"), (404, {"error": "model not found"})])
def test_completion_without_choices_is_not_ready(server, answer):
    server.routes[("GET", "/health")] = (200, b"")
    server.routes[("POST", "/v1/completions")] = answer
    assert http_probe.probe_ready(server.url, model="m")["ready"] is False


@pytest.mark.parametrize("model", [None, "tiny"])
def test_a_server_that_accepts_and_never_answers_costs_a_look_its_budget_once(server, model):
    for route in (("GET", "/health"), ("GET", "/v1/models"), ("POST", "/v1/completions")):
        server.routes[route] = "hang"
    started = time.monotonic()
    found = http_probe.probe_ready(server.url, model=model, health_timeout=0.5, completion_timeout=1.0)
    took = time.monotonic() - started
    # One budget for the look (the longer timeout, 1 s), shared: /health 0.5 s, then the model list or the
    # completion what is left of it; not 0.5 + 0.5 + 1 s.
    assert found["listening"] is True and found["health"]["kind"] == "timeout" and found["ready"] is False
    if model is None:
        assert found["models"]["kind"] == "timeout" and found["completion"] is None  # no model to ask about
    else:
        assert found["models"] is None and found["completion"]["kind"] == "timeout"
    assert 1.0 <= took < 1.0 + http_probe.MIN_REQUEST_SECONDS + 0.3, took


def test_a_slow_health_leaves_the_completion_its_turn(server):
    # SGLang's /health generates a token: under load it can outlast its timeout while a completion answers.
    server.routes[("GET", "/health")] = "hang"
    server.routes[("POST", "/v1/completions")] = (200, {"choices": [{"text": "4"}]})
    found = http_probe.probe_ready(server.url, model="tiny", health_timeout=0.3, completion_timeout=2.0)
    assert found["health"]["kind"] == "timeout" and found["ready"] is True


def test_a_looks_deadline_bounds_its_requests_together(server):
    server.routes[("GET", "/health")] = (200, b"")
    server.routes[("POST", "/v1/completions")] = "hang"
    started = time.monotonic()
    found = http_probe.probe_ready(server.url, model="tiny", completion_timeout=30.0, deadline=started + 1.0)
    took = time.monotonic() - started
    assert found["completion"]["kind"] == "timeout" and found["ready"] is False
    assert 1.0 <= took < 1.0 + http_probe.MIN_REQUEST_SECONDS + 0.5
