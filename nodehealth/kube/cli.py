"""`nodehealth breaker reset`: let nodehealth quarantine nodes again after the circuit breaker tripped."""
from __future__ import annotations

import argparse
import sys
from typing import Any

EXIT_UNKNOWN = 2


def add_subcommands(subparsers: Any) -> None:
    b = subparsers.add_parser("breaker", help="the cluster-wide quarantine circuit breaker")
    bsub = b.add_subparsers(dest="breaker_command", required=True)
    r = bsub.add_parser("reset", help="let nodehealth quarantine nodes again after the breaker tripped")
    r.add_argument("--config", metavar="FILE", help="configuration file (YAML or .json)")
    r.set_defaults(func=cmd_breaker_reset)


def cmd_breaker_reset(args: argparse.Namespace) -> int:
    """Reset the cluster-wide quarantine circuit breaker after the operator has looked."""
    from nodehealth import config
    from nodehealth.kube.api import KubeError
    from nodehealth.kube.breaker import reset_breaker

    cfg = config.load(args.config)
    try:
        print(reset_breaker(cfg["kube"]))
    except KubeError as e:
        print(f"nodehealth: cannot reset the breaker: {e}", file=sys.stderr)
        return EXIT_UNKNOWN
    return 0
