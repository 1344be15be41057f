"""A multi-node group seen from one node: who joined, who never came, who left (replayed traces)."""
from ansible_collections.modelwake.serving.plugins.module_utils.host import procfs
from ansible_collections.modelwake.serving.plugins.module_utils.readiness.peers import PeerTracker

from tests.helpers.traces import MIB, SGLANG_PREFIX, Trace, config, http, replay

PEERS = {"k26-node1": ["10.213.77.12"]}
NODE1 = "10.213.77.12:40312>50000"


def pair_config(**overrides):
    return config(engine="sglang", stall_timeout=60, poll_interval=5, peers=PEERS, peer_port=50000, **overrides)


def step(trace, t, peers, **kwargs):
    snap = trace.step(t, **kwargs)
    snap.peers = {"k26-node1": list(peers)}
    return snap


def pair_start(node1_conns):
    """Node 0's view: rendezvous, a minute of loading, then what node1_conns(t) says of node 1."""
    trace = Trace()
    yield step(trace, 0, node1_conns(0), lines=[SGLANG_PREFIX + "Init torch distributed begin."])
    for t in range(5, 31, 5):
        yield step(trace, t, node1_conns(t), cpu=0.8, read=500 * MIB)
    for t in range(35, 200, 5):  # loading over: parked in the collective, silent
        yield step(trace, t, node1_conns(t))


def test_a_node_whose_connections_close_during_the_load_fails_the_start_naming_it():
    verdicts = replay(pair_config(), pair_start(lambda t: [NODE1] if t < 20 else []))
    t, final = verdicts[-1]
    assert t == 20 and final.phase == "failed" and final.terminal
    assert final.msg == ("failed: node k26-node1 (10.213.77.12) left the group at +20 s: its connections to the "
                         "dist-init port 50000 closed, and the nodes left wait in a collective that cannot complete "
                         "without it; restart every node of the group together")
    assert [v.phase for _, v in verdicts[:-1]] == ["starting", "loading", "loading", "loading"]


def test_a_node_that_restarts_alone_has_left_even_though_it_connects_again():
    # Its new engine connects from another port: a new process, not the group's member.
    verdicts = replay(pair_config(), pair_start(lambda t: [NODE1] if t < 20 else ["10.213.77.12:40999>50000"]))
    assert verdicts[-1][0] == 20 and "node k26-node1 (10.213.77.12) left the group" in verdicts[-1][1].msg


def test_a_node_that_never_joins_is_named_while_waiting_and_in_the_stall():
    trace = Trace()
    snaps = [step(trace, 0, [], lines=[SGLANG_PREFIX + "Init torch distributed begin."])]
    snaps += [step(trace, t, []) for t in range(5, 100, 5)]
    verdicts = replay(pair_config(), snaps)
    assert ("starting since +0 s" in verdicts[1][1].msg and "node k26-node1 (10.213.77.12) has not joined the group "
            "(no connection on the dist-init port 50000)" in verdicts[1][1].msg)
    t, final = verdicts[-1]
    assert final.phase == "stalled" and t == 60
    assert "node k26-node1 (10.213.77.12) has not joined the group" in final.msg


def test_a_node_joining_is_progress_and_extra_connections_coming_and_going_are_not_leaving():
    conns = {0: [], 5: [], 10: [NODE1, "10.213.77.12:40313>50000"], 15: [NODE1]}
    trace = Trace()
    snaps = [step(trace, t, conns.get(t, [NODE1])) for t in range(0, 45, 5)]
    snaps.append(step(trace, 45, [NODE1], http_result=http(200, models=200, completion=200, ready=True)))
    verdicts = replay(pair_config(), snaps)
    assert verdicts[2][1].last_progress == {"t": 10.0, "what": "node k26-node1 joined"}
    assert [v.phase for _, v in verdicts][-1] == "ready"
    assert all("k26-node1" not in v.msg for _, v in verdicts[2:])


def test_the_tracker_tells_joining_from_leaving_and_a_restarted_node_from_its_member():
    tracker = PeerTracker()
    names = ["k26-node1", "k26-node2"]
    assert tracker.observe(0, names, {}) == []
    assert tracker.observe(5, names, {"k26-node1": [NODE1]}) == ["k26-node1"]
    assert tracker.observe(10, names, {"k26-node1": [NODE1, "10.213.77.12:40313>50000"]}) == []
    assert tracker.first_left() is None  # one connection of the previous look remains: still a member
    assert tracker.observe(15, names, {"k26-node1": ["10.213.77.12:40999>50000"]}) == []  # all new: a restart
    assert tracker.first_left() == (15, "k26-node1")
    assert tracker.observe(20, names, {"k26-node1": [NODE1]}) == [] and tracker.nodes["k26-node1"].left_t == 15
    assert tracker.nodes["k26-node2"].joined_t is None and tracker.nodes["k26-node2"].left_t is None


def test_established_connections_are_read_from_both_tables_v4_mapped_as_v4(tmp_path):
    net = tmp_path / "net"
    net.mkdir()
    header = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
    # 10.213.77.11:50000 <- 10.213.77.12:40312 established (01); a listener (0A) is left out.
    (net / "tcp").write_text(header +
        "   0: 0B4DD50A:C350 0C4DD50A:9D78 01 00000000:00000000 00:00000000 00000000     0        0 1 1\n"
        "   1: 00000000:C350 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 2 1\n")
    # ::ffff:10.213.77.11:50000 <- ::ffff:10.213.77.13:40400
    (net / "tcp6").write_text(header +
        "   0: 0000000000000000FFFF00000B4DD50A:C350 0000000000000000FFFF00000D4DD50A:9DD0 01 "
        "00000000:00000000 00:00000000 00000000     0        0 3 1\n")
    assert procfs.established_connections(str(tmp_path)) == [
        ("10.213.77.11", 50000, "10.213.77.12", 40312), ("10.213.77.11", 50000, "10.213.77.13", 40400)]


def test_peers_are_resolved_and_checked_before_the_wait():
    import pytest
    from ansible_collections.modelwake.serving.plugins.module_utils.common.errors import InputError
    from ansible_collections.modelwake.serving.plugins.module_utils.readiness.config import build_config

    base = {"url": "http://127.0.0.1:30001", "pid": 1}
    cfg = build_config(dict(base, peers=[{"name": "node1", "address": "localhost"}], peer_port=50000))
    assert cfg.peers["node1"][0] in ("127.0.0.1", "::1") and cfg.peer_port == 50000
    with pytest.raises(InputError) as missing_port:
        build_config(dict(base, peers=[{"name": "node1", "address": "127.0.0.2"}]))
    assert missing_port.value.field == "peer_port"
    with pytest.raises(InputError) as unresolvable:
        build_config(dict(base, peers=[{"name": "node1", "address": "no-such-node.invalid"}], peer_port=50000))
    assert "node1" in str(unresolvable.value) and unresolvable.value.field == "peers"
