"""Checks: one module per concern. Pure functions from facts (and thresholds) to findings.

Each module provides:
    NAME: str                   the check's name (finding label, --only/--skip)
    NEEDS: tuple[str, ...]      collectors whose facts it reads; if one failed the engine reports
                                the check as `unknown`, if one is unsupported the check is skipped
    DEFAULTS: dict              its thresholds (config section checks.<NAME>)
    DEBOUNCE: bool              True for performance findings the daemon raises only after
                                repeated bad passes; False for events and hardware facts
    judge(obs: Observed, cfg: dict) -> list[Finding]

A check never reads a file, calls NVML or opens a socket.
"""
