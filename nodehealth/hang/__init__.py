"""Hang detection for distributed training.

Training code: `nodehealth.hang.enable()` (or $NODEHEALTH_HANG_DIR with the `nodehealth.hang.run`
launcher) and `with nodehealth.hang.region("step"):`. The detector (daemon side), stack
collection and the cross-rank report live in the submodules and are not imported here, so the
training process pays only for the standard library. The timer itself is loaded on first use, so
that `nodehealth` commands that merely list the `hang` subcommands do not pay for it either.
"""
from __future__ import annotations

from typing import Any

__all__ = ["ENV_DIR", "ENV_INTERVAL", "ENV_JOB", "Timer", "enable", "enable_from_env", "region"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from nodehealth.hang import timer

        return getattr(timer, name)
    raise AttributeError(f"module 'nodehealth.hang' has no attribute {name!r}")
