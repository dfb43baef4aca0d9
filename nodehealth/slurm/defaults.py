"""The `slurm` section: `nodehealth slurm` as HealthCheckProgram or Prolog, or the daemon draining
on its own passes (`daemon --slurm`) instead of Kubernetes taints."""
from __future__ import annotations

from typing import Any

DEFAULTS: dict[str, Any] = {
    "enabled": False,  # the daemon drains and resumes this node in Slurm
    # Read the node's state but only log the scontrol update that would drain or resume it (NHC's
    # MARK_OFFLINE=0), for `nodehealth slurm` and the daemon alike; `nodehealth slurm` then exits 0.
    "dry_run": False,
    "node_name": "",  # Slurm's name for this node; empty: $SLURMD_NODENAME, else the short hostname
    # The daemon calls scontrol when the verdict changes, and this often besides to put back a drain that
    # was lifted while the fault stays: Slurm's own HealthCheckInterval is commonly 300 s, and a call per
    # pass from every node would load slurmctld for nothing.
    "resync_seconds": 300.0,
    "scontrol": "scontrol",  # found on PATH; slurm.conf's location comes from $SLURM_CONF as for scontrol
    # slurmctld may be restarting (upgrade, failover): try this many times, this far apart, before
    # giving up. Slurm runs HealthCheckProgram again at the next HealthCheckInterval anyway, so a few
    # seconds of patience is enough and keeps a Prolog from holding a job start for long.
    "attempts": 3,
    "retry_delay_seconds": 2.0,
    "timeout_seconds": 10.0,  # one scontrol call; slurm's own MessageTimeout defaults to 10 s
    # Slurm shows the reason in sinfo -R; nodehealth's are a few words, longer ones are cut here.
    "reason_max_chars": 120,
}

MEANINGS = {  # what each key means, in docs/configuration.md
    "enabled": "the daemon drains and resumes this node in Slurm (flag `--slurm`)",
    "dry_run": ("read the node's state but only log the `scontrol update` that would drain or resume it (NHC's "
                "`MARK_OFFLINE=0`); `nodehealth slurm` then exits 0 (flag `--dry-run`)"),
    "node_name": "Slurm's name for this node; empty: `--node-name`, else `$SLURMD_NODENAME`, else the short hostname",
    "resync_seconds": ("besides verdict changes, the daemon runs scontrol this often (puts back a drain someone "
                       "lifted while the fault stays)"),
    "scontrol": "the scontrol program, found on `PATH`",
    "attempts": "tries when slurmctld does not answer (it may be restarting)",
    "retry_delay_seconds": "seconds between two tries",
    "timeout_seconds": "one scontrol call",
    "reason_max_chars": "longest drain reason; longer ones are cut",
}
