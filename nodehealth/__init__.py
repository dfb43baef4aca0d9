"""nodehealth: fault diagnosis and health checks for GPU cluster nodes."""

__version__ = "0.1.0"
