"""Command line: `nodehealth check`, `daemon`, `clear`, `config defaults` and `version`; every feature adds
its own subcommands (hang, netcheck, rdma-bw, pingmesh, controller, slurm, breaker) from its package.

Argparse only: each command imports what it runs when it runs, so that `check` pays only for the
pass and `rdma-bw` for neither the pass nor the daemon.
"""
from __future__ import annotations

import argparse
import os
import stat
import sys
from collections.abc import Sequence

from nodehealth import __version__, config, logs

EXIT_HEALTHY, EXIT_UNHEALTHY, EXIT_UNKNOWN = 0, 1, 2
EXIT_CODES = """exit codes:
  0  healthy: no finding worse than a warning (--fail-on warning makes a warning unhealthy)
  1  unhealthy: a degraded or fatal finding
  2  could not judge (an unknown finding and nothing worse), bad usage or a bad configuration
"""


def cmd_check(args: argparse.Namespace) -> int:
    from nodehealth import node_pass
    from nodehealth import report as render

    if args.list:
        from nodehealth import registry

        sys.stdout.write(render.to_check_list(registry.CHECKS))
        return 0
    cfg = config.load(args.config)
    if args.kernel_log:
        for path in args.kernel_log:  # a typo is one usage error, not every kernel-log check unknown
            _readable("--kernel-log", path)
        cfg["collectors"]["kmsg"]["files"] = list(args.kernel_log)
    engine = node_pass.build_engine(cfg, args.root, node_pass.names(args.only), node_pass.names(args.skip) or ())
    report = node_pass.run(engine, cfg, node_pass.node_name(engine.host, args.node_name), args.state_dir,
                           read_state=not args.kernel_log, fail_on_warning=args.fail_on == "warning")
    sys.stdout.write(render.to_json(report) if args.json
                     else render.to_table(report, verbose=args.verbose, checks=engine.checks))
    return report.status.code


def _readable(flag: str, path: str) -> None:
    """A regular file this process may read (as the kernel-log collector wants it), or UsageError. Opened
    without blocking, so that a FIFO is refused rather than waited on."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as e:
        raise config.UsageError(f"{flag} {path}: cannot read it: {e.strerror or e}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise config.UsageError(f"{flag} {path}: cannot read it: not a regular file")
    finally:
        os.close(fd)


def cmd_daemon(args: argparse.Namespace) -> int:
    cfg = config.load(args.config)
    if args.listen:
        cfg["daemon"]["listen"] = args.listen
    if args.interval is not None:
        cfg["daemon"]["interval_seconds"] = args.interval
    cfg["daemon"]["state_dir"] = config.state_dir(cfg, args.state_dir)
    if args.kube:
        cfg["kube"]["enabled"] = True
    if args.hang_dir:
        cfg["hang"]["enabled"] = True
        cfg["hang"]["directory"] = args.hang_dir
    if args.dry_run:
        cfg["kube"]["dry_run"] = True
    if args.slurm:
        cfg["slurm"]["enabled"] = True
    if args.node_name and not cfg["slurm"]["node_name"]:
        cfg["slurm"]["node_name"] = args.node_name
    if args.probe_listen:
        cfg["pingmesh"]["enabled"] = True
        cfg["pingmesh"]["listen"] = args.probe_listen
    if args.probe_inventory:
        cfg["pingmesh"]["inventory_file"] = args.probe_inventory
    if cfg["pingmesh"]["enabled"] and not (cfg["pingmesh"]["inventory_file"] or cfg["kube"]["enabled"]):
        raise config.UsageError("pingmesh needs an inventory: --probe-inventory FILE (pingmesh.inventory_file), "
                                "or --kube to read the one the controller publishes")
    from nodehealth import node_pass
    from nodehealth.daemon import Daemon

    engine = node_pass.build_engine(cfg, args.root, node_pass.names(args.only), node_pass.names(args.skip) or ())
    node = node_pass.node_name(engine.host, args.node_name)
    logs.setup(args.log_format, args.log_level, node)
    return Daemon(engine, cfg, node).serve()


def cmd_clear(args: argparse.Namespace) -> int:
    """Clear sticky faults after a repair: the daemon on this node applies it at its next pass."""
    cfg = config.load(args.config)
    from nodehealth.policy import STATE_FILE, request_clear

    directory = config.state_dir(cfg, args.state_dir)
    if not os.path.isfile(os.path.join(directory, STATE_FILE)):  # a typo would clear nothing, said as done
        what = "no daemon state" if os.path.isdir(directory) else "no such directory"
        raise config.UsageError(f"--state-dir {directory}: {what} ({STATE_FILE}): give the state directory of "
                                "the daemon on this node")
    try:
        path = request_clear(directory, args.reason)
    except OSError as e:
        print(f"nodehealth: cannot write the clear request: {e}", file=sys.stderr)
        return EXIT_UNKNOWN
    print(f"clear requested ({path}); the daemon applies it at its next pass")
    return 0


def cmd_config_defaults(args: argparse.Namespace) -> int:
    """The configuration every command runs with: the defaults, merged with --config FILE."""
    import yaml

    sys.stdout.write(yaml.safe_dump(config.load(args.config), sort_keys=False, default_flow_style=False))
    return 0


def cmd_version(args: argparse.Namespace) -> int:
    print(f"nodehealth {__version__}")
    return 0


def _positive(text: str) -> float:
    """A number of seconds above zero (an interval of 0 would spin, a negative one is no interval)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number of seconds above 0, not {text}")
    return value


def pass_options(p: argparse.ArgumentParser) -> None:
    """The options of every command that runs a pass: check, daemon, slurm."""
    p.add_argument("--root", default="/", help="read /proc, /sys and /dev under DIR (a saved or fixture machine)")
    p.add_argument("--config", metavar="FILE|DIR",
                   help="configuration file (YAML or .json), or a directory of them merged in name order")
    p.add_argument("--only", metavar="A,B", help="run only these checks/collectors")
    p.add_argument("--skip", metavar="A,B", help="skip these checks/collectors")
    p.add_argument("--state-dir", metavar="DIR", help="state directory (default /var/lib/nodehealth)")
    p.add_argument("--node-name", help="node name in reports (default $NODE_NAME, else the hostname)")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="nodehealth", description="Health checks for GPU cluster nodes.")
    p.add_argument("--version", action="version", version=f"nodehealth {__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    c = sub.add_parser("check", help="run one pass and report (exit 0 healthy, 1 unhealthy, 2 unknown)",
                       description="Run one pass: every collector reads its source, every check judges, and the "
                                   "verdict is printed.", epilog=EXIT_CODES,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    pass_options(c)
    c.add_argument("--kernel-log", nargs="+", metavar="FILE",
                   help="read saved kernel logs (kmsg, dmesg, dmesg -T, journalctl -k, syslog) instead of /dev/kmsg")
    c.add_argument("--json", action="store_true", help="print the JSON report")
    c.add_argument("--fail-on", choices=("degraded", "warning"), default="degraded",
                   help="lowest severity that makes the node unhealthy (default degraded)")
    c.add_argument("-v", "--verbose", action="store_true",
                   help="list each check with its source and verdict, and findings of severity ok")
    c.add_argument("--list", action="store_true", help="list every check, its source and what it finds; run nothing")
    c.set_defaults(func=cmd_check)

    d = sub.add_parser("daemon", help="run passes on an interval and serve /metrics, /healthz, /v1/report")
    pass_options(d)
    d.add_argument("--listen", metavar="ADDR:PORT", help="HTTP listen address (default 0.0.0.0:9456)")
    d.add_argument("--interval", type=_positive, metavar="S", help="seconds between passes (default 30)")
    d.add_argument("--kube", action="store_true", help="publish taints, conditions and events on this Node")
    d.add_argument("--dry-run", action="store_true", help="compute and export what would be published; write nothing")
    d.add_argument("--slurm", action="store_true", help="drain this Slurm node when unhealthy, resume its own drains "
                                                        "(Slurm's name: slurm.node_name, $SLURMD_NODENAME or the "
                                                        "short hostname)")
    d.add_argument("--hang-dir", metavar="DIR", help="watch training ranks' hang records in DIR ($NODEHEALTH_HANG_DIR)")
    d.add_argument("--probe-listen", metavar="ADDR:PORT",
                   help="run the pingmesh probe agent: answer Pings here (port 9457) and probe this node's peers")
    d.add_argument("--probe-inventory", metavar="FILE", help="pingmesh inventory (nodes, leaves, addresses)")
    logs.add_options(d)
    d.set_defaults(func=cmd_daemon)

    c = sub.add_parser("clear", help="clear sticky faults after a repair (the daemon applies it at its next pass)")
    c.add_argument("--reason", default="cleared by an operator", help="why (logged, and recorded in an Event)")
    c.add_argument("--state-dir", metavar="DIR", help="the daemon's state directory (default /var/lib/nodehealth)")
    c.add_argument("--config", metavar="FILE|DIR",
                   help="configuration file (YAML or .json), or a directory of them merged in name order")
    c.set_defaults(func=cmd_clear)

    g = sub.add_parser("config", help="the configuration (defaults)")
    g = g.add_subparsers(dest="config_command", required=True).add_parser(
        "defaults", help="print the effective configuration as YAML: the defaults, merged with --config FILE")
    g.add_argument("--config", metavar="FILE", help="configuration file (YAML or .json) to merge")
    g.set_defaults(func=cmd_config_defaults)

    from nodehealth.hang import cli as hang
    from nodehealth.kube import cli as kube
    from nodehealth.netcheck import cli as netcheck
    from nodehealth.pingmesh import cli as pingmesh
    from nodehealth.rdma import cli as rdma
    from nodehealth.silences import cli as silences
    from nodehealth.slurm import cli as slurm

    hang.add_subcommands(sub)
    netcheck.add_subcommands(sub)
    rdma.add_subcommands(sub)
    pingmesh.add_subcommands(sub)  # pingmesh analyze, controller
    slurm.add_subcommands(sub, pass_options)
    kube.add_subcommands(sub)  # breaker reset
    silences.add_subcommands(sub)  # silence add, list, remove

    v = sub.add_parser("version", help="print the version")
    v.set_defaults(func=cmd_version)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return args.func(args)
    except (config.ConfigError, config.UsageError) as e:
        print(f"nodehealth: {e}", file=sys.stderr)
        return EXIT_UNKNOWN
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
