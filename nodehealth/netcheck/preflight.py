"""`nodehealth netcheck serve | run | job`: a job's network preflight on its nodes.

serve is the agent on every node, run the coordinator given the agents' addresses, and job what
every node of a job runs before it starts (an init container, or a step before torchrun): it
serves, finds the job's other nodes (nodehealth/netcheck/discovery.py), the first node coordinates, and
every node prints the verdict and exits with it. Imported only when a netcheck command runs.
"""
from __future__ import annotations

import argparse
import ipaddress
import json
import os
import socket
import sys
import threading
import time
from typing import Any

from nodehealth import config
from nodehealth.host import HostPaths, addresses
from nodehealth.netcheck import agent, discovery, rounds
from nodehealth.netcheck import coordinator as coord
from nodehealth.netcheck.admission import Admission
from nodehealth.netcheck.wire import CONNECT_TIMEOUT, StreamError, endpoint, split_endpoint
from nodehealth.tls.identity import load_identity

EXIT_OK, EXIT_FAULT, EXIT_ERROR = 0, 1, 2
TESTS = {agent.TCP: "TCP stream between the nodes' agents (the hosts' TCP path, not RDMA)",
         agent.RDMA: "RDMA WRITE with rdma-bw between the nodes' verbs devices (perftest's method)"}


class Usage(Exception):
    """Bad options or configuration: one line, exit 2."""


def settings(args: argparse.Namespace) -> dict[str, Any]:
    """The netcheck section of the configuration with the flags given on top."""
    try:
        cfg = config.load(getattr(args, "config", None))["netcheck"]
    except config.ConfigError as e:
        raise Usage(str(e)) from None
    given = set()
    for key in ("port", "method", "seconds", "slow_fraction", "max_rounds", "rdma_port", "wait_seconds"):
        value = getattr(args, key, None)
        if value is not None:
            cfg[key] = value
            given.add(key)
    try:
        config.check_ranges(dict(config.defaults(), netcheck=cfg))
    except config.ConfigError as e:
        key, _, why = str(e).removeprefix("netcheck.").partition(":")
        raise Usage(f"--{key.replace('_', '-')}:{why}" if key in given else str(e)) from None
    if cfg["seconds"] > agent.MAX_SECONDS:
        raise Usage(f"--seconds must be at most {agent.MAX_SECONDS:g}")
    return cfg


def mesh_identity(args: argparse.Namespace, name: str | None = None) -> Any:
    """The mesh's identity when tls.enabled (every agent and coordinator of the job then needs a
    certificate of the cluster CA; an agent's must carry its `name`), else None."""
    try:
        return load_identity(config.load(getattr(args, "config", None)), name)
    except config.ConfigError as e:
        raise Usage(str(e)) from None


# -- the agent ---------------------------------------------------------------------------------

def agent_config(name: str, data: str, cfg: dict[str, Any], device: str | None, gid_index: int | None
                 ) -> agent.AgentConfig:
    """The agent's identity and its verbs device: found from the data address unless given; with
    method auto a node without one offers only TCP (said on stderr), with rdma that is an error."""
    setup = None
    if cfg["method"] != agent.TCP:
        from nodehealth.rdma import bw, pair

        try:
            setup = pair.find_setup(HostPaths("/"), split_endpoint(data)[0], device, gid_index,
                                        port=cfg["rdma_port"], size=cfg["rdma_size"])
        except bw.RdmaError as e:
            if cfg["method"] == agent.RDMA:
                raise Usage(f"no RDMA test here: {e}") from None
            print(f"nodehealth netcheck: TCP only on this node: {e}", file=sys.stderr)
    return agent.AgentConfig(name, data, setup)


def start_agent(listen: str, data: str | None, acfg: agent.AgentConfig, admission: Admission,
                rendezvous: agent.Rendezvous | None = None, tls: Any = None) -> list[agent.Agent]:
    """The agent on `listen` and, when the data address differs, a second one there (one job for
    both); serving in threads."""
    agents = [agent.Agent(split_endpoint(listen), acfg, rendezvous, admission, tls)]
    try:
        if data and data != listen:
            agents.append(agent.Agent(split_endpoint(data), acfg, admission=admission, tls=tls))
    except OSError:
        stop_agents(agents)
        raise
    for a in agents:
        a.start()
    return agents


def stop_agents(agents: list[agent.Agent]) -> None:
    for a in agents:
        a.close()


def cmd_serve(args: argparse.Namespace) -> int:
    try:
        cfg = settings(args)
        split_endpoint(args.listen)
        data = args.data or args.listen
        split_endpoint(data)
        acfg = agent_config(args.name or socket.gethostname(), data, cfg, args.rdma_device, args.gid_index)
        agents = start_agent(args.listen, args.data, acfg, Admission(coordinators(args.coordinator)),
                             tls=mesh_identity(args, acfg.name))
    except (Usage, ValueError, OSError) as e:
        print(f"nodehealth netcheck serve: {getattr(e, 'strerror', None) or e}", file=sys.stderr)
        return EXIT_ERROR
    done = threading.Event()
    try:
        done.wait(args.lifetime)
    finally:
        stop_agents(agents)
    return EXIT_OK


def coordinators(given: str | None) -> list[str] | None:
    """`--coordinator`: addresses, networks or names (`any`: every address); None: this host's own."""
    if not given:
        return None
    found: list[str] = []
    for item in (x.strip() for x in given.split(",")):
        if item == "any":
            found += ["0.0.0.0/0", "::/0"]
        elif item:
            try:
                ipaddress.ip_network(item, strict=False)
                found.append(item)
            except ValueError:
                resolved = addresses(item)
                if not resolved:
                    raise Usage(f"--coordinator: {item!r} is no address, network or name that resolves") from None
                found += sorted(resolved)
    return found


# -- the coordinator ---------------------------------------------------------------------------

def coordinate(endpoints: list[str], cfg: dict[str, Any], leaves: dict[str, str],
               missing: list[dict[str, str]] | None = None, source: str | None = None,
               tls: Any = None) -> tuple[dict, int]:
    """Run the rounds over the agents at `endpoints` (asked from the address `source`, where given;
    with `tls`, the mesh's identity); the JSON report and the exit code."""
    hosts, unreachable = coord.hello(sorted(set(endpoints)), CONNECT_TIMEOUT * 2, source, tls)
    names = [h.name for h in hosts]
    if len(set(names)) != len(names):
        raise Usage("two agents answer with the same name: give each its own --name")
    try:
        method = coord.choose_method(hosts, cfg["method"])
    except ValueError as e:
        raise Usage(str(e)) from None
    result = None
    if len(hosts) >= 2:
        job = coord.Job.new(source, tls)
        refused = coord.claim(hosts, job, coord.lease(cfg["seconds"], cfg["max_rounds"], method))
        unreachable += refused
        taken = [h for h in hosts if h.endpoint not in dict(refused)]
        try:
            if len(taken) >= 2:
                nc = rounds.Netcheck([h.name for h in taken], leaves, cfg["slow_fraction"], cfg["max_rounds"])
                coord.run_rounds(nc, {h.name: h for h in taken}, cfg["seconds"], method, job)
                result = nc.result()
        finally:
            coord.release(taken, job)
    doc = rounds.to_dict(result, method) if result else {"method": method, "faulty": [], "slow": [],
                                                           "unresolved": [], "nodes": {}, "rounds": 0,
                                                           "median_gbps": None}
    doc["test"] = TESTS[method]
    if method == agent.RDMA:
        for h in hosts:
            doc["nodes"].get(h.name, {})["device"] = h.rdma
    doc["unreachable"] = [{"agent": ep, "error": why} for ep, why in unreachable]
    by_name = {h.name: h for h in hosts}
    doc["unreachable"] += [{"agent": by_name[n].endpoint, "node": n, "error": why}
                           for n, why in sorted((result.unreachable if result else {}).items())]
    doc["missing"] = missing or []
    if doc["faulty"] or doc["slow"] or ((doc["unreachable"] or missing) and len(hosts) >= 2):
        return doc, EXIT_FAULT
    if result is None or doc["unresolved"]:
        return doc, EXIT_ERROR
    return doc, EXIT_OK


def read_leaves(path: str | None) -> dict[str, str]:
    if not path:
        return {}
    from nodehealth import inventory

    try:
        return {n.name: n.leaf for n in inventory.load_file(path).nodes}
    except inventory.InventoryError as e:
        raise Usage(str(e)) from None


def cmd_run(args: argparse.Namespace) -> int:
    try:
        cfg = settings(args)
        endpoints = [e.strip() for e in (args.hosts or os.environ.get("NODEHEALTH_NETCHECK_HOSTS", "")).split(",")]
        if args.hosts_file:
            endpoints += discovery.read_hostfile(args.hosts_file)
        endpoints = [e for e in endpoints if e and not e.startswith("#")]
        for e in endpoints:
            split_endpoint(e)
        if len(set(endpoints)) < 2:
            raise Usage("give at least two agents (--hosts A:P,B:P, --hosts-file or $NODEHEALTH_NETCHECK_HOSTS)")
        doc, code = coordinate(endpoints, cfg, read_leaves(args.inventory), tls=mesh_identity(args))
    except (Usage, ValueError, discovery.DiscoveryError) as e:
        print(f"nodehealth netcheck: {e}", file=sys.stderr)
        return EXIT_ERROR
    write(doc, args.json)
    return code


def write(doc: dict, as_json: bool) -> None:
    sys.stdout.write(json.dumps(doc, indent=2, sort_keys=True) + "\n" if as_json else table(doc))
    sys.stdout.flush()


def table(doc: dict) -> str:
    rows = [("NODE", "STATUS", "BEST GB/S", "EVIDENCE")]
    for name, node in doc["nodes"].items():
        tests = node["tests"]
        best = max((t["bandwidth_gbps"] for t in tests if t["bandwidth_gbps"] is not None), default=None)
        bad = [t for t in tests if t["outcome"] != "pass"]
        evidence = "; ".join(([node["error"]] if "error" in node else [])
                             + [f"round {t['round']}: {t['outcome']}: {t['evidence']}" for t in bad[:3]])
        rows.append((name, node["status"], "-" if best is None else f"{best:.3g}", evidence))
    for u in doc["unreachable"]:
        if "node" not in u:  # one that never answered; the others have their row above
            rows.append((u["agent"], "unreachable", "-", u["error"]))
    for m in doc.get("missing", []):
        rows.append((m["node"], "missing", "-", m["error"]))
    widths = [max(len(r[k]) for r in rows) for k in range(3)]
    lines = ["  ".join(r[k].ljust(widths[k]) for k in range(3)) + "  " + r[3] for r in rows]
    median = doc.get("median_gbps")
    if doc.get("error"):
        lines.append(f"no test ran: {doc['error']}")
    lines.append(f"method: {doc['method'].upper() or '-'}: {doc['test'] or '-'}; rounds: {doc['rounds']}; median "
                 f"{'-' if median is None else f'{median:.3g}'} Gb/s; faulty: {', '.join(doc['faulty']) or 'none'}; "
                 f"slow: {', '.join(doc['slow']) or 'none'}"
                 + (f"; unresolved: {', '.join(doc['unresolved'])}" if doc["unresolved"] else "")
                 + (f"; unreachable: {', '.join(u.get('node', u['agent']) for u in doc['unreachable'])}"
                    if doc["unreachable"] else ""))
    return "\n".join(lines) + "\n"


# -- this node ----------------------------------------------------------------------------------

def is_local_address(host: str) -> bool:
    """Whether `host` is this machine: its hostname, or a name whose address it can bind to."""
    if host in (socket.gethostname(), socket.getfqdn()):
        return True
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except OSError:
        return False
    for family, _, _, _, addr in infos:
        with socket.socket(family, socket.SOCK_STREAM) as s:
            try:
                s.bind((addr[0], 0))
            except OSError:
                continue
            return not ipaddress.ip_address(addr[0]).is_unspecified
    return False


def source_address(host: str, port: int) -> str:
    """This node's address on the route to `host` (a UDP connect sends nothing)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)
    except OSError as e:
        raise Usage(f"cannot resolve the coordinator {host}: {e.strerror or e}") from None
    family, _, _, _, addr = infos[0]
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        try:
            s.connect(addr)
        except OSError as e:
            raise Usage(f"no route to the coordinator {host}: {e.strerror or e}") from None
        return s.getsockname()[0]


# -- every node of a job -----------------------------------------------------------------------

def cmd_job(args: argparse.Namespace) -> int:
    """Serve, find the job, join the coordinator (or be it), print the verdict, exit with it."""
    try:
        cfg = settings(args)
        name = args.name or os.environ.get("POD_NAME") or socket.gethostname()
        plan = find_plan(args, cfg, name)
        port = cfg["port"]
        coordinator = plan.addresses.get(plan.coordinator, discovery.host_of(plan.coordinator))
        # the coordinator reaches this node where it reaches the coordinator; peers test it on --data
        control = args.listen if args.listen not in (None, "0.0.0.0", "::") else source_address(coordinator,
                                                                                                         port)
        me = agent.Member(name, endpoint(control, port))
        acfg = agent_config(name, endpoint(args.data or control, port), cfg, args.rdma_device, args.gid_index)
        # the longest a joined node waits for the verdict: the others joining, then every round
        budget = cfg["wait_seconds"] + cfg["max_rounds"] * 2 * (cfg["seconds"] + coord.PAIR_SLACK[agent.RDMA])
        rendezvous = None
        job = JobNodes(plan)
        if plan.is_coordinator:
            rendezvous = agent.Rendezvous(plan.count, budget, job.accept)
            if why := rendezvous.add(me, control):
                raise Usage(f"this node is not one of the job's: {why}")
        # Claims come from the coordinator only. Where the job's hosts are known, only they connect to
        # a node; the coordinator hears every join, to tell a node that is not one of them why.
        admission = Admission(sorted(addresses(coordinator)),
                              set(job.by_address) if plan.hosts and not plan.is_coordinator else None)
        tls = mesh_identity(args, name)
        agents = start_agent(endpoint(args.listen or "0.0.0.0", port), None, acfg, admission, rendezvous, tls)
    except (Usage, ValueError, OSError, discovery.DiscoveryError) as e:
        print(f"nodehealth netcheck job: {getattr(e, 'strerror', None) or e}", file=sys.stderr)
        return EXIT_ERROR
    try:
        if rendezvous is not None:
            doc, code = _coordinate_job(job, cfg, rendezvous, args, control, tls)
        else:
            answer = agent.join(endpoint(coordinator, port), {"op": "join", "name": me.name, "agent": me.agent},
                                 time.monotonic() + cfg["wait_seconds"], budget, source=control, tls=tls)
            doc, code = answer.get("verdict"), answer.get("code")
            if not isinstance(doc, dict) or code not in (EXIT_OK, EXIT_FAULT, EXIT_ERROR):
                raise StreamError(f"the coordinator's answer is no verdict: {str(answer)[:200]}")
    except (Usage, StreamError) as e:
        print(f"nodehealth netcheck job: {e}", file=sys.stderr)
        return EXIT_ERROR
    finally:
        stop_agents(agents)
    doc["coordinator"] = plan.coordinator
    write(doc, args.json)
    return code


def _coordinate_job(job: JobNodes, cfg: dict[str, Any], rendezvous: agent.Rendezvous, args: argparse.Namespace,
                    source: str, tls: Any = None) -> tuple[dict, int]:
    members = rendezvous.wait(job.plan.count, time.monotonic() + cfg["wait_seconds"])
    missing = job.missing(members, cfg["wait_seconds"])
    try:
        doc, code = coordinate([m.agent for m in members], cfg, read_leaves(args.inventory), missing, source, tls)
    except Usage as e:  # the others learn it too, rather than waiting for a verdict that never comes
        doc, code = {"method": "", "test": "", "error": str(e), "faulty": [], "slow": [], "unresolved": [],
                     "nodes": {}, "rounds": 0, "median_gbps": None, "unreachable": [], "missing": missing}, EXIT_ERROR
    doc["source"] = job.plan.source
    rendezvous.finish({"verdict": doc, "code": code}, linger=CONNECT_TIMEOUT)
    return doc, code


class JobNodes:
    """Where the job's hosts are known, a node joins only from an address of one of them (its
    name is a label: a stranger could claim any), and the ones that never joined are named."""

    def __init__(self, plan):
        self.plan = plan
        self.by_address: dict[str, str] = {}  # each address of the job's hosts -> the host
        for h in plan.hosts:
            for a in {plan.addresses.get(h, "")} | addresses(discovery.host_of(h)):
                if a:
                    self.by_address.setdefault(a, h)
        self.taken: dict[str, str] = {}  # host -> the name it joined as
        self._lock = threading.Lock()

    def accept(self, m: agent.Member, source: str) -> str | None:
        if not self.plan.hosts:
            return None
        host = self.by_address.get(source.removeprefix("::ffff:"))
        if host is None:
            return f"{m.name} joins from {source}, which is not an address of the job's nodes"
        with self._lock:
            if self.taken.setdefault(host, m.name) != m.name:
                return f"{host} has joined already as {self.taken[host]}"
        return None

    def missing(self, members: list[agent.Member], waited: float) -> list[dict[str, str]]:
        why = f"never joined within {waited:g} s"
        if self.plan.hosts:
            return [{"node": h, "error": why} for h in self.plan.hosts if h not in self.taken]
        if len(members) < self.plan.min_count:  # an elastic job (torchrun MIN:MAX) may start with MIN
            return [{"node": f"{self.plan.count - len(members)} of {self.plan.count} nodes", "error": why}]
        return []


def find_plan(args: argparse.Namespace, cfg: dict[str, Any], name: str):
    """The job's plan from the flags, else the environment: a host list, Slurm, then torchrun."""
    env = os.environ
    is_local = is_local_address
    if args.listen not in (None, "0.0.0.0", "::"):  # bound to one address: this node is that address
        listen = args.listen

        def is_local(host: str) -> bool:
            return host == listen or listen in addresses(host)
    hosts = [h for h in (args.hosts or "").split(",") if h.strip()]
    if args.hosts_file:
        hosts += discovery.read_hostfile(args.hosts_file)
    if hosts:
        return discovery.from_hosts(hosts, is_local)
    if args.kube_selector:
        return kube_plan(args, cfg, name)
    if env.get("NODEHEALTH_NETCHECK_HOSTS"):
        return discovery.from_hosts(env["NODEHEALTH_NETCHECK_HOSTS"].split(","), is_local)
    if env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST"):
        return discovery.from_slurm(env)
    if any(env.get(k) for k in ("MASTER_ADDR", "PET_MASTER_ADDR", "PET_RDZV_ENDPOINT")):
        return discovery.from_torchrun(env, is_local)
    if env.get("JOB_COMPLETION_INDEX") and args.nodes:
        return discovery.from_indexed_job(env["JOB_COMPLETION_INDEX"], socket.gethostname(), socket.getfqdn(),
                                         args.nodes)
    raise Usage("no way to find the job's nodes: give --hosts, --hosts-file or --kube-selector, or run it under "
                "Slurm (srun), with torchrun's environment ($PET_NNODES and $PET_MASTER_ADDR), or in an Indexed "
                "Job with a headless service and --nodes")


SERVICE_ACCOUNT_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


def kube_plan(args: argparse.Namespace, cfg: dict[str, Any], name: str):
    """List the job's pods until all of them have an IP (or the wait is over)."""
    from nodehealth.kube.api import ClientApi, KubeError  # the kubernetes client, only here
    from nodehealth.kube.defaults import DEFAULTS as KUBE_DEFAULTS

    env = os.environ
    count = args.nodes
    if count is None:
        text = env.get("PET_NNODES", "").partition(":")[2] or env.get("PET_NNODES") or env.get("WORLD_SIZE", "")
        count = int(text) if text.isdigit() else None
    if count is None:
        raise Usage("--kube-selector needs the job's size: --nodes N (or $PET_NNODES / $WORLD_SIZE)")
    namespace = args.namespace or env.get("POD_NAMESPACE")
    if not namespace:
        try:
            with open(SERVICE_ACCOUNT_NAMESPACE, encoding="utf-8") as f:
                namespace = f.read(256).strip()
        except OSError:
            namespace = "default"
    try:
        api = ClientApi(args.kubeconfig or "", KUBE_DEFAULTS["request_timeout_seconds"])
        deadline = time.monotonic() + cfg["wait_seconds"]
        while True:
            pods = api.list_pods(namespace, args.kube_selector)
            plan = discovery.from_pods(pods, name, count, cfg["kube_index_label"])
            if plan is not None:
                return plan
            if time.monotonic() > deadline:
                ready = sum(1 for p in pods if (p.get("status") or {}).get("podIP"))
                raise Usage(f"only {ready} of the job's {count} pods ({args.kube_selector} in {namespace}) had an IP "
                            f"within {cfg['wait_seconds']:g} s")
            time.sleep(cfg["kube_poll_seconds"])
    except KubeError as e:
        raise Usage(f"cannot list the job's pods: {e}") from None
