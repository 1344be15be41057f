"""Multi-node tensor parallel, SGLang's way (`--nnodes`, `--node-rank`, `--dist-init-addr`), scaled down.

Node 0 listens on the dist-init address (torch's TCPStore does), every other node connects to it and
keeps its connection for the life of the group. The group forms when every node has joined, and each
later collective completes only when every node has reached it. A node that dies or never arrives
leaves the others parked in the collective: no output, no CPU, no reads, for --dist-timeout seconds,
as NCCL's wait looks from outside. A node that restarts alone finds the group formed without it and
waits too: the group only comes back when every node restarts together.

Wire format: one text line per message. A node says `join <rank>` once connected, `reached <stage>`
at each collective; node 0 answers `go <stage>` to every node when all have reached it.
Stage 0 is the rendezvous (`init_process_group`), stage 1 the collective after loading.
"""
import socket
import threading
import time

RENDEZVOUS = 0
AFTER_LOAD = 1
STAGES = (RENDEZVOUS, AFTER_LOAD)
CONNECT_RETRY = 1.0


class GroupError(Exception):
    """A bad --dist-init-addr or a node count that does not fit; the message says how to fix it."""


def parse_addr(text):
    """`host:port` or `[v6]:port` -> (host, port)."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise GroupError("--dist-init-addr must be HOST:PORT or [IPv6]:PORT (got %r)" % text)
    return host.strip("[]"), int(port)


class NodeGroup(object):
    """This node's view of the group. `reached(stage)` says this node got there; `on_complete(stage)`
    is called (from a link thread) when the whole group has. Nothing is logged: a lost peer is as
    silent as in NCCL."""

    def __init__(self, nnodes, node_rank, addr, on_complete):
        self.nnodes = nnodes
        self.node_rank = node_rank
        self.host, self.port = parse_addr(addr)
        self.on_complete = on_complete
        self.lock = threading.Lock()
        self.arrived = {stage: set() for stage in STAGES}  # node ranks that reached each stage
        self.completed = set()
        self.members = {}  # node 0: node rank -> its connection, once joined
        self.formed = False  # node 0: every node joined; later arrivals are left waiting
        self.lost = set()
        self.conn = None  # other nodes: the connection to node 0
        self.unsent = []  # other nodes: what was reached before the connection was up

    # --- both sides ---------------------------------------------------------------------------
    def start(self):
        target = self._serve if self.node_rank == 0 else self._connect
        threading.Thread(target=target, name="dist-init", daemon=True).start()
        return self

    def reached(self, stage):
        if self.node_rank == 0:
            self._arrive(0, stage)
            return
        with self.lock:
            conn = self.conn
            if conn is None:
                self.unsent.append(stage)
        if conn is not None:
            self._send(conn, "reached %d" % stage)

    @staticmethod
    def _send(conn, line):
        try:
            conn.sendall((line + "\n").encode("ascii"))
        except (OSError, AttributeError):
            pass  # the peer is gone: the group waits, as NCCL does

    @staticmethod
    def _lines(conn):
        buf = b""
        while True:
            try:
                chunk = conn.recv(4096)
            except OSError:
                chunk = b""
            if not chunk:
                return
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                yield line.decode("ascii", "replace").split()

    # --- node 0: the store --------------------------------------------------------------------
    def _serve(self):
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        server = socket.socket(family, socket.SOCK_STREAM)
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        # All addresses, as the store binds: the other nodes reach node 0 by whichever it has.
        server.bind(("::" if family == socket.AF_INET6 else "0.0.0.0", self.port))
        server.listen(64)
        self.server = server
        while True:
            conn, _ = server.accept()
            threading.Thread(target=self._member, args=(conn,), daemon=True).start()

    def _member(self, conn):
        rank = None
        for words in self._lines(conn):
            if words[:1] == ["join"] and rank is None:
                with self.lock:
                    if self.formed or int(words[1]) in self.members:
                        # A node restarted alone: the group it joins no longer exists. It waits.
                        late = True
                    else:
                        late = False
                        rank = int(words[1])
                        self.members[rank] = conn
                if late:
                    continue
                self._check(RENDEZVOUS)
            elif words[:1] == ["reached"] and rank is not None:
                self._arrive(rank, int(words[1]))
        if rank is not None:
            with self.lock:
                self.lost.add(rank)  # never comes back into this group

    def _arrive(self, rank, stage):
        with self.lock:
            self.arrived[stage].add(rank)
        self._check(stage)

    def _check(self, stage):
        with self.lock:
            everyone = set(range(self.nnodes))
            if stage in self.completed or self.lost or self.arrived[stage] != everyone:
                return
            if stage == RENDEZVOUS:
                if set(self.members) | {0} != everyone:
                    return
                self.formed = True
            self.completed.add(stage)
            conns = list(self.members.values())
        for conn in conns:
            self._send(conn, "go %d" % stage)
        self.on_complete(stage)

    # --- other nodes: a client of the store ---------------------------------------------------
    def _connect(self):
        while True:
            try:
                conn = socket.create_connection((self.host, self.port), timeout=5)
                break
            except OSError:
                time.sleep(CONNECT_RETRY)  # node 0 not up yet: torch retries the same way
        conn.settimeout(None)
        self._send(conn, "join %d" % self.node_rank)
        with self.lock:
            self.conn = conn
            unsent, self.unsent = self.unsent, []
        for stage in unsent:
            self._send(conn, "reached %d" % stage)
        for words in self._lines(conn):
            if words[:1] == ["go"]:
                self.on_complete(int(words[1]))
        # Node 0 is gone: nothing completes any more.
