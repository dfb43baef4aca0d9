"""`nodehealth netcheck serve | run | job`: the argument parsers; the commands (preflight.py) are
imported only when one runs, so that every `nodehealth` start stays cheap.

nodehealth/cli.py calls add_subcommands().
"""
from __future__ import annotations

import argparse
from typing import Any


def add_subcommands(subparsers: Any) -> None:
    nc = subparsers.add_parser("netcheck", help="a job's network preflight: pair its nodes, name the faulty and "
                                                "slow ones (exit 0 all sound, 1 faulty or slow, 2 undecided)")
    sub = nc.add_subparsers(dest="netcheck_command", required=True)
    s = sub.add_parser("serve", help="the agent on every node: answers the coordinator and its peers")
    s.add_argument("--listen", required=True, metavar="ADDR:PORT", help="where the coordinator reaches it")
    s.add_argument("--data", metavar="ADDR:PORT", help="where peers test it (default: --listen); another "
                                                      "address here tests the data network, not the control one")
    s.add_argument("--name", help="its name in the report (default: the hostname)")
    s.add_argument("--for", dest="lifetime", type=float, metavar="S", help="exit after S seconds (default: never)")
    s.add_argument("--coordinator", metavar="ADDR,...", help="who may run checks with this agent: addresses, "
                                                            "networks (10.0.0.0/24) or names, 'any' for anyone "
                                                            "(default: this host's own addresses)")
    _test_options(s)
    s.set_defaults(func=_preflight("cmd_serve"))
    r = sub.add_parser("run", help="the coordinator: runs the rounds of pair tests over the nodes' agents")
    r.add_argument("--hosts", metavar="A:P,B:P", help="the agents' ADDR:PORT ($NODEHEALTH_NETCHECK_HOSTS)")
    r.add_argument("--hosts-file", metavar="FILE", help="the agents' ADDR:PORT, one a line")
    _round_options(r)
    r.set_defaults(func=_preflight("cmd_run"))
    j = sub.add_parser("job", help="every node of a job runs this before it starts (init container, a step before "
                                   "torchrun): finds the job's nodes, the first coordinates, all exit with the verdict",
                       description="The job's nodes come from --hosts/--hosts-file, --kube-selector, or else the "
                                   "environment: $NODEHEALTH_NETCHECK_HOSTS, Slurm ($SLURM_JOB_NODELIST, "
                                   "$SLURM_NODEID) or torchrun ($PET_NNODES, $PET_NODE_RANK, $PET_MASTER_ADDR or "
                                   "$PET_RDZV_ENDPOINT; or $WORLD_SIZE, $LOCAL_WORLD_SIZE, $GROUP_RANK and "
                                   "$MASTER_ADDR under torchrun itself) or an Indexed Job ($JOB_COMPLETION_INDEX "
                                   "and --nodes: its headless service's names). Every node exits with the job's "
                                   "verdict.")
    j.add_argument("--hosts", metavar="H1,H2", help="the job's nodes, the coordinator first")
    j.add_argument("--hosts-file", metavar="FILE", help="the job's nodes, one a line (an MPI hostfile works)")
    j.add_argument("--kube-selector", metavar="SELECTOR", help="the job's pods by label (e.g. job-name=train)")
    j.add_argument("--namespace", help="the pods' namespace (default: $POD_NAMESPACE, else the service account's)")
    j.add_argument("--nodes", type=int, metavar="N", help="how many pods the job has (--kube-selector, an Indexed "
                                                          "Job; default for the former: $WORLD_SIZE "
                                                          "/ $PET_NNODES)")
    j.add_argument("--kubeconfig", metavar="FILE", help="default: in-cluster, else ~/.kube/config")
    j.add_argument("--listen", metavar="ADDR", help="the agent's address, where the coordinator reaches it "
                                                   "(default: all; reached where this node reaches the coordinator)")
    j.add_argument("--data", metavar="ADDR", help="this node's address on the data network (default: its address "
                                                 "on the route to the coordinator)")
    j.add_argument("--name", help="this node's name in the report (default: the hostname, the pod's name)")
    j.add_argument("--port", type=int, metavar="P", help="every node's agent port (default: netcheck.port, 9460)")
    j.add_argument("--wait", dest="wait_seconds", type=float, metavar="S",
                   help="how long the coordinator waits for every node to join (default 300)")
    _round_options(j)
    j.set_defaults(func=_preflight("cmd_job"))


def _test_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="FILE", help="configuration file (YAML or .json): the netcheck section")
    p.add_argument("--method", choices=("auto", "tcp", "rdma"), help="auto (default): rdma-bw where every node has "
                                                                     "a verbs device, else TCP for all")
    p.add_argument("--rdma-device", metavar="DEV", help="verbs device (default: the one holding the data address)")
    p.add_argument("--gid-index", type=int, metavar="N", help="RoCE GID index (default: the data address's RoCE v2 "
                                                             "GID)")
    p.add_argument("--rdma-port", type=int, metavar="P", help="rdma-bw's out-of-band port (default 18515)")


def _round_options(p: argparse.ArgumentParser) -> None:
    _test_options(p)
    p.add_argument("--inventory", metavar="FILE", help="pingmesh inventory: pairs under the same leaf first")
    p.add_argument("--seconds", type=float, metavar="S", help="per test (default 2)")
    p.add_argument("--slow-fraction", type=float, metavar="F",
                   help="a test below F x the median of the other nodes' best bandwidths is slow (default 0.5)")
    p.add_argument("--max-rounds", type=int, metavar="N", help="at most N rounds (default 10)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")


def _preflight(name: str):
    """The command in nodehealth/netcheck/preflight.py, imported when it runs."""
    def run(args: argparse.Namespace) -> int:
        from nodehealth.netcheck import preflight

        return getattr(preflight, name)(args)
    return run
