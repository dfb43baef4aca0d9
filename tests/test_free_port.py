"""The tests' free ports: handed to other processes to bind later, so nothing else may take them meanwhile."""
from conftest import free_port


def ephemeral_range() -> tuple[int, int]:
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        low, high = map(int, f.read().split())
    return low, high


def test_a_free_port_lies_below_the_kernels_ephemeral_range():
    """A port from the ephemeral range can become any outgoing connection's local port (or another
    bind(0)'s) between the test picking it and a torchrun binding it: CI once failed on EADDRINUSE so."""
    low, _ = ephemeral_range()
    ports = [free_port() for _ in range(50)]
    assert all(1024 <= p < low for p in ports), ports
    assert len(set(ports)) == len(ports)
