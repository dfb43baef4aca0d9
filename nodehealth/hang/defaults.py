"""The `hang` section: hang detection for distributed training (nodehealth/hang/detector.py)."""
from __future__ import annotations

from typing import Any

DEFAULTS: dict[str, Any] = {
    "enabled": False,  # the daemon watches `directory` for hung ranks
    # Where training processes publish their records ($NODEHEALTH_HANG_DIR of the ranks).
    "directory": "/run/nodehealth/hang",
    # Where bundles go; empty: <state_dir>/hang in the daemon, DIR/bundles for `hang watch DIR`.
    "bundle_dir": "",
    # A pending op is hung when older than max(floor, factor x its p99); below the PG timeout
    # (10 min NCCL, 30 min gloo) with room for the dumps.
    "floor_seconds": 180.0,
    "p99_factor": 10.0,
    "min_samples": 20,  # fewer completed ops than this: the floor alone decides
    "heartbeat_timeout_seconds": 60.0,
    "stale_record_seconds": 3600.0,  # records whose heartbeat is older than this belong to dead jobs
    "scan_interval_seconds": 1.0,
    "py_spy": "py-spy",
    "stack_timeout_seconds": 10.0,
    "native_stacks": True,
    "native_timeout_seconds": 30.0,
    "parallel_dumps": 8,
    "flight_recorder_timeout_seconds": 15.0,
    # Any user of the node can write records, so the work a scan does for them is bounded; owners
    # take turns, so one user's flood cannot starve another's job. A node runs a few jobs of at most
    # a few hundred local ranks.
    "max_records_per_scan": 2048,
    "max_scan_bytes": 32 << 20,  # records read per scan, all together (each is at most 256 KiB)
    "max_jobs_per_scan": 64,
    # py-spy stops its target: a hang needs one bundle, not one per second of a moving stall point.
    "dumps_per_minute": 6,  # bundles on this node, all jobs together
    "job_dump_interval_seconds": 120.0,  # between two bundles of one job
    "process_dump_interval_seconds": 60.0,  # between two dumps of one process
    "max_children_per_rank": 8,  # DataLoader workers and other children dumped under their rank
    "max_metric_series": 512,  # per-rank series over all jobs; hung jobs come first
    # Bundles land in the daemon's state directory: bound each and all of them, oldest go first.
    "max_bundle_bytes": 8 << 20,
    "max_bundle_dir_bytes": 256 << 20,
    "max_bundles": 200,
    # A straggler: its collectives are this many times shorter than the median of the others'
    # (they wait for it), by at least min_wait, with enough samples, in this many scans in a row.
    # Medians (p50) over the timer's last 256 ops, so a slow step now and then is not a straggler;
    # a wait under 50 ms per collective is noise next to a training step.
    "straggler_ratio": 3.0,
    "straggler_min_wait_seconds": 0.05,
    "straggler_scans": 5,
}

MEANINGS = {  # what each key means, in docs/configuration.md
    "enabled": "the daemon watches `directory` for hung ranks (flag `--hang-dir`)",
    "directory": "where the training processes write their records (their `$NODEHEALTH_HANG_DIR`)",
    "bundle_dir": "where bundles go; empty: `<state_dir>/hang` in the daemon, `DIR/bundles` for `hang watch DIR`",
    "floor_seconds": "a pending op is hung when older than max(`floor_seconds`, `p99_factor` x its p99)",
    "p99_factor": "see `floor_seconds`",
    "min_samples": "with fewer completed ops than this, the floor alone decides",
    "heartbeat_timeout_seconds": "a rank whose heartbeat stops this long is hung",
    "stale_record_seconds": "records whose heartbeat is older than this belong to dead jobs and are ignored",
    "scan_interval_seconds": "seconds between two scans of the records",
    "py_spy": "the py-spy program (on `PATH`, else beside the running `nodehealth`)",
    "stack_timeout_seconds": "one py-spy dump of Python frames",
    "native_stacks": "also take native frames (a second, slower pass)",
    "native_timeout_seconds": "one native-frames dump",
    "parallel_dumps": "processes dumped at once",
    "flight_recorder_timeout_seconds": "how long to wait for the ranks' PyTorch Flight Recorder dumps",
    "max_records_per_scan": "records considered per scan (owners take turns)",
    "max_scan_bytes": "bytes of records read per scan, all together",
    "max_jobs_per_scan": "jobs considered per scan",
    "dumps_per_minute": "bundles per minute on this node, all jobs together",
    "job_dump_interval_seconds": "seconds between two bundles of one job",
    "process_dump_interval_seconds": "seconds between two dumps of one process",
    "max_children_per_rank": "child processes (DataLoader workers) dumped under each rank",
    "max_metric_series": "per-rank metric series over all jobs; hung jobs first",
    "max_bundle_bytes": "largest bundle; the bulkiest evidence is dropped first, and the bundle says so",
    "max_bundle_dir_bytes": "bytes in the bundle directory; the oldest bundles are removed first",
    "max_bundles": "bundles in the bundle directory; the oldest are removed first",
    "straggler_ratio": ("a rank is a straggler when, over stretches of the ops all ranks share, the others spend "
                        "this many times as long in collectives as it does ..."),
    "straggler_min_wait_seconds": ("... and their longest wait per stretch is at least this much longer than its "
                                   "own ..."),
    "straggler_scans": "... in this many scans in a row",
}
