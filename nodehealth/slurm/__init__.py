"""Slurm: scontrol (the only caller), the drainer face of the daemon, and `nodehealth slurm`."""
