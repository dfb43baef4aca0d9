"""Who is in the job, and which node coordinates: from a host list, Slurm, torchrun or Kubernetes.

`nodehealth netcheck job` runs on every node of a job before it starts. Each node needs the same
answer to two questions without talking to the others first: how many nodes (and, where known,
which) make up the job, and which one coordinates. Then every node joins the coordinator, which
tests the nodes that joined and names the ones that did not.

- a host list (--hosts, --hosts-file, $NODEHEALTH_NETCHECK_HOSTS): those nodes; the first coordinates;
- Slurm: $SLURM_JOB_NODELIST (Slurm's compressed form, `node[01-04,07]`) and $SLURM_NODEID; the
  first node of the list is node 0 and coordinates (run as `srun --ntasks-per-node=1`);
- torchrun's environment: torchrun reads its options from $PET_NNODES, $PET_NODE_RANK,
  $PET_MASTER_ADDR or $PET_RDZV_ENDPOINT (the training operator and JobSet set these), and gives its
  workers $WORLD_SIZE, $LOCAL_WORLD_SIZE, $GROUP_RANK and $MASTER_ADDR: the count and the master's
  address, not a host list, so the other nodes announce themselves when they join;
- Kubernetes: the job's pods by label selector, through the API (nodehealth/kube/api.py); pod index 0
  coordinates. Pods have their IP during init containers, so this works as an init container.
  Without API access, an Indexed Job with a headless service (`subdomain`) names its pods
  `JOB-INDEX.SUBDOMAIN...`: $JOB_COMPLETION_INDEX, the hostname and the job's size give them all.

Pure parsing here: the API, the names and the routes are read by the caller (nodehealth/netcheck/preflight.py).
"""
from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

MAX_HOSTS = 100_000  # a job is never larger; a nodelist that expands further is a typo or an attack
_BRACKET = re.compile(r"\[([^\[\]]*)\]")


class DiscoveryError(Exception):
    """The job's nodes cannot be found from what was given: one line, exit 2."""


@dataclass
class Plan:
    """What every node of the job agrees on before any of them talks to another."""

    source: str  # hosts, slurm, torchrun, kubernetes
    coordinator: str  # host (name or address) of the node that coordinates
    is_coordinator: bool
    count: int  # nodes in the job
    min_count: int = 0  # an elastic job may start with fewer (torchrun --nnodes MIN:MAX); 0: count
    hosts: list[str] = field(default_factory=list)  # the nodes' hosts where known, the coordinator's first
    addresses: dict[str, str] = field(default_factory=dict)  # host -> address where the source tells it

    def __post_init__(self) -> None:
        if self.count < 2:
            raise DiscoveryError(f"the job has {self.count} node(s) from {self.source}: netcheck needs at least two")
        self.min_count = self.min_count or self.count


# -- Slurm -------------------------------------------------------------------------------------

def expand_hostlist(text: str) -> list[str]:
    """Slurm's compressed host list: `node[01-04,07],gpu[1-2]` -> node01 ... node07, gpu1, gpu2.
    Ranges keep their zero padding; several brackets in one name multiply, as in Slurm."""
    hosts: list[str] = []
    for part in _split_top(text.strip()):
        part = part.strip()
        if not part:
            continue
        pieces = _BRACKET.split(part)  # literal, ranges, literal, ranges, ..., literal
        if "[" in pieces[-1] or "]" in pieces[-1] or any("[" in p or "]" in p for p in pieces[::2]):
            raise DiscoveryError(f"unbalanced brackets in the host list: {part!r}")
        names = [pieces[0]]
        for ranges, literal in zip(pieces[1::2], pieces[2::2]):
            numbers = _expand_ranges(ranges, part)
            if len(names) * len(numbers) + len(hosts) > MAX_HOSTS:
                raise DiscoveryError(f"the host list expands to more than {MAX_HOSTS} hosts")
            names = [n + x + literal for n in names for x in numbers]
        hosts += names
    return hosts


def _split_top(text: str) -> list[str]:
    """Split on commas outside brackets."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return parts


def _expand_ranges(ranges: str, where: str) -> list[str]:
    out: list[str] = []
    for r in ranges.split(","):
        lo, sep, hi = r.strip().partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise DiscoveryError(f"not a numeric range in the host list: [{ranges}] in {where!r}")
        if not sep:
            out.append(lo)
            continue
        a, b = int(lo), int(hi)
        if b < a or b - a >= MAX_HOSTS:
            raise DiscoveryError(f"a bad range in the host list: {r!r} in {where!r}")
        width = len(lo) if lo.startswith("0") else 0
        out += [str(n).zfill(width) for n in range(a, b + 1)]
    return out


def from_slurm(env: Mapping[str, str]) -> Plan:
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    if not nodelist:
        raise DiscoveryError("no $SLURM_JOB_NODELIST: not inside a Slurm job")
    hosts = expand_hostlist(nodelist)
    node_id = env.get("SLURM_NODEID")
    if node_id is None or not node_id.isdigit():
        raise DiscoveryError("no $SLURM_NODEID: run it as a step (srun --ntasks-per-node=1), once per node")
    if int(node_id) >= len(hosts):
        raise DiscoveryError(f"$SLURM_NODEID {node_id} is beyond the {len(hosts)} nodes of $SLURM_JOB_NODELIST")
    return Plan("slurm", hosts[0], int(node_id) == 0, len(hosts), hosts=hosts)


# -- a host list -------------------------------------------------------------------------------

def read_hostfile(path: str) -> list[str]:
    """One host (or HOST:PORT) a line; `#` comments; an MPI hostfile's `slots=` part is dropped."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read(1 << 20)
    except OSError as e:
        raise DiscoveryError(f"cannot read {path}: {e.strerror or e}") from None
    return [line.split("#", 1)[0].split()[0] for line in text.splitlines() if line.split("#", 1)[0].strip()]


def from_hosts(hosts: Sequence[str], is_local: Callable[[str], bool]) -> Plan:
    """The first host coordinates; this node is it when that host is one of its names or addresses."""
    hosts = list(dict.fromkeys(h.strip() for h in hosts if h.strip()))
    if not hosts:
        raise DiscoveryError("the host list is empty")
    return Plan("hosts", hosts[0], is_local(host_of(hosts[0])), len(hosts), hosts=hosts)


def host_of(entry: str) -> str:
    """HOST of HOST or HOST:PORT ([v6]:PORT too)."""
    if entry.startswith("["):
        return entry[1:].split("]", 1)[0]
    if entry.count(":") == 1:
        return entry.split(":", 1)[0]
    return entry


# -- torchrun ----------------------------------------------------------------------------------

def from_torchrun(env: Mapping[str, str], is_local: Callable[[str], bool]) -> Plan:
    """From torchrun's options as environment (PET_*, before torchrun starts) or from what it gives a
    worker (a pre-step launched by torchrun itself, with --nproc-per-node=1)."""
    nnodes = env.get("PET_NNODES") or env.get("NNODES")
    rank = _first(env, "PET_NODE_RANK", "NODE_RANK", "GROUP_RANK")
    master = env.get("PET_MASTER_ADDR") or env.get("MASTER_ADDR")
    endpoint = env.get("PET_RDZV_ENDPOINT")
    if endpoint and not env.get("PET_MASTER_ADDR"):
        master = host_of(endpoint)  # c10d rendezvous: its host is where torchrun's store runs
    if not master:
        raise DiscoveryError("no $MASTER_ADDR, $PET_MASTER_ADDR or $PET_RDZV_ENDPOINT: not a torchrun job")
    lo = hi = None
    if nnodes:
        lo_text, _, hi_text = nnodes.partition(":")
        if not lo_text.isdigit() or (hi_text and not hi_text.isdigit()):
            raise DiscoveryError(f"$PET_NNODES is not N or MIN:MAX: {nnodes!r}")
        lo, hi = int(lo_text), int(hi_text or lo_text)
    elif env.get("WORLD_SIZE", "").isdigit():  # a worker: processes / processes per node
        per_node = env.get("LOCAL_WORLD_SIZE") or env.get("PET_NPROC_PER_NODE") or "1"
        if not per_node.isdigit() or int(per_node) < 1 or int(env["WORLD_SIZE"]) % int(per_node):
            raise DiscoveryError(f"$WORLD_SIZE {env['WORLD_SIZE']} is not a multiple of $LOCAL_WORLD_SIZE {per_node}")
        lo = hi = int(env["WORLD_SIZE"]) // int(per_node)
        rank = rank if rank is not None else env.get("RANK") if per_node == "1" else None
    if hi is None:
        raise DiscoveryError("no $PET_NNODES or $WORLD_SIZE: how many nodes the job has is unknown")
    if rank is not None and not rank.isdigit():
        raise DiscoveryError(f"the node rank is not a number: {rank!r}")
    is_coordinator = int(rank) == 0 if rank is not None else is_local(master)
    return Plan("torchrun", master, is_coordinator, hi, lo)


def _first(env: Mapping[str, str], *names: str) -> str | None:
    return next((env[n] for n in names if env.get(n)), None)


# -- Kubernetes --------------------------------------------------------------------------------

def from_indexed_job(index: str, hostname: str, fqdn: str, count: int) -> Plan:
    """An Indexed Job's pods as its headless service names them: pod `JOB-I` is `JOB-I.SUBDOMAIN...`
    (its FQDN's tail); the service must publish not-ready addresses, since init containers run
    before a pod is ready."""
    if not index.isdigit() or int(index) >= count:
        raise DiscoveryError(f"$JOB_COMPLETION_INDEX {index!r} is not an index below the job's {count} pods")
    short = hostname.split(".")[0]
    if not short.endswith(f"-{index}"):
        raise DiscoveryError(f"the hostname {short!r} is not an Indexed Job pod's (JOB-{index})")
    job = short[: -len(f"-{index}")]
    domain = fqdn[len(short):] if fqdn.startswith(short + ".") else ""
    if not domain:
        raise DiscoveryError(f"no subdomain in the FQDN {fqdn!r}: give the Job a headless service and set its "
                             "pods' subdomain, or use --kube-selector")
    hosts = [f"{job}-{i}{domain}" for i in range(count)]
    return Plan("indexed-job", hosts[0], index == "0", count, hosts=hosts)


# -- Kubernetes (the API) --------------------------------------------------------------------------------

def from_pods(pods: Sequence[dict], me: str, count: int, index_label: str) -> Plan | None:
    """The plan once the job's pods are there: None while fewer than `count` live pods have an IP
    (the caller lists again). Index 0 coordinates, else the first pod by name."""
    live = []
    for pod in pods:
        meta, status = pod.get("metadata") or {}, pod.get("status") or {}
        if meta.get("deletionTimestamp") or status.get("phase") in ("Succeeded", "Failed"):
            continue
        if not status.get("podIP") or not meta.get("name"):
            continue
        labels = {**(meta.get("annotations") or {}), **(meta.get("labels") or {})}
        index = labels.get(index_label, "")
        live.append((int(index) if index.isdigit() else None, meta["name"], status["podIP"]))
    if len(live) > count:
        raise DiscoveryError(f"{len(live)} live pods match, more than the job's {count}: narrow the selector")
    if len(live) < count:
        return None
    live.sort(key=lambda p: (p[0] is None, p[0] if p[0] is not None else 0, p[1]))
    names = [p[1] for p in live]
    if me not in names:
        raise DiscoveryError(f"this pod ({me}) is not among the pods the selector matches")
    return Plan("kubernetes", names[0], me == names[0], count, hosts=names, addresses={p[1]: p[2] for p in live})
