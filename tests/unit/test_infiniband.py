"""InfiniBand port counters (host/infiniband.py) from a sysfs tree laid out as the kernel shows it:
this machine has no HCA, so the tree is built in a temporary directory."""
from ansible_collections.modelwake.serving.plugins.module_utils.host import infiniband


def port(root, device, number, rcv=None, xmit=None):
    counters = root / device / "ports" / str(number) / "counters"
    counters.mkdir(parents=True, exist_ok=True)
    if rcv is not None:
        (counters / "port_rcv_data").write_text("%d\n" % rcv)
    if xmit is not None:
        (counters / "port_xmit_data").write_text("%d\n" % xmit)
    (counters / "port_rcv_packets").write_text("12\n")  # other counters are left alone


def test_counters_are_in_words_of_four_bytes_per_device_and_port(tmp_path):
    root = tmp_path / "infiniband"
    port(root, "mlx5_0", 1, rcv=1000, xmit=250)
    port(root, "mlx5_1", 1, rcv=3 * 2 ** 30)
    port(root, "mlx5_1", 2)  # a port without data counters is not reported
    ports = infiniband.read_ports(str(root))
    assert ports == {"mlx5_0/1": {"rcv_bytes": 4000, "xmit_bytes": 1000},
                     "mlx5_1/1": {"rcv_bytes": 12 * 2 ** 30, "xmit_bytes": None}}
    assert infiniband.received_bytes(ports) == 4000 + 12 * 2 ** 30


def test_growth_between_two_reads_is_the_bytes_received(tmp_path):
    root = tmp_path / "infiniband"
    port(root, "mlx5_0", 1, rcv=10, xmit=0)
    before = infiniband.received_bytes(infiniband.read_ports(str(root)))
    port(root, "mlx5_0", 1, rcv=10 + 2 ** 28, xmit=0)  # 1 GiB arrived
    assert infiniband.received_bytes(infiniband.read_ports(str(root))) - before == 2 ** 30


def test_a_host_without_an_hca_reads_empty(tmp_path):
    assert infiniband.read_ports(str(tmp_path / "absent")) == {}
    assert infiniband.received_bytes({}) is None
    (tmp_path / "empty").mkdir()
    assert infiniband.read_ports(str(tmp_path / "empty")) == {}
