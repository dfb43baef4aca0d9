"""RDMA WRITE bandwidth: the test itself (bw, the only pyverbs importer), the daemon's periodic tests
(periodic), netcheck's test between two agents (pair) and `nodehealth rdma-bw` (cli)."""
