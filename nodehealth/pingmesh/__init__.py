"""Pingmesh: every daemon's agent (agent, prober, pinglist, stats, mesh), the cluster's controller
(fetch, analysis, controller) and the ConfigMaps between them (verdicts). grpc is imported only where
probes run."""
