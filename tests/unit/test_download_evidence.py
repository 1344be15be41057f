"""A real download seen by the host readers: a child process fetches a file from a local HTTP
server this test runs (serving from outside the watched cache) into a real hub-cache layout, the
way huggingface_hub does (recv() on the socket, writes to blobs/<etag>.<tag>.incomplete, rename when
complete). HostProbe in pid mode sees the tree's write_bytes/wchar and the .incomplete file grow,
rchar stay flat, and nothing grow while the server holds the rest back. The server sends one chunk
per release by the test: no sleeping."""
import hashlib
import http.server
import os
import subprocess
import sys
import threading

import pytest

from ansible_collections.modelwake.serving.plugins.module_utils.readiness.probe import HostProbe

from tests.helpers.fakes import fresh_nvml_api
from tests.helpers.network import free_port as closed_port
from tests.helpers.traces import config

MIB = 1024 * 1024
CHUNK = 2 * MIB
CHUNKS = 4

# The engine's download, as huggingface_hub's http_get does it: stream the body into the
# process-unique .incomplete file, then rename it to the blob. It says after each chunk.
DOWNLOADER = r"""
import os, sys, urllib.request
url, blobs, etag, chunk = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
os.makedirs(blobs, exist_ok=True)
incomplete = os.path.join(blobs, etag + ".1a2b3c4d.incomplete")
with urllib.request.urlopen(url) as response, open(incomplete, "wb") as out:
    print("connected", flush=True)  # imports done, headers in: from here on, only the download
    while True:
        data = response.read(chunk)
        if not data:
            break
        out.write(data)
        out.flush()
        print("got %d" % out.tell(), flush=True)
os.rename(incomplete, os.path.join(blobs, etag))
print("done", flush=True)
"""


class PacedServer(object):
    """Serves one file, one chunk per release(); the file lives outside the cache being watched."""

    def __init__(self, path):
        self.path = path
        self.allowed = threading.Semaphore(0)
        paced = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                size = os.path.getsize(paced.path)
                self.send_response(200)
                self.send_header("Content-Length", str(size))
                self.end_headers()
                with open(paced.path, "rb") as handle:
                    while True:
                        data = handle.read(CHUNK)
                        if not data:
                            break
                        paced.allowed.acquire()
                        try:
                            self.wfile.write(data)
                            self.wfile.flush()
                        except (BrokenPipeError, ConnectionResetError):
                            return  # the downloader was killed: the test has failed already

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def url(self):
        return "http://127.0.0.1:%d/model-00001-of-00001.safetensors" % self.server.server_address[1]

    def close(self):
        for _ in range(CHUNKS):
            self.allowed.release()  # a handler still waiting finishes
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def fake_nvml():
    module = fresh_nvml_api()
    module.configure([])
    return module


def test_a_download_into_the_hub_cache_is_seen_growing_and_seen_stopping(tmp_path, fake_nvml):
    served = tmp_path / "origin" / "model.safetensors"
    served.parent.mkdir()
    served.write_bytes(os.urandom(CHUNK * CHUNKS))
    etag = hashlib.sha256(served.read_bytes()).hexdigest()
    cache = tmp_path / "hf" / "hub"
    blobs = cache / "models--org--tiny-model" / "blobs"
    server = PacedServer(str(served))
    child = subprocess.Popen([sys.executable, "-c", DOWNLOADER, server.url(), str(blobs), etag, str(CHUNK)],
                             stdout=subprocess.PIPE, universal_newlines=True,
                             env=dict(os.environ, HF_HOME=str(tmp_path / "hf")))
    try:
        assert child.stdout.readline().strip() == "connected"
        probe = HostProbe(config(pid=child.pid, url="http://127.0.0.1:%d" % closed_port()), nvml=fake_nvml)
        looks = [probe.snapshot(0.0)]
        for number in (1, 2):
            server.allowed.release()
            assert child.stdout.readline().split() == ["got", str(number * CHUNK)]
            looks.append(probe.snapshot(float(number)))
        for before, after in zip(looks, looks[1:]):
            grown = dict((name, getattr(after.process, name) - getattr(before.process, name)) for name in ("write_bytes", "wchar", "rchar"))
            assert grown["wchar"] >= CHUNK and grown["write_bytes"] >= CHUNK
            assert grown["rchar"] < CHUNK // 4  # the socket is read with recv(): not in rchar
            assert after.downloads["bytes"] - before.downloads["bytes"] == CHUNK
        (download,) = looks[-1].downloads["files"]
        assert download["repo"] == "org/tiny-model" and download["blob"] == etag
        assert download["bytes"] == 2 * CHUNK and download["file"] is None and looks[-1].downloads["expected"] is None
        assert looks[-1].downloads["caches"] == [str(cache)]
        # The server holds the rest back: the socket stays open, nothing grows.
        held = probe.snapshot(3.0)
        assert held.downloads["bytes"] == 2 * CHUNK and held.process.alive is True
        assert held.process.wchar == looks[-1].process.wchar
        assert held.process.write_bytes == looks[-1].process.write_bytes
        for _ in range(CHUNKS - 2):
            server.allowed.release()
        assert child.stdout.readlines()[-1].strip() == "done"
        assert child.wait() == 0
        assert (blobs / etag).stat().st_size == CHUNK * CHUNKS
    finally:
        if child.poll() is None:
            child.kill()
        child.wait()
        server.close()


def test_old_snapshots_without_the_new_fields_load_with_defaults(tmp_path, fake_nvml):
    from ansible_collections.modelwake.serving.plugins.module_utils.readiness.snapshot import Snapshot
    old = {"t": 5.0, "process": {"root_pid": 1, "alive": True, "pids": [1], "cpu_seconds": 1.0, "read_bytes": 0}}
    snap = Snapshot.from_dict(old)
    assert (snap.downloads, snap.ib_rcv_bytes, snap.ib_ports) == (None, None, None)
    assert Snapshot.from_dict(snap.to_dict()) == snap


def test_the_probe_reads_the_infiniband_ports_it_is_pointed_at(tmp_path, fake_nvml):
    counters = tmp_path / "infiniband" / "mlx5_0" / "ports" / "1" / "counters"
    counters.mkdir(parents=True)
    (counters / "port_rcv_data").write_text("1000\n")
    (counters / "port_xmit_data").write_text("0\n")
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        probe = HostProbe(config(pid=child.pid, url="http://127.0.0.1:%d" % closed_port()), nvml=fake_nvml)
        probe.infiniband_root = str(tmp_path / "infiniband")
        first = probe.snapshot(0.0)
        (counters / "port_rcv_data").write_text("%d\n" % (1000 + 2 ** 28))
        second = probe.snapshot(1.0)
        assert first.ib_ports == {"mlx5_0/1": {"rcv_bytes": 4000, "xmit_bytes": 0}}
        assert second.ib_rcv_bytes - first.ib_rcv_bytes == 2 ** 30
        probe.infiniband_root = str(tmp_path / "no-hca")
        assert (probe.snapshot(2.0).ib_rcv_bytes, probe.snapshot(3.0).ib_ports) == (None, None)
    finally:
        child.stdin.close()
        child.wait()
