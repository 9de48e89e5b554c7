import socket
from pathlib import Path

from streams.devstack.embedded import ephemeral_low, free_port


def test_free_ports_lie_below_the_ephemeral_range_and_are_never_repeated() -> None:
    low = ephemeral_low()
    ports = [free_port() for _ in range(50)]
    assert len(set(ports)) == 50
    assert all(1024 <= port < low for port in ports)
    with socket.socket() as sock:  # and a listener can take one
        sock.bind(("127.0.0.1", ports[0]))
        sock.listen()


def test_the_ephemeral_range_is_read_from_the_kernel_or_defaults(tmp_path: Path) -> None:
    listed = tmp_path / "ip_local_port_range"
    listed.write_text("40000\t60999\n")
    assert ephemeral_low(listed) == 40000
    assert ephemeral_low(tmp_path / "missing") == 32768
    listed.write_text("")
    assert ephemeral_low(listed) == 32768
