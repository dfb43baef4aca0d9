"""Command line: `nodehealth check`, `nodehealth daemon`, `nodehealth slurm`, `nodehealth version`.

Subcommands stay thin: they build the pieces and call the core. The daemon's modules (HTTP,
exposition) are imported only when the daemon runs, so `check` stays fast.
"""
from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any

from nodehealth import __version__, config, registry
from nodehealth.engine import Engine, nothing_checked
from nodehealth.host import HostPaths, boot_id, hostname
from nodehealth.model import Report, sort_findings, verdict
from nodehealth.policy import Policy, StateFile

EXIT_HEALTHY, EXIT_UNHEALTHY, EXIT_UNKNOWN = 0, 1, 2


class UsageError(Exception):
    pass


def _names(value: str) -> list[str]:
    return [n.strip() for n in value.split(",") if n.strip()]


def select(only: Sequence[str], skip: Sequence[str]) -> tuple[list, list]:
    """Collectors and checks to run. A check name selects that check (and the collectors it
    needs); a collector name selects that collector and the checks that read it."""
    known = {m.NAME for m in registry.COLLECTORS} | {m.NAME for m in registry.CHECKS}
    unknown = sorted(set(only) - known) + sorted(set(skip) - known)
    if unknown:
        raise UsageError(f"unknown check or collector: {', '.join(unknown)} "
                         f"(known: {', '.join(sorted(known))})")
    checks = [c for c in registry.CHECKS
              if (not only or c.NAME in only or any(n in only for n in c.NEEDS))
              and c.NAME not in skip and not any(n in skip for n in c.NEEDS)]
    wanted = {n for c in checks for n in c.NEEDS}
    collectors = [m for m in registry.COLLECTORS
                  if (not only or m.NAME in only or m.NAME in wanted) and m.NAME not in skip]
    return collectors, checks


def build_engine(args: argparse.Namespace, cfg: dict[str, Any]) -> Engine:
    if args.only is not None and not _names(args.only):
        raise UsageError("--only needs at least one check or collector name")
    collectors, checks = select(_names(args.only or ""), _names(args.skip or ""))
    host = HostPaths(args.root)
    if not os.path.isdir(host.procfs):  # a typo'd or empty root would otherwise judge nothing as healthy
        raise UsageError(f"--root {args.root}: no proc/ directory there, so it is no machine's root")
    return Engine(collectors, checks, host, cfg, timeout=cfg["daemon"]["collector_timeout_seconds"],
                  clock=host.now)


def node_name(args: argparse.Namespace, host: HostPaths) -> str:
    return getattr(args, "node_name", None) or os.environ.get("NODE_NAME") or hostname(host)


def one_pass(args: argparse.Namespace, cfg: dict[str, Any]) -> Report:
    """One check pass and its verdict: what `check` prints and `slurm` acts on."""
    engine = build_engine(args, cfg)
    host = engine.host
    results, findings = engine.run()
    findings += [f for f in [nothing_checked(engine.checks, results)] if f is not None]
    # One pass has nothing to debounce with; the state file (when there is one for this host)
    # still contributes the sticky faults the daemon recorded this boot.
    policy = Policy(cfg["policy"], (), boot_id(host), debounce=False)
    state_dir = args.state_dir or (cfg["daemon"]["state_dir"] if host.is_live else None)
    if state_dir and not getattr(args, "kernel_log", None):  # a saved log is another node's story, not this host's
        policy.restore(StateFile(state_dir).load(read_only=True))
    selected = {c.NAME for c in engine.checks}
    findings = policy.apply(findings, host.now()) + [f for f in policy.sticky_findings() if f.check in selected]
    status = verdict(findings, fail_on_warning=getattr(args, "fail_on", "degraded") == "warning")
    return Report(node_name(args, host), status, sort_findings(findings), list(results.values()), host.now())


def cmd_check(args: argparse.Namespace) -> int:
    cfg = config.load(args.config)
    if args.kernel_log:
        cfg["collectors"]["kmsg"]["files"] = list(args.kernel_log)
    report = one_pass(args, cfg)
    from nodehealth import report as render

    sys.stdout.write(render.to_json(report) if args.json else render.to_table(report, verbose=args.verbose))
    return report.status.code


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
        raise UsageError("pingmesh needs an inventory: --probe-inventory FILE (pingmesh.inventory_file), "
                         "or --kube to read the one the controller publishes")
    engine = build_engine(args, cfg)
    from nodehealth.daemon import Daemon

    return Daemon(engine, cfg, node_name(args, engine.host)).serve()


def cmd_clear(args: argparse.Namespace) -> int:
    """Clear sticky faults after a repair: the daemon on this node applies it at its next pass."""
    cfg = config.load(args.config)
    from nodehealth.daemon import request_clear

    try:
        path = request_clear(config.state_dir(cfg, args.state_dir), args.reason)
    except OSError as e:
        print(f"nodehealth: cannot write the clear request: {e}", file=sys.stderr)
        return EXIT_UNKNOWN
    print(f"clear requested ({path}); the daemon applies it at its next pass")
    return 0


def cmd_breaker_reset(args: argparse.Namespace) -> int:
    """Reset the cluster-wide quarantine circuit breaker after the operator has looked."""
    cfg = config.load(args.config)
    from nodehealth import kube

    try:
        print(kube.reset_breaker(cfg["kube"]))
    except kube.KubeError as e:
        print(f"nodehealth: cannot reset the breaker: {e}", file=sys.stderr)
        return EXIT_UNKNOWN
    return 0


def cmd_controller(args: argparse.Namespace) -> int:
    from nodehealth import controller  # the Kubernetes client and the analysis, only here

    return controller.cmd_controller(args)


def cmd_slurm(args: argparse.Namespace) -> int:
    from nodehealth import slurm  # scontrol and the drain logic, only here

    return slurm.cmd_slurm(args)


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


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--root", default="/", help="read /proc, /sys and /dev under DIR (a saved or fixture machine)")
    p.add_argument("--config", metavar="FILE", help="configuration file (YAML or .json)")
    p.add_argument("--only", metavar="A,B", help="run only these checks/collectors")
    p.add_argument("--skip", metavar="A,B", help="skip these checks/collectors")
    p.add_argument("--state-dir", metavar="DIR", help="state directory (default /var/lib/nodehealth)")
    p.add_argument("--node-name", help="node name in reports (default $NODE_NAME, else the hostname)")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="nodehealth", description="Health checks for GPU cluster nodes.")
    p.add_argument("--version", action="version", version=f"nodehealth {__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    c = sub.add_parser("check", help="run one pass and report (exit 0 healthy, 1 unhealthy, 2 unknown)")
    _common(c)
    c.add_argument("--kernel-log", nargs="+", metavar="FILE",
                   help="read saved kernel logs (kmsg, dmesg, dmesg -T, journalctl -k, syslog) instead of /dev/kmsg")
    c.add_argument("--json", action="store_true", help="print the JSON report")
    c.add_argument("--fail-on", choices=("degraded", "warning"), default="degraded",
                   help="lowest severity that makes the node unhealthy (default degraded)")
    c.add_argument("-v", "--verbose", action="store_true", help="also list unsupported collectors")
    c.set_defaults(func=cmd_check)

    d = sub.add_parser("daemon", help="run passes on an interval and serve /metrics, /healthz, /v1/report")
    _common(d)
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
    d.set_defaults(func=cmd_daemon)

    c = sub.add_parser("clear", help="clear sticky faults after a repair (the daemon applies it at its next pass)")
    c.add_argument("--reason", default="cleared by an operator", help="why (logged, and recorded in an Event)")
    c.add_argument("--state-dir", metavar="DIR", help="the daemon's state directory (default /var/lib/nodehealth)")
    c.add_argument("--config", metavar="FILE", help="configuration file (YAML or .json)")
    c.set_defaults(func=cmd_clear)

    from nodehealth.hang.cli import add_subcommands as add_hang_subcommands

    add_hang_subcommands(sub)

    from nodehealth.net.cli import add_subcommands as add_pingmesh_subcommands

    add_pingmesh_subcommands(sub)

    c = sub.add_parser("controller", help="the cluster-wide pingmesh analysis (a Deployment; one leader "
                                          "writes the verdict ConfigMap)")
    c.add_argument("--config", metavar="FILE", help="configuration file (YAML or .json), the agents' one")
    c.add_argument("--listen", metavar="ADDR:PORT", help="/metrics and /healthz (default 0.0.0.0:9458)")
    c.add_argument("--identity", metavar="NAME", help="its name in the leader Lease (default $POD_NAME, else the "
                                                      "hostname)")
    c.set_defaults(func=cmd_controller)

    c = sub.add_parser("slurm", help="one pass, then drain this Slurm node (unhealthy) or resume it (healthy, "
                                     "drained by nodehealth): HealthCheckProgram or Prolog")
    _common(c)
    c.set_defaults(func=cmd_slurm)

    b = sub.add_parser("breaker", help="the cluster-wide quarantine circuit breaker")
    bsub = b.add_subparsers(dest="breaker_command", required=True)
    r = bsub.add_parser("reset", help="let nodehealth quarantine nodes again after the breaker tripped")
    r.add_argument("--config", metavar="FILE", help="configuration file (YAML or .json)")
    r.set_defaults(func=cmd_breaker_reset)

    v = sub.add_parser("version", help="print the version")
    v.set_defaults(func=cmd_version)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return args.func(args)
    except (config.ConfigError, UsageError) as e:
        print(f"nodehealth: {e}", file=sys.stderr)
        return EXIT_UNKNOWN
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
