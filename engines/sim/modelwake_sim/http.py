"""The HTTP front end: SGLang's and vLLM's endpoints with their start-up semantics.

The `app` object (engine.ApiServer) decides what is true now: `state` is "warmup" (SGLang: port
open, /health 503), "ready" or "dead"; `generate()` goes to the rank-0 process and blocks until it
answers (a hung or stopped worker means the request never returns, as with the real engines).
"""
import json
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from . import textgen

_REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found",
            500: "Internal Server Error", 503: "Service Unavailable"}
# SGLang exempts only these from --api-key; vLLM guards only /v1 (and /v2, /inference, ...).
_SGLANG_OPEN = ("/health", "/health_generate", "/metrics", "/ping")
_VLLM_GUARDED = ("/v1", "/v2", "/inference", "/cohere")


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "uvicorn"
    sys_version = ""
    app = None  # set by engine.ApiServer through a subclass

    # --- plumbing -----------------------------------------------------------------------------
    def log_request(self, code="-", size="-"):
        if not self.app.access_log:
            return
        code = int(code) if str(code).isdigit() else 0
        self.app.log.uvicorn('%s:%d - "%s" %d %s' % (self.client_address[0], self.client_address[1],
                                                     self.requestline, code, _REASONS.get(code, "")))

    def log_message(self, fmt, *args):  # http.server's own chatter is not part of uvicorn's output
        pass

    def _send(self, code, body, content_type="application/json"):
        data = body if isinstance(body, bytes) else json.dumps(body).encode("utf-8")
        try:
            self.send_response(code)
            self.send_header("content-type", content_type)
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass

    def _authorised(self):
        key = self.app.api_key
        if not key:
            return True
        path = self.path.split("?", 1)[0]
        if self.app.engine == "sglang":
            guarded = path not in _SGLANG_OPEN
        else:
            guarded = any(path == p or path.startswith(p + "/") for p in _VLLM_GUARDED)
        if not guarded:
            return True
        if self.headers.get("Authorization", "") == "Bearer " + key:
            return True
        self._send(401, {"error": "Unauthorized"})
        return False

    def _body(self):
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw.decode("utf-8") or "{}")
        except ValueError:
            self._send(400, self._error("Invalid JSON body", "BadRequestError", 400))
            return None
        if not isinstance(body, dict):
            self._send(400, self._error("The request body must be a JSON object", "BadRequestError", 400))
            return None
        return body

    def _error(self, message, kind, code):
        return {"error": {"message": message, "type": kind, "param": None, "code": code}}

    # --- routes -------------------------------------------------------------------------------
    def do_GET(self):
        if not self._authorised():
            return
        path = self.path.split("?", 1)[0]
        app = self.app
        if path in ("/health", "/health_generate", "/ping"):
            self._send(*app.health(), content_type="application/json")
        elif path == "/v1/models":
            self._send(200, {"object": "list", "data": [{
                "id": app.served_model_name, "object": "model", "created": int(app.started_wall),
                "owned_by": app.engine, "root": app.model_path, "parent": None,
                "max_model_len": app.max_model_len}]})
        elif path == "/get_model_info" and app.engine == "sglang":
            self._send(200, {"model_path": app.model_path, "tokenizer_path": app.model_path,
                             "is_generation": True, "preferred_sampling_params": None,
                             "weight_version": "default"})
        elif path == "/get_server_info" and app.engine == "sglang":
            self._send(200, {"model_path": app.model_path, "tp_size": app.opts.tp, "port": app.opts.port,
                             "version": app.version, "internal_states": [{"status": app.state}]})
        elif path == "/version":
            self._send(200, {"version": app.version})
        elif path == "/metrics":
            self._send(200, app.metrics().encode("utf-8"), content_type="text/plain; version=0.0.4")
        else:
            self._send(404, {"detail": "Not Found"})

    def do_POST(self):
        if not self._authorised():
            return
        path = self.path.split("?", 1)[0]
        if path not in ("/v1/completions", "/v1/chat/completions", "/generate"):
            self._send(404, {"detail": "Not Found"})
            return
        body = self._body()
        if body is None:
            return
        app = self.app
        allowed = ("ready", "warmup") if path == "/generate" else ("ready",)
        if app.state not in allowed:
            code = 500 if app.state == "dead" else 503
            self._send(code, self._error("The server is not ready yet (state: %s)" % app.state,
                                         "ServiceUnavailableError", code))
            return
        if body.get("stream"):
            self._send(400, self._error("stream=true is not supported by the simulated engine", "BadRequestError", 400))
            return
        if path == "/generate":
            self._generate(body)
            return
        model = body.get("model") or app.served_model_name
        if app.engine == "vllm" and model != app.served_model_name:
            self._send(404, self._error("The model `%s` does not exist." % model, "NotFoundError", 404))
            return
        max_tokens = body.get("max_tokens", body.get("max_completion_tokens", 16))
        if not isinstance(max_tokens, int) or max_tokens < 0:
            self._send(400, self._error("max_tokens must be a non-negative integer", "BadRequestError", 400))
            return
        if path == "/v1/completions":
            prompt = body.get("prompt", "")
            prompts = prompt if isinstance(prompt, list) else [prompt]
            if not all(isinstance(p, str) for p in prompts):
                self._send(400, self._error("prompt must be a string or a list of strings", "BadRequestError", 400))
                return
        else:
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages:
                self._send(400, self._error("messages must be a non-empty list", "BadRequestError", 400))
                return
            last = messages[-1] if isinstance(messages[-1], dict) else {}
            prompts = [str(last.get("content", ""))]
        choices, prompt_tokens, completion_tokens = [], 0, 0
        for index, prompt in enumerate(prompts):
            result = app.generate(prompt, max_tokens)
            if result is None:
                self._send(500, self._error("EngineCore encountered an issue. See stack trace for the root cause.",
                                            "EngineDeadError", 500))
                return
            tokens, finish = result
            prompt_tokens += textgen.count_tokens(prompt)
            completion_tokens += len(tokens)
            text = textgen.join_tokens(tokens)
            if path == "/v1/completions":
                choices.append({"index": index, "text": text, "logprobs": None, "finish_reason": finish,
                                "stop_reason": None})
            else:
                choices.append({"index": index, "message": {"role": "assistant", "content": text},
                                "logprobs": None, "finish_reason": finish, "stop_reason": None})
        kind = "text_completion" if path == "/v1/completions" else "chat.completion"
        prefix = "cmpl-" if path == "/v1/completions" else "chatcmpl-"
        self._send(200, {"id": prefix + uuid.uuid4().hex, "object": kind, "created": int(time.time()),
                         "model": model, "choices": choices,
                         "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                                   "total_tokens": prompt_tokens + completion_tokens}})

    def _generate(self, body):
        """SGLang's native /generate (its own warm-up request uses it)."""
        text = body.get("text", "")
        params = body.get("sampling_params") or {}
        max_new = params.get("max_new_tokens", 128)
        result = self.app.generate(str(text), int(max_new))
        if result is None:
            self._send(500, {"error": {"message": "engine dead"}})
            return
        tokens, finish = result
        self._send(200, {"text": textgen.join_tokens(tokens), "meta_info": {
            "prompt_tokens": textgen.count_tokens(str(text)), "completion_tokens": len(tokens),
            "finish_reason": {"type": finish}, "cached_tokens": 0}})
