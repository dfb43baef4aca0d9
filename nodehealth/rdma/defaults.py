"""The `rdma_bw` section: the daemon's periodic RDMA WRITE bandwidth tests (nodehealth/rdma/periodic.py),
which the `rdma_bw` check judges. Off unless enabled: a test fills the rail for its duration, and a fleet
chooses when."""
from __future__ import annotations

from typing import Any

DEFAULTS: dict[str, Any] = {
    "enabled": False,
    # Addresses or names of the peers whose daemons serve the test, taken in turn round after round so
    # that a rail meets different peers. Empty: this node's leaf-mates in pingmesh.inventory_file when
    # one is set, else no test is started and the daemon only serves its peers.
    "peers": [],
    "rails": [],  # "device:port" or "device" (port 1); empty: every ACTIVE port, sorted. Rail i serves on port + i
    "serve": True,  # serve the test to peers, one client at a time per rail
    # Whose clients the servers take: addresses, CIDR networks ("10.0.0.0/8"; "0.0.0.0/0" and "::/0"
    # for anyone) or names. Empty: the peers above (or the leaf-mates). Others are refused and counted.
    "serve_to": [],
    "listen": "0.0.0.0",
    "port": 18515,  # perftest's out-of-band port, for rail 0
    "interval_seconds": 3600.0,  # between rounds; a round tests every rail once, one test at a time
    "duration_seconds": 5.0,  # per test: perftest's -D default, long enough to leave its warm-up behind
    "size": 65536,  # perftest's default message size, which the check's line-rate fractions are measured at
    "gid_index": -1,  # RoCE; -1 picks a RoCE v2 GID with an IPv4 address per port; InfiniBand uses LIDs
    "timeout_seconds": 10.0,  # a peer that does not answer the out-of-band exchange in this time is unavailable
    # After start, before the first round: peers restarted in the same rollout need a moment to serve.
    "start_delay_seconds": 60.0,
    "history": 8,  # runs kept per rail (the check looks at the newest few in a row)
}

MEANINGS = {  # what each key means, in docs/configuration.md
    "enabled": "the daemon tests its rails and serves the test to its peers (a test fills its rail for its duration)",
    "peers": ("addresses or names of peers whose daemons serve the test, taken in turn; empty: the leaf-mates in "
              "`pingmesh.inventory_file`, else serve only. At most 64"),
    "rails": "`device:port` or `device` (port 1); empty: every ACTIVE port, sorted. Rail i serves on `port` + i",
    "serve": "serve the test to peers, one client at a time per rail",
    "serve_to": ("whose clients the servers take: addresses, CIDR networks (`0.0.0.0/0` and `::/0` for anyone) or "
                 "names; empty: the peers"),
    "listen": "address the servers listen on",
    "port": "out-of-band TCP port of rail 0 (perftest's)",
    "interval_seconds": "seconds between rounds; a round tests every rail once; more than twice `duration_seconds`",
    "duration_seconds": "length of one test (at most 60)",
    "size": "message size in bytes (perftest's default)",
    "gid_index": "RoCE GID index; -1 picks a RoCE v2 GID with an IPv4 address; InfiniBand uses LIDs",
    "timeout_seconds": "a peer that does not answer the out-of-band exchange in this time is unavailable",
    "start_delay_seconds": "wait after start before the first round",
    "history": "tests kept per rail; at least `checks.rdma_bw.low_runs`",
}
# The bounds a test may not exceed: a test holds its rail and a CPU core while it runs.
MAX_DURATION_SECONDS = 60.0
MAX_PEERS = 64  # per rail, the series of the newest run against each peer
MAX_SERVE_TO = 256  # its names are resolved again every minute, when a client comes
