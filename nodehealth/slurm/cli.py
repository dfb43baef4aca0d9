"""`nodehealth slurm`: one pass, then drain this Slurm node (unhealthy) or resume it (healthy, drained
by nodehealth), as HealthCheckProgram or Prolog."""
from __future__ import annotations

import argparse
import sys
from typing import Any, Callable

from nodehealth import config


def add_subcommands(subparsers: Any, pass_options: Callable[[argparse.ArgumentParser], None]) -> None:
    """`nodehealth slurm`, with the options of a pass that `check` has too (`pass_options`)."""
    c = subparsers.add_parser("slurm", help="one pass, then drain this Slurm node (unhealthy) or resume it (healthy, "
                                            "drained by nodehealth): HealthCheckProgram or Prolog")
    pass_options(c)
    c.add_argument("--dry-run", action="store_true", help="read the node's state, print the scontrol update that "
                                                          "would drain or resume it, change nothing, exit 0")
    c.set_defaults(func=cmd_slurm)


def cmd_slurm(args: argparse.Namespace) -> int:
    from nodehealth import node_pass  # the pass, and scontrol, only when the command runs
    from nodehealth.slurm.drainer import EXIT_HEALTHY as EXIT_OK
    from nodehealth.slurm.drainer import EXIT_SLURM, act
    from nodehealth.slurm.scontrol import Scontrol, SlurmError, slurm_node_name

    cfg = config.load(args.config)
    if args.dry_run:
        cfg["slurm"]["dry_run"] = True
    engine = node_pass.build_engine(cfg, args.root, node_pass.names(args.only), node_pass.names(args.skip) or ())
    report = node_pass.run(engine, cfg, node_pass.node_name(engine.host, args.node_name), args.state_dir)
    node = slurm_node_name(args.node_name)
    try:
        outcome = act(report, node, Scontrol(cfg["slurm"]), cfg["slurm"]["reason_max_chars"])
    except SlurmError as e:
        print(f"nodehealth: slurm: node {node} is {report.status.value}, but {e}", file=sys.stderr)
        return EXIT_OK if cfg["slurm"]["dry_run"] else EXIT_SLURM
    print(f"nodehealth: {outcome.line}")
    # A dry run changes nothing, its exit status included: as a Prolog, a non-zero one would make Slurm drain.
    return EXIT_OK if cfg["slurm"]["dry_run"] else outcome.code
