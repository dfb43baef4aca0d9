"""`nodehealth hang watch DIR` and `nodehealth hang report BUNDLE_OR_DIR...`.

nodehealth/cli.py calls add_subcommands(); `python -m nodehealth.hang.cli` runs them alone.
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from collections.abc import Sequence
from typing import Any

from nodehealth import logs

EXIT_OK, EXIT_HANG, EXIT_ERROR = 0, 1, 2


def add_subcommands(subparsers: Any) -> None:
    hang = subparsers.add_parser("hang", help="hang detection for distributed training (watch, report)")
    sub = hang.add_subparsers(dest="hang_command", required=True)

    w = sub.add_parser("watch", help="watch a directory of rank state records; on a hang, write a bundle")
    w.add_argument("directory", help="the ranks' $NODEHEALTH_HANG_DIR")
    w.add_argument("--out", metavar="DIR", help="where bundles go (default DIR/bundles)")
    w.add_argument("--floor", type=float, metavar="S", help="pending-op age that is always a hang (default 180)")
    w.add_argument("--factor", type=float, metavar="K", help="or K x the op's p99, when larger (default 10)")
    w.add_argument("--heartbeat", type=float, metavar="S", help="heartbeat silence that is a hang (default 60)")
    w.add_argument("--interval", type=float, metavar="S", help="seconds between scans (default 1)")
    w.add_argument("--py-spy", metavar="PATH", help="py-spy binary (default: py-spy on PATH)")
    w.add_argument("--no-native", action="store_true", help="skip the slower native-frames pass")
    w.add_argument("--once", action="store_true", help="scan once and exit (1 if a hang was found)")
    w.add_argument("--exit-on-hang", action="store_true",
                   help="exit 1 after the first hang (its bundle written, or refused)")
    logs.add_options(w)
    w.set_defaults(func=cmd_watch)

    r = sub.add_parser("report", help="desync verdict and merged stacks from bundles or a record directory")
    r.add_argument("paths", nargs="+", metavar="BUNDLE_OR_DIR")
    r.add_argument("--format", choices=("text", "json", "folded", "svg"), default="text")
    r.add_argument("-o", "--output", metavar="FILE", help="write here instead of stdout")
    r.add_argument("--pyspy-text", action="append", default=[], metavar="RANK=FILE",
                   help="add a rank's stack from a saved `py-spy dump` text output")
    r.set_defaults(func=cmd_report)


def cmd_watch(args: argparse.Namespace) -> int:
    from nodehealth.hang.detector import Detector

    cfg: dict[str, Any] = {}
    for key, value in (("floor_seconds", args.floor), ("p99_factor", args.factor),
                       ("heartbeat_timeout_seconds", args.heartbeat), ("scan_interval_seconds", args.interval),
                       ("py_spy", args.py_spy)):
        if value is not None:
            cfg[key] = value
    if args.no_native:
        cfg["native_stacks"] = False
    logs.setup(args.log_format, args.log_level, os.environ.get("NODE_NAME"))
    detector = Detector(args.directory, args.out or os.path.join(args.directory, "bundles"), cfg)
    if args.once:
        _scan(detector)
        return EXIT_HANG if any(state.hung for state in detector.jobs.values()) else EXIT_OK
    stop = detector.stop  # set by a signal: a dump in flight is interrupted, its target resumed
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    detector.watch_exits()
    try:
        while not stop.is_set():
            if _scan(detector) and args.exit_on_hang:
                return EXIT_HANG
            stop.wait(detector.cfg["scan_interval_seconds"])
    finally:
        detector.exits.close()
    return EXIT_OK


def _scan(detector: Any) -> bool:
    """Scan once; print the bundles written and the hangs whose bundle could not be. Whether either."""
    paths = detector.poll()
    for path in paths:
        print(f"hang bundle: {path}", flush=True)
    for job, why in sorted(detector.unwritten.items()):
        print(f"hang in job {job}: no bundle written: {why}", file=sys.stderr, flush=True)
    return bool(paths or detector.unwritten)


def cmd_report(args: argparse.Namespace) -> int:
    from nodehealth.hang import merge
    from nodehealth.hang.stacks import parse_text_dump

    try:
        bundles = merge.load(args.paths)
        extra = {}
        for item in args.pyspy_text:
            rank, _, path = item.partition("=")
            if not rank.isdigit() or not path:
                raise merge.ReportError(f"--pyspy-text wants RANK=FILE, not {item!r}")
            with open(path, encoding="utf-8", errors="replace") as f:
                extra[rank] = {"threads": parse_text_dump(f.read(16 << 20))}
    except (merge.ReportError, OSError) as e:
        print(f"nodehealth hang report: {e}", file=sys.stderr)
        return EXIT_ERROR
    out, docs, found = [], [], False
    jobs = list(merge.combine(bundles).values())
    if args.format == "svg" and len(jobs) > 1:
        print(f"nodehealth hang report: {len(jobs)} jobs in the input; the SVG shows the first, {jobs[0]['job']}",
              file=sys.stderr)
        jobs = jobs[:1]
    for job in jobs:
        job["stacks"].update(extra)
        if job.get("live") and not merge.live_hang(job, time.time()):
            verdicts = []
            from nodehealth.hang.rules import DEFAULTS, stragglers

            job["note"] = ("no hang: every pending op is younger than its limit and every heartbeat is fresh "
                           "(records written moments apart are not compared)")
            job["note"] += "".join(f"\n  {s['summary']}" for s in stragglers(job["records"], DEFAULTS))
        else:
            verdicts = merge.verdicts(job)
        found = found or bool(verdicts)
        tree = merge.stack_tree(job["stacks"], job.get("native_stacks"))
        if args.format == "json":
            docs.append(merge.to_json(job, tree, verdicts))
        elif args.format == "folded":
            out.append(merge.to_folded(tree))
        elif args.format == "svg":
            out.append(merge.to_svg(job, tree, verdicts))
        else:
            out.append(merge.to_text(job, tree, verdicts))
    if args.format == "json":
        import json

        out.append(json.dumps({"jobs": docs}, indent=2, sort_keys=True) + "\n")
    text = "\n".join(out)
    if args.output:
        with open(args.output, "w", encoding="utf-8") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    return EXIT_HANG if found else EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="nodehealth")
    add_subcommands(p.add_subparsers(dest="command", required=True))
    args = p.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
