"""The tests' free ports: handed to other processes to bind later, so nothing else may take them meanwhile."""
from conftest import ephemeral_low, free_port


def test_a_free_port_lies_below_the_kernels_ephemeral_range():
    """A port from the ephemeral range can become any outgoing connection's local port (or another
    bind(0)'s) between the test picking it and a torchrun binding it: CI once failed on EADDRINUSE so."""
    ports = [free_port() for _ in range(50)]
    assert all(1024 <= p < ephemeral_low() for p in ports), ports
    assert len(set(ports)) == len(ports)
