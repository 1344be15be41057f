"""HTTP probes of an inference server: what each endpoint says, and whether it really serves.

Every request has its own timeout and ends in one of four kinds:
  refused  nothing listens (SGLang and vLLM keep the port closed while loading);
  timeout  connected, no answer in time (a hung engine: vLLM's /health stays 200, but a
           completion hangs);
  error    DNS failure, reset, TLS and the like, with the reason as text;
  status   an HTTP answer: its code and the start of its body.

Ready checks (the `ready_check` option):
  completion  a real completion (`"2+2="`, 4 tokens, temperature 0) answered 200 with `choices`:
              the only check that proves the engine generates. Default.
  health      GET /health 200. SGLang answers 503 until its warm-up request succeeded; vLLM
              answers 200 as soon as the HTTP server runs and keeps 200 on a hung engine.
  models      GET /v1/models 200. SGLang serves this static list BEFORE it is ready (during
              warm-up): with SGLang it only proves the HTTP server runs.
The API key goes in `Authorization: Bearer` and never into a result or message. A result in words:
common.formatting.http_result.
"""
import json
import socket
import time

from urllib import error as urlerror
from urllib import request as urlrequest

HEALTH_TIMEOUT = 5.0
COMPLETION_TIMEOUT = 30.0
# The least a request is given when a look's deadline is (almost) reached: on loopback a serving
# server answers in milliseconds, and a request with no time at all would say nothing.
MIN_REQUEST_SECONDS = 0.25
BODY_CHARS = 300
COMPLETION_BODY = {"prompt": "2+2=", "max_tokens": 4, "temperature": 0}

# Never route the probes through an http_proxy from the environment: the server is local
# to this host or its network, and a proxy would answer for it.
_OPENER = urlrequest.build_opener(urlrequest.ProxyHandler({}))


def _is_timeout(exc):
    return isinstance(exc, (socket.timeout, TimeoutError)) or "timed out" in str(exc)


def request(url, method="GET", body=None, api_key=None, timeout=HEALTH_TIMEOUT):
    """One HTTP request; returns {"kind", "code", "body", "error"}. Never raises for I/O."""
    headers = {"Accept": "application/json"}
    data = None
    if body is not None:
        data = json.dumps(body).encode("utf-8")
        headers["Content-Type"] = "application/json"
    if api_key:
        headers["Authorization"] = "Bearer %s" % api_key
    req = urlrequest.Request(url, data=data, headers=headers, method=method)
    try:
        with _OPENER.open(req, timeout=timeout) as resp:
            code = resp.getcode()
            text = resp.read().decode("utf-8", "replace")
    except urlerror.HTTPError as exc:
        try:
            text = exc.read().decode("utf-8", "replace")
        except Exception:  # the body of an error answer may itself fail to arrive
            text = ""
        return {"kind": "status", "code": exc.code, "body": text[:BODY_CHARS], "error": None}
    except urlerror.URLError as exc:
        reason = exc.reason
        if isinstance(reason, ConnectionRefusedError):
            return {"kind": "refused", "code": None, "body": None, "error": "connection refused"}
        if _is_timeout(reason):
            return {"kind": "timeout", "code": None, "body": None, "error": "no answer in %g s" % timeout}
        return {"kind": "error", "code": None, "body": None, "error": str(reason)}
    except ConnectionRefusedError:
        return {"kind": "refused", "code": None, "body": None, "error": "connection refused"}
    except (socket.timeout, TimeoutError):
        return {"kind": "timeout", "code": None, "body": None, "error": "no answer in %g s" % timeout}
    except (OSError, ValueError) as exc:  # reset, remote closed, bad status line
        if _is_timeout(exc):
            return {"kind": "timeout", "code": None, "body": None, "error": "no answer in %g s" % timeout}
        return {"kind": "error", "code": None, "body": None, "error": "%s: %s" % (type(exc).__name__, exc)}
    return {"kind": "status", "code": code, "body": text, "error": None}


def _json(result):
    try:
        return json.loads(result["body"] or "")
    except ValueError:
        return None


def probe_ready(base_url, ready_check="completion", model=None, api_key=None,
                health_timeout=HEALTH_TIMEOUT, completion_timeout=COMPLETION_TIMEOUT, deadline=None, budget=None):
    """Ask the server whether it serves. Returns plain data:

    {"health": result, "models": result or None, "completion": result or None,
     "model": the model name used or None, "ready": bool, "listening": bool}
    /health is always asked first: it is cheap and tells a closed port from a warming server.
    The look's requests share one budget (`budget` seconds; None: the longer of the two timeouts), never
    past `deadline` (time.monotonic()): each waits at most its own timeout and what is left of the
    budget (MIN_REQUEST_SECONDS at least), so a server that accepts and never answers costs a look that
    budget once, not a timeout per endpoint. A slow /health (SGLang's generates a token) still leaves the
    completion its turn.
    """
    look_end = time.monotonic() + (max(health_timeout, completion_timeout) if budget is None else budget)
    if deadline is not None:
        look_end = min(look_end, deadline)

    def until_deadline(limit):
        left = look_end - time.monotonic()
        return limit if limit <= left else max(MIN_REQUEST_SECONDS, left)

    base = base_url.rstrip("/")
    found = {"health": None, "models": None, "completion": None, "model": model,
             "ready": False, "listening": False}
    # The full answer bodies stay here; the result keeps only their start (BODY_CHARS).
    health = request(base + "/health", timeout=until_deadline(health_timeout), api_key=api_key)
    found["health"] = _short(health)
    found["listening"] = health["kind"] in ("status", "timeout")
    if not found["listening"]:
        return found
    if ready_check == "health":
        found["ready"] = health["kind"] == "status" and health["code"] == 200
        return found
    if ready_check == "completion" and health["kind"] == "status" and health["code"] == 503:
        # SGLang warming up (or vLLM's dead engine): a completion would only wait or fail.
        return found
    if ready_check == "models" or model is None:
        models = request(base + "/v1/models", timeout=until_deadline(health_timeout), api_key=api_key)
        found["models"] = _short(models)
        if ready_check == "models":
            found["ready"] = models["kind"] == "status" and models["code"] == 200
            return found
        listed = _json(models) if models["kind"] == "status" and models["code"] == 200 else None
        ids = [m.get("id") for m in (listed or {}).get("data", []) if isinstance(m, dict)]
        if not ids:
            return found
        found["model"] = model = ids[0]
    body = dict(COMPLETION_BODY, model=model)
    completion = request(base + "/v1/completions", method="POST", body=body, api_key=api_key,
                         timeout=until_deadline(completion_timeout))
    found["completion"] = _short(completion)
    answer = _json(completion) if completion["kind"] == "status" and completion["code"] == 200 else None
    found["ready"] = isinstance(answer, dict) and bool(answer.get("choices"))
    return found


def _short(result):
    short = dict(result)
    if short["body"] is not None:
        short["body"] = short["body"][:BODY_CHARS]
    return short
