#!/usr/bin/python
# Copyright: (c) modelwake contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Ansible module: concurrent completions against a loopback OpenAI-compatible server, per level."""
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: completion_load
short_description: Measure completion throughput and latency at several concurrency levels
description:
  - Sends C(max_tokens)-token completions to C(url)/v1/completions with 1, 2, 4, ... requests in
    flight and reports, per level, output tokens per second and request latency percentiles.
  - Bounded in count and time per level, and only to a loopback address (run it on the server
    itself). It is a check of a server you run, not a load test of someone else's.
  - Changes nothing on the host; check mode still measures (it only reads).
version_added: "0.1.0"
extends_documentation_fragment:
  - modelwake.serving.server
options:
  # The server fragment's url, narrowed: this module only sends to loopback.
  url:
    description: Base URL of the server, on loopback (C(http://127.0.0.1:30001)).
    type: str
    required: true
  model:
    description: Model id for the requests. Empty means the first id of C(/v1/models).
    type: str
    default: ""
  levels:
    description: Concurrency levels, each a positive number of requests in flight.
    type: list
    elements: int
    default: [1, 2, 4, 8, 16, 32]
  requests_per_level:
    description: Requests sent at each level; at least the level itself (every slot gets one).
    type: int
    default: 64
  max_tokens:
    description: Tokens asked of each completion (C(temperature 0)).
    type: int
    default: 64
  prompt:
    description: Prompt of every request.
    type: str
    default: "Describe what a model server does while it loads its weights."
  level_timeout:
    description: Seconds a level may take; requests not yet sent by then are not sent.
    type: float
    default: 120
  request_timeout:
    description: Seconds one request may take before it counts as an error.
    type: float
    default: 60
author: modelwake contributors (@modelwake)
"""

EXAMPLES = r"""
- name: Measure throughput of the model service
  modelwake.serving.completion_load:
    url: http://127.0.0.1:30001
    model: k26
    levels: [1, 2, 4, 8, 16, 32]
    requests_per_level: 64
    max_tokens: 64
  register: modelwake_benchmark_load
"""

RETURN = r"""
levels:
  description: One entry per level, in the order given.
  returned: always
  type: list
  elements: dict
  sample: [{"concurrency": 32, "requests": 64, "ok": 64, "errors": 0, "completion_tokens": 4096,
            "seconds": 4.2, "tokens_per_s": 975.2, "requests_per_s": 15.2,
            "latency_p50": 2.01, "latency_p90": 2.05, "latency_p99": 2.07, "error_samples": []}]
model:
  description: The model id the requests used.
  returned: always
  type: str
elapsed:
  description: Seconds the whole measurement took.
  returned: always
  type: int
"""

import json
import math
import threading
import time
from urllib import parse as urlparse

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.modelwake.serving.plugins.module_utils.common.addresses import is_loopback
from ansible_collections.modelwake.serving.plugins.module_utils.common.errors import ModelWakeError
from ansible_collections.modelwake.serving.plugins.module_utils.common.formatting import http_result
from ansible_collections.modelwake.serving.plugins.module_utils.host import http_probe


class LoadError(ModelWakeError):
    """Bad input or an unusable server; the message names the field or what failed."""


def percentile(values, p):
    """Nearest-rank percentile (p in 0..100) of a non-empty list; the value a request really took."""
    ordered = sorted(values)
    rank = max(1, int(math.ceil(p / 100.0 * len(ordered))))
    return ordered[rank - 1]


def check_params(params):
    """Validate up front; raise LoadError naming the field and how to fix it."""
    parsed = urlparse.urlsplit(params["url"] or "")
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise LoadError("url must be http(s)://HOST:PORT, got %r" % params["url"])
    if not is_loopback(parsed.hostname):
        raise LoadError("url must be a loopback address (127.0.0.1, ::1, localhost): run the benchmark on "
                        "the server itself; got host %r" % parsed.hostname)
    if not params["levels"] or any(level < 1 for level in params["levels"]):
        raise LoadError("levels must be a non-empty list of positive integers, got %r" % (params["levels"],))
    for name in ("requests_per_level", "max_tokens"):
        if params[name] < 1:
            raise LoadError("%s must be at least 1, got %r" % (name, params[name]))
    for name in ("level_timeout", "request_timeout"):
        if params[name] <= 0:
            raise LoadError("%s must be more than 0 seconds, got %r" % (name, params[name]))


class RequestFailed(ModelWakeError):
    """No 200 answer: refused, timed out, or an HTTP error code (`HTTP Error 404: ...`)."""


def _call(url, path, api_key, payload=None, timeout=30.0):
    """The JSON of a 200 answer (readiness's HTTP code: no proxy, the key only in the header)."""
    result = http_probe.request(url.rstrip("/") + path, method="GET" if payload is None else "POST", body=payload,
                                api_key=api_key, timeout=timeout)
    if result["kind"] != "status":
        raise RequestFailed(http_result(result))
    if result["code"] != 200:
        raise RequestFailed("HTTP Error %d: %s" % (result["code"], (result["body"] or "")[:200]))
    return json.loads(result["body"])


def first_model(url, api_key, timeout):
    try:
        models = _call(url, "/v1/models", api_key, timeout=timeout)
        return models["data"][0]["id"]
    except (RequestFailed, ValueError, KeyError, IndexError, TypeError) as exc:
        raise LoadError("model is empty and %s/v1/models gave no model id (%s): set model" % (url, exc))


def run_level(url, model, api_key, concurrency, requests, max_tokens, prompt, level_timeout, request_timeout,
              clock=time.monotonic):
    """`requests` completions with `concurrency` in flight, none sent after `level_timeout`."""
    lock = threading.Lock()
    state = {"left": max(requests, concurrency), "sent": 0}
    latencies, tokens, errors = [], [], []
    start = clock()
    deadline = start + level_timeout
    payload = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}

    def worker():
        while True:
            with lock:
                if state["left"] <= 0 or clock() >= deadline:
                    return
                state["left"] -= 1
                state["sent"] += 1
            sent = clock()
            try:
                answer = _call(url, "/v1/completions", api_key, payload,
                               timeout=request_timeout)
                count = int(answer["usage"]["completion_tokens"])
            except (RequestFailed, ValueError, KeyError, TypeError) as exc:
                with lock:
                    errors.append("%s: %s" % (type(exc).__name__, exc))
                continue
            with lock:
                latencies.append(clock() - sent)
                tokens.append(count)

    threads = [threading.Thread(target=worker) for dummy in range(concurrency)]
    for thread in threads:
        thread.daemon = True
        thread.start()
    for thread in threads:
        thread.join()
    seconds = max(clock() - start, 1e-9)
    level = {"concurrency": concurrency, "requests": state["sent"], "ok": len(latencies), "errors": len(errors),
             "completion_tokens": sum(tokens), "seconds": round(seconds, 3),
             "tokens_per_s": round(sum(tokens) / seconds, 1), "requests_per_s": round(len(latencies) / seconds, 2),
             "error_samples": errors[:3]}
    for p in (50, 90, 99):
        level["latency_p%d" % p] = round(percentile(latencies, p), 3) if latencies else None
    return level


def measure(params, clock=time.monotonic):
    """All levels in order; returns (model, levels)."""
    check_params(params)
    model = params["model"] or first_model(params["url"], params.get("api_key"), params["request_timeout"])
    levels = []
    for concurrency in params["levels"]:
        levels.append(run_level(params["url"], model, params.get("api_key"), concurrency,
                                params["requests_per_level"], params["max_tokens"], params["prompt"],
                                params["level_timeout"], params["request_timeout"], clock=clock))
    return model, levels


ARGUMENT_SPEC = dict(
    url=dict(type="str", required=True),
    model=dict(type="str", default=""),
    api_key=dict(type="str", no_log=True),
    levels=dict(type="list", elements="int", default=[1, 2, 4, 8, 16, 32]),
    requests_per_level=dict(type="int", default=64),
    max_tokens=dict(type="int", default=64, no_log=False),
    prompt=dict(type="str", default="Describe what a model server does while it loads its weights."),
    level_timeout=dict(type="float", default=120),
    request_timeout=dict(type="float", default=60),
)


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    start = time.monotonic()
    try:
        model, levels = measure(module.params)
    except LoadError as exc:
        module.fail_json(msg=str(exc), elapsed=int(round(time.monotonic() - start)), levels=[])
    elapsed = int(round(time.monotonic() - start))
    empty = [level for level in levels if not level["ok"]]
    if empty:
        module.fail_json(msg="no completion answered at concurrency %s (first errors: %s)"
                         % (", ".join(str(level["concurrency"]) for level in empty), empty[0]["error_samples"]),
                         levels=levels, model=model, elapsed=elapsed)
    module.exit_json(changed=False, levels=levels, model=model, elapsed=elapsed)


if __name__ == "__main__":
    main()
