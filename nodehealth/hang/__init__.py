"""Hang detection for distributed training.

Training code: `nodehealth.hang.enable()` (or $NODEHEALTH_HANG_DIR with the `nodehealth.hang.run`
launcher) and `with nodehealth.hang.region("step"):`. The detector (daemon side), stack
collection and the cross-rank report live in the submodules and are not imported here, so the
training process pays only for the standard library.
"""
from __future__ import annotations

from nodehealth.hang.timer import ENV_DIR, ENV_INTERVAL, ENV_JOB, Timer, enable, enable_from_env, region

__all__ = ["ENV_DIR", "ENV_INTERVAL", "ENV_JOB", "Timer", "enable", "enable_from_env", "region"]
