"""`nodehealth rdma-bw`: its argument parser, and the command, which imports pyverbs (bw.py) only
when a test runs.

nodehealth/cli.py calls add_subcommands().
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any

EXIT_OK, EXIT_FAULT = 0, 1


def add_subcommands(subparsers: Any) -> None:
    r = subparsers.add_parser("rdma-bw", help="RDMA WRITE bandwidth to a peer (perftest's ib_write_bw method, "
                                              "pyverbs); exit 0 measured, 1 failed or could not run",
                              description="Run `nodehealth rdma-bw` on the server, then `nodehealth rdma-bw SERVER` "
                                          "on the client. Defaults are perftest's.")
    r.add_argument("server", nargs="?", help="the server's address (omit on the server)")
    r.add_argument("-d", "--ib-dev", dest="device", help="RDMA device (default: the first)")
    r.add_argument("-i", "--ib-port", type=int, default=1, help="device port (default 1)")
    r.add_argument("-x", "--gid-index", type=int, help="GID index (RoCE needs one; default: LID only)")
    r.add_argument("-s", "--size", type=int, default=65536, help="message size in bytes (default 65536)")
    r.add_argument("-n", "--iters", dest="iterations", type=int, default=5000, help="messages (default 5000)")
    r.add_argument("-D", "--duration", type=float, help="run for S seconds instead of a number of messages")
    r.add_argument("-t", "--tx-depth", type=int, default=128, help="outstanding writes (default 128)")
    r.add_argument("-Q", "--cq-mod", type=int, help="post writes N at a time, the last signalled (default: a quarter "
                                                    "of the tx depth)")
    r.add_argument("-p", "--port", type=int, default=18515, help="TCP port of the out-of-band exchange (18515)")
    r.add_argument("--no-warmup", action="store_true", help="skip the untimed warm-up writes")
    r.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for the peer (default 30)")
    r.add_argument("--json", action="store_true", help="print the result as JSON")
    r.set_defaults(func=cmd_rdma_bw)


def cmd_rdma_bw(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from nodehealth.rdma import bw as rdma  # pyverbs only when a test runs

    opts = rdma.Options(args.device, args.ib_port, args.gid_index, args.size, args.iterations, args.duration,
                        args.tx_depth, args.cq_mod, args.port, not args.no_warmup)
    try:
        if args.server:
            result = rdma.client(args.server, opts, timeout=args.timeout)
        else:
            result = rdma.server(opts, timeout=args.timeout)
    except rdma.RdmaError as e:
        print(f"nodehealth rdma-bw: {e}", file=sys.stderr)
        return EXIT_FAULT
    if args.json:
        sys.stdout.write(json.dumps(asdict(result), sort_keys=True) + "\n")
    else:
        print(" #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]")
        print(f" {result.size:<10d} {result.iterations:<14d} {result.bw_peak_gbps:<18.2f} "
              f"{result.bw_avg_gbps:<20.2f} {result.msg_rate_mpps:.6f}")
        print(f"device {result.device}; bytes verified: {'yes' if result.verified else 'no'}")
    return EXIT_OK
