"""A real server whose port the process started binds and a forked worker serves, the shape of
uvicorn's or gunicorn's workers and of vLLM's API server processes: the listening socket belongs to
a child, never to the process a wait watches.

Run as a script (`python tests/helpers/forked_server.py [--warmup-seconds S]`; standard library
only, nothing imported from the tests): the parent binds a free loopback port and listens, forks
one worker that serves it, closes its own copy of the socket and waits for the worker. The worker
answers like the simulated engine's API: `/health` 503 for S seconds from the first request (a
warm-up), then 200; `/v1/models` lists MODEL; `POST /v1/completions` for MODEL answers a choice once
warm. The parent prints `<port> <worker pid>` once the worker serves. `start()` runs it for a test.
"""
import argparse
import json
import os
import socket
import subprocess
import sys
import time
from http.server import BaseHTTPRequestHandler, HTTPServer

MODEL = "forked-worker-model"


class Handler(BaseHTTPRequestHandler):
    warmup_seconds = 0.0
    warm_at = None  # time.monotonic() when the warm-up is over, from the first request on

    def log_message(self, *args):
        pass

    def _send(self, code, payload):
        data = json.dumps(payload).encode("utf-8")
        try:
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # a look that gave up (while a test held the process group stopped)

    def _warm(self):
        if Handler.warm_at is None:
            Handler.warm_at = time.monotonic() + self.warmup_seconds
        return time.monotonic() >= Handler.warm_at

    def do_GET(self):
        if self.path == "/health":
            return self._send(200 if self._warm() else 503, {})
        if self.path == "/v1/models":
            return self._send(200, {"object": "list", "data": [{"id": MODEL, "object": "model"}]})
        self._send(404, {"detail": "Not Found"})

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length) or b"{}")
        if self.path != "/v1/completions" or body.get("model") != MODEL:
            return self._send(404, {"detail": "Not Found"})
        if not self._warm():
            return self._send(503, {"error": {"message": "warming up"}})
        self._send(200, {"object": "text_completion", "model": MODEL,
                         "choices": [{"index": 0, "text": " 4", "finish_reason": "length"}]})


def serve(warmup_seconds):
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    Handler.warmup_seconds = warmup_seconds
    ready_r, ready_w = os.pipe()
    worker = os.fork()
    if worker == 0:
        os.close(ready_r)
        server = HTTPServer(listener.getsockname(), Handler, bind_and_activate=False)
        server.socket.close()
        server.socket = listener
        os.write(ready_w, b"1")
        os.close(ready_w)
        try:
            server.serve_forever(poll_interval=0.1)
        finally:
            os._exit(1)
    os.close(ready_w)
    port = listener.getsockname()[1]
    listener.close()  # the port is the worker's alone from here
    os.read(ready_r, 1)
    print(port, worker, flush=True)
    _, status = os.waitpid(worker, 0)
    return os.waitstatus_to_exitcode(status)


class Started(object):
    """The parent (pid, url: what a wait watches) and its worker, in a session of its own."""
    log_path = None  # it logs nothing

    def __init__(self, proc, port, worker):
        self.proc = proc
        self.pid = proc.pid
        self.port = port
        self.worker = worker
        self.url = "http://127.0.0.1:%d" % port

    def stop(self):
        try:
            os.killpg(self.pid, 9)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=10)


def start(warmup_seconds=0.0):
    """Start the server; stop it with .stop() (its whole process group)."""
    proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--warmup-seconds", str(warmup_seconds)],
                            stdout=subprocess.PIPE, universal_newlines=True, start_new_session=True)
    port, worker = proc.stdout.readline().split()
    return Started(proc, int(port), int(worker))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--warmup-seconds", type=float, default=0.0, help="/health 503 this long (default 0)")
    sys.exit(serve(parser.parse_args().warmup_seconds))
