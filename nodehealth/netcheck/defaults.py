"""The `netcheck` section: `nodehealth netcheck`, a job's network preflight, run by every node of
the job before it starts. Flags override each key."""
from __future__ import annotations

from typing import Any

DEFAULTS: dict[str, Any] = {
    "port": 9460,  # every node's agent (9456 daemon, 9457 Ping, 9458 controller, 9459 TCP probe)
    # auto: rdma-bw where every agent found a verbs device for its data address, else the TCP
    # stream test for all (two methods' bandwidths do not compare); tcp or rdma force one.
    "method": "auto",
    # One test's length. Two seconds of TCP or RDMA WRITE reach a steady rate on a real link and
    # keep a 1000-node job's preflight (at most ~4 rounds when up to half the nodes are bad) well
    # under a minute; perftest's default of 5000 x 64 KiB lasts well under a second on 100 Gb/s.
    "seconds": 2.0,
    # A test slower than this fraction of the median of the other nodes' best bandwidths is slow
    # (a node is named slow after two slow tests with different sound partners). A link that
    # trained at half its rate, or a NIC on a x8 instead of a x16 slot, falls below it, while the run
    # to run spread of healthy pairs (a few percent on hardware, ~30 % on a loaded soft device) does not.
    "slow_fraction": 0.5,
    # The rounds stop here even if a node is still undecided; at most four suffice unless more than
    # half the nodes are faulty (tests/test_netcheck.py), and each round costs one test's time.
    "max_rounds": 10,
    "rdma_port": 18515,  # rdma-bw's out-of-band port on the data address (perftest's)
    "rdma_size": 65536,  # bytes per RDMA WRITE (perftest's default)
    # How long the first node waits for the others to join: pods of a job start over a minute or
    # two (image pulls), Slurm steps within seconds; a node that has not joined by then is named
    # missing and the job's verdict is unhealthy.
    "wait_seconds": 300.0,
    # Kubernetes: the pods of the job are those matching the label selector given with
    # --kube-selector; the first node (the coordinator) is the pod whose index label is 0 (an
    # Indexed Job's; JobSet and the training operator set it too), else the first pod by name.
    "kube_index_label": "batch.kubernetes.io/job-completion-index",
    "kube_poll_seconds": 2.0,  # between two lists of the job's pods while they start
}

MEANINGS = {  # what each key means, in docs/configuration.md
    "port": "every node's agent (`netcheck job --port`)",
    "method": ("`auto`: rdma-bw where every node has a verbs device for its data address, else TCP for all; `tcp` "
               "or `rdma` force one"),
    "seconds": "length of one pair test",
    "slow_fraction": "a test below this fraction of the median of the other nodes' best bandwidths is slow; a node "
                     "is named slow after two such tests with different sound partners",
    "max_rounds": "rounds stop here even if a node is undecided",
    "rdma_port": "rdma-bw's out-of-band port on the data address",
    "rdma_size": "bytes per RDMA WRITE",
    "wait_seconds": "how long the first node waits for the others to join; a node that has not joined is `missing`",
    "kube_index_label": "pod label whose value 0 marks the coordinator",
    "kube_poll_seconds": "seconds between two lists of the job's pods while they start",
}
