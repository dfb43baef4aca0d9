"""Kubernetes: the API client (api), the verdict as taints and conditions (taints), the quarantine
circuit breaker (breaker), the face that writes them on the Node (publisher), leader election over
a Lease (election) and the `breaker reset` command (cli). Nothing here is imported by `check`."""
