"""A real HTTP server on loopback whose answers a test scripts (the engine's /health, /v1/models,
/v1/completions, a webhook receiver), and what it was sent."""
import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

# An API key the tests send and then look for where it must never appear.
SECRET = "sk-test-do-not-log-3f9a"


class Server(object):
    """A loopback server whose answers the test scripts: routes[(method, path)] = (code, body) | "hang" | "reset"."""

    def __init__(self):
        self.routes = {}
        self.seen = []
        self.release = threading.Event()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _answer(self, method):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                owner.seen.append({"method": method, "path": self.path, "headers": dict(self.headers),
                                   "body": json.loads(body) if body else None})
                route = owner.routes.get((method, self.path), (404, {"error": "not found"}))
                if route == "hang":
                    owner.release.wait(10)
                    return
                if route == "reset":
                    self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                    self.connection.close()
                    return
                code, payload = route
                data = json.dumps(payload).encode() if not isinstance(payload, bytes) else payload
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                self._answer("GET")

            def do_POST(self):
                self._answer("POST")

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = "http://127.0.0.1:%d" % self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05})
        self.thread.start()

    def close(self):
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join()
