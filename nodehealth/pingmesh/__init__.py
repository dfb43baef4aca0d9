"""Pingmesh on each node: the gRPC Ping agent, the prober, the pinglist and the window statistics."""
