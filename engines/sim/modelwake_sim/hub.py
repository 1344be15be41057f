"""Model arrivals over the network: a hub download and a streamed load, both ends.

Client side (the ranks):
- `HubDownload`: what huggingface_hub's `snapshot_download` does on the wire and on disk. It asks
  `{HF_ENDPOINT}/api/models/{repo}/revision/{revision}` for the commit and its files, then for each
  file HEADs and GETs `{HF_ENDPOINT}/{repo}/resolve/{sha}/{file}`, writing the body into the hub
  cache's `blobs/<etag>.incomplete`, renamed to `blobs/<etag>` when complete, with a
  `snapshots/<sha>/<file>` symlink to it and `refs/<revision>` holding the sha. The body is received
  with recv_into() (urllib's HTTPResponse reads through socket.recv_into, as the library's requests
  stack does): the receiving process's rchar stays flat, only wchar / write_bytes and the
  `.incomplete` file grow.
- `stream_shard_slice`: what the Run:ai model streamer does against an HTTP object store: ranged
  GETs whose bodies are read with read(2) on the socket's descriptor (os.read): rchar grows,
  read_bytes stays flat, nothing is written.

Server side (tests and the demo): `HubServer`, a small standard-library HTTP server that serves a
`make-model` directory as a hub repository (the endpoints above) and as plain files by path
(`/{repo}/{file}`, with single Range requests) for the streamer; each connection is held to a rate,
and the whole server can stop sending after N body bytes with the connection left open (a network
stall: `python -m modelwake_sim hub DIR --repo org/name --stall-after-mib N`).
"""
import fcntl
import hashlib
import json
import os
import re
import socket
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MIB = 1024 * 1024
CHUNK = 1 * MIB
SEND_CHUNK = 64 * 1024
HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")


class HubError(Exception):
    """A download or stream that cannot go on; the message says what the server answered."""


# --- names and places ---------------------------------------------------------------------------
def is_hub_id(text):
    """True for `org/name` that is not an existing directory (what the engines then download)."""
    return bool(HUB_ID.match(text)) and not os.path.isdir(text)


def is_stream_url(text):
    return text.startswith("http://")


def cache_root(env=None):
    """The hub cache huggingface_hub uses: $HF_HUB_CACHE, else $HF_HOME/hub, else
    ~/.cache/huggingface/hub."""
    env = os.environ if env is None else env
    if env.get("HF_HUB_CACHE"):
        return env["HF_HUB_CACHE"]
    if env.get("HF_HOME"):
        return os.path.join(env["HF_HOME"], "hub")
    return os.path.join(os.path.expanduser("~"), ".cache", "huggingface", "hub")


def repo_folder_name(repo):
    """`org/name` -> `models--org--name`, the cache's folder for a model repository."""
    return "models--" + repo.replace("/", "--")


def human_binary(size):
    """humanize.naturalsize(size, binary=True), as the streamer's summary line writes sizes."""
    if size < 1024:
        return "%d Bytes" % size
    value = float(size)
    for unit in ("KiB", "MiB", "GiB", "TiB", "PiB"):
        value /= 1024.0
        if value < 1024 or unit == "PiB":
            return "%.1f %s" % (value, unit)


# --- the download (client) ------------------------------------------------------------------------
class HubDownload:
    """One repository's snapshot download into the hub cache (huggingface_hub's layout)."""

    def __init__(self, endpoint, repo, revision="main", cache=None, rate_mib=0.0, check=None):
        self.endpoint = endpoint.rstrip("/")
        self.repo = repo
        self.revision = revision
        self.cache = cache or cache_root()
        self.folder = os.path.join(self.cache, repo_folder_name(repo))
        self.rate = rate_mib * MIB if rate_mib else 0.0
        self.check = check or (lambda: None)  # called between chunks (faults, the parent's death)

    def info(self):
        """(sha, [file names]) of the revision."""
        url = "%s/api/models/%s/revision/%s" % (self.endpoint, self.repo, urllib.parse.quote(self.revision))
        with urllib.request.urlopen(url, timeout=30) as resp:
            body = json.loads(resp.read().decode("utf-8"))
        return body["sha"], [s["rfilename"] for s in body.get("siblings", [])]

    def snapshot(self, patterns=None):
        """Download the revision's files (those ending with one of `patterns`, or all); return the
        snapshot directory."""
        sha, files = self.info()
        if patterns:
            files = [f for f in files if f.endswith(tuple(patterns))]
        os.makedirs(os.path.join(self.folder, "refs"), exist_ok=True)
        # huggingface_hub records the revision's commit before it fetches the files.
        with open(os.path.join(self.folder, "refs", self.revision), "w") as fileobj:
            fileobj.write(sha)
        for name in files:
            self.download(sha, name)
        return os.path.join(self.folder, "snapshots", sha)

    def download(self, sha, name):
        """One file: HEAD for its etag, then GET into blobs/<etag>.incomplete, rename, link."""
        url = "%s/%s/resolve/%s/%s" % (self.endpoint, self.repo, sha, urllib.parse.quote(name))
        head = urllib.request.Request(url, method="HEAD")
        with urllib.request.urlopen(head, timeout=30) as resp:
            etag = (resp.headers.get("X-Linked-Etag") or resp.headers.get("ETag") or "").strip('"')
            etag = etag[2:].strip('"') if etag.startswith("W/") else etag
            expected = int(resp.headers.get("Content-Length") or -1)
        if not etag:
            raise HubError("no ETag for %s" % url)
        blobs = os.path.join(self.folder, "blobs")
        locks = os.path.join(self.cache, ".locks", repo_folder_name(self.repo))
        os.makedirs(blobs, exist_ok=True)
        os.makedirs(locks, exist_ok=True)
        blob = os.path.join(blobs, etag)
        with open(os.path.join(locks, etag + ".lock"), "w") as lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
            if not os.path.exists(blob):
                self._receive(url, blob + ".incomplete", expected)
                os.replace(blob + ".incomplete", blob)
        link = os.path.join(self.folder, "snapshots", sha, name)
        os.makedirs(os.path.dirname(link), exist_ok=True)
        if not os.path.islink(link):
            os.symlink(os.path.relpath(blob, os.path.dirname(link)), link)

    def _receive(self, url, path, expected):
        """GET the body into `path`: received with recv_into (HTTPResponse.readinto), written with
        write(2) as it arrives, paced to --download-rate-mib."""
        buf = bytearray(CHUNK)
        view = memoryview(buf)
        started = time.monotonic()
        done = 0
        with urllib.request.urlopen(url, timeout=None) as resp, open(path, "wb", buffering=0) as out:
            while True:
                self.check()
                got = resp.readinto(buf)
                if not got:
                    break
                out.write(view[:got])
                done += got
                if self.rate:
                    ahead = started + done / self.rate - time.monotonic()
                    if ahead > 0:
                        time.sleep(ahead)
        if expected >= 0 and done != expected:
            raise HubError("%s: received %d of %d bytes" % (url, done, expected))


def download_lock(repo, cache):
    """The file lock vLLM's get_lock takes around snapshot_download (in the temp directory, its
    name from the model id), so one rank downloads and the others wait, parked in flock(2)."""
    name = repo.replace("/", "-")
    path = os.path.join(tempfile.gettempdir(),
                        hashlib.sha256(("%s|%s" % (cache, name)).encode()).hexdigest()[:16] + name + ".lock")
    fileobj = open(path, "a")
    fcntl.flock(fileobj.fileno(), fcntl.LOCK_EX)
    return fileobj  # closing it releases the lock


# --- the streamed load (client) -------------------------------------------------------------------
class StreamConnection:
    """HTTP/1.1 GETs on one kept-alive TCP connection, every byte received with read(2) on the
    socket's descriptor, as the streamer's native reader does."""

    def __init__(self, url):
        parts = urllib.parse.urlsplit(url)
        self.host = parts.hostname
        self.port = parts.port or 80
        self.base = parts.path.rstrip("/")
        self.sock = socket.create_connection((self.host, self.port), timeout=None)
        self.fd = self.sock.fileno()
        self.pending = b""

    def close(self):
        self.sock.close()

    def _read(self, size):
        if self.pending:
            data, self.pending = self.pending[:size], self.pending[size:]
            return data
        return os.read(self.fd, size)

    def _headers(self):
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = self._read(4096)
            if not chunk:
                raise HubError("connection closed by %s:%d" % (self.host, self.port))
            data += chunk
        head, self.pending = data.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = {}
        for line in lines[1:]:
            key, _, value = line.partition(":")
            headers[key.strip().lower()] = value.strip()
        return status, headers

    def get(self, name, start=None, end=None, into=None, check=None):
        """GET `name` below the URL (bytes start..end-1 when given); return the body, or its length
        when `into(data)` takes the chunks instead."""
        request = "GET %s/%s HTTP/1.1\r\nHost: %s:%d\r\n" % (self.base, urllib.parse.quote(name), self.host, self.port)
        if start is not None:
            request += "Range: bytes=%d-%d\r\n" % (start, end - 1)
        self.sock.sendall((request + "\r\n").encode("latin-1"))
        status, headers = self._headers()
        if status not in (200, 206):
            raise HubError("GET %s/%s: HTTP %d" % (self.base, name, status))
        left = int(headers.get("content-length", "0"))
        parts, total = [], 0
        while left > 0:
            if check:
                check()
            chunk = self._read(min(CHUNK, left))
            if not chunk:
                raise HubError("connection closed by %s:%d after %d bytes" % (self.host, self.port, total))
            left -= len(chunk)
            total += len(chunk)
            if into:
                into(chunk)
            else:
                parts.append(chunk)
        return total if into else b"".join(parts)


# --- the server (tests, demo) ---------------------------------------------------------------------
class HubServer(ThreadingHTTPServer):
    """Serves one model directory as hub repository `repo`; see the module docstring."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, directory, repo, host="127.0.0.1", port=0, rate_mib=0.0, stall_after_bytes=None):
        self.directory = os.path.abspath(directory)
        self.repo = repo
        self.rate = rate_mib * MIB if rate_mib else 0.0
        self.stall_after_bytes = stall_after_bytes
        self.sent = 0
        self.sent_lock = threading.Lock()
        self.stalled = threading.Event()
        self.closing = threading.Event()
        self._etags = {}
        self.files = sorted(n for n in os.listdir(self.directory)
                            if os.path.isfile(os.path.join(self.directory, n)) and not n.endswith(".tmp"))
        digest = hashlib.sha1(repo.encode())
        for name in self.files:
            digest.update(("%s %d\n" % (name, os.path.getsize(os.path.join(self.directory, name)))).encode())
        self.sha = digest.hexdigest()
        ThreadingHTTPServer.__init__(self, (host, port), HubHandler)

    def handle_error(self, request, client_address):
        """A client that went away mid-request (an engine killed while downloading) is routine here."""
        if not isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            ThreadingHTTPServer.handle_error(self, request, client_address)

    @property
    def url(self):
        return "http://%s:%d" % self.server_address[:2]

    def etag(self, name):
        """The file's sha256, the etag the hub gives a large (LFS) file; computed once."""
        if name not in self._etags:
            digest = hashlib.sha256()
            with open(os.path.join(self.directory, name), "rb") as fileobj:
                for block in iter(lambda: fileobj.read(CHUNK), b""):
                    digest.update(block)
            self._etags[name] = digest.hexdigest()
        return self._etags[name]

    def allowance(self, want):
        """Bytes the server may still send (the stall), reserving them."""
        with self.sent_lock:
            if self.stall_after_bytes is not None:
                want = max(0, min(want, self.stall_after_bytes - self.sent))
            self.sent += want
            return want

    def start(self):
        threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True).start()
        return self

    def stop(self):
        self.closing.set()
        self.shutdown()
        self.server_close()


class HubHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "modelwake-sim-hub"

    def log_message(self, fmt, *args):
        pass

    def _json(self, code, body):
        data = json.dumps(body).encode("utf-8")
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _route(self):
        """(file name, hub headers?) for a file request, None after answering anything else."""
        server = self.server
        path = urllib.parse.unquote(self.path.split("?", 1)[0])
        info = "/api/models/%s/revision/" % server.repo
        if path.startswith(info):
            self._json(200, {"id": server.repo, "modelId": server.repo, "sha": server.sha,
                             "siblings": [{"rfilename": n} for n in server.files]})
            return None
        prefix = "/%s/" % server.repo
        rest = path[len(prefix):] if path.startswith(prefix) else None
        if rest is not None and rest.startswith("resolve/"):
            revision, _, name = rest[len("resolve/"):].partition("/")
            if revision in ("main", server.sha) and name in server.files:
                return name, True
        elif rest in server.files:
            return rest, False
        self._json(404, {"error": "Entry not found"})
        return None

    def do_HEAD(self):
        self.do_GET()

    def do_GET(self):
        route = self._route()
        if route is None:
            return
        name, hub = route
        server = self.server
        path = os.path.join(server.directory, name)
        size = os.path.getsize(path)
        start, end = 0, size
        ranged = self.headers.get("Range", "")
        match = re.match(r"bytes=(\d+)-(\d*)$", ranged)
        if match:
            start = int(match.group(1))
            end = min(size, int(match.group(2)) + 1) if match.group(2) else size
        self.send_response(206 if match else 200)
        self.send_header("Content-Length", str(end - start))
        self.send_header("Content-Type", "application/octet-stream")
        if hub:
            etag = server.etag(name)
            self.send_header("ETag", '"%s"' % etag)
            self.send_header("X-Linked-Etag", '"%s"' % etag)
            self.send_header("X-Repo-Commit", server.sha)
            self.send_header("X-Linked-Size", str(size))
        if match:
            self.send_header("Content-Range", "bytes %d-%d/%d" % (start, end - 1, size))
        self.end_headers()
        if self.command == "HEAD":
            return
        self._send_body(path, start, end)

    def _send_body(self, path, start, end):
        """The body in chunks, paced per connection; at the stall, stop sending and hold the
        connection open (until the server closes)."""
        server = self.server
        began = time.monotonic()
        sent = 0
        with open(path, "rb") as fileobj:
            fileobj.seek(start)
            while start + sent < end:
                want = server.allowance(min(SEND_CHUNK, end - start - sent))
                if not want:
                    server.stalled.set()
                    server.closing.wait()
                    return
                data = fileobj.read(want)
                try:
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    return
                sent += len(data)
                if server.rate:
                    ahead = began + sent / server.rate - time.monotonic()
                    if ahead > 0:
                        time.sleep(ahead)


def serve(directory, repo, host, port, rate_mib, stall_after_mib):
    """`python -m modelwake_sim hub`: serve until interrupted."""
    stall = int(stall_after_mib * MIB) if stall_after_mib is not None else None
    server = HubServer(directory, repo, host, port, rate_mib, stall)
    print("modelwake_sim hub: %s as %s on %s (HF_ENDPOINT=%s; streamer URL %s/%s)"
          % (server.directory, repo, server.url, server.url, server.url, repo), flush=True)
    try:
        server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    return 0
