"""The other nodes of a multi-node group, seen from node 0: who joined, who left.

Each node's engine keeps connections to node 0's dist-init port (torch's TCPStore) while it is a
member of the group. A node has joined when a connection from it is first seen, and has left when
none of the connections it had at the previous look remain: its engine's processes are gone (a new
connection from it is a restarted engine that cannot join a group formed without it). What follows
(a failure, notes in messages) is the classifier's rule; this module keeps the record.
"""
import dataclasses
from typing import Dict, List, Optional


@dataclasses.dataclass
class Peer(object):
    """One other node, in the wait's times (seconds since its first look)."""
    conns: List[str] = dataclasses.field(default_factory=list)  # its connections at the previous look
    joined_t: Optional[float] = None  # when a connection from it was first seen
    left_t: Optional[float] = None  # when none of its connections remained


@dataclasses.dataclass
class PeerTracker(object):
    nodes: Dict[str, Peer] = dataclasses.field(default_factory=dict)

    def observe(self, t, names, connections):
        """Fold one look's connections (node name -> ["remote_ip:remote_port>local_port"]) of the
        nodes `names`; return the names that joined at this look."""
        joined = []
        for name in names:
            peer = self.nodes.setdefault(name, Peer())
            now = set(connections.get(name) or [])
            if peer.left_t is None:
                if peer.conns and not now & set(peer.conns):
                    peer.left_t = t
                elif now and peer.joined_t is None:
                    peer.joined_t = t
                    joined.append(name)
            peer.conns = sorted(now)
        return joined

    def first_left(self):
        """(when, name) of the first node that left, or None."""
        left = [(peer.left_t, name) for name, peer in self.nodes.items() if peer.left_t is not None]
        return min(left) if left else None
