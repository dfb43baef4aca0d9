"""Locked-memory limits too small for RDMA: memory registration fails with ENOMEM.

ibv_reg_mr pins pages, and pinned pages count against RLIMIT_MEMLOCK unless the process holds
CAP_IPC_LOCK; over the limit the registration fails with ENOMEM (perftest: "Couldn't allocate MR
with error=12", NCCL: an IB transport error at init). This is node or container configuration,
not a network fault.
"""
from __future__ import annotations

from nodehealth.model import Action, Finding, Observed, Reason, Severity

NAME = "memlock"
NEEDS = ("limits",)
SUBSYSTEM = "memory"
DEBOUNCE = False
DEFAULTS: dict = {
    # Below this a limit is too small for RDMA (the AWS GPU health-check suite warns under 16 GiB).
    "min_bytes": 16 << 30,
    # On an RDMA node, say so (info) when our own limit is large but still not unlimited.
    "expect_unlimited_on_rdma": True,
}

MEANINGS = {  # what each key means, in docs/configuration.md
    "min_bytes": "a locked-memory limit below this is too small for RDMA (16 GiB)",
    "expect_unlimited_on_rdma": "on an RDMA node, say so (info) when nodehealth's own limit is large but not unlimited",
}
SOURCE = "`/proc/self/limits`, `/proc/PID/{fd,limits,status}`"
FINDS = ("`ulimit -l` under 16 GiB on RDMA nodes, for nodehealth itself and for every process that holds "
         "`/dev/infiniband/uverbs*` open without CAP_IPC_LOCK; silent on a node without a verbs device")
REASONS = {
    "MemlockLimitLow": Reason(Severity.WARNING, Action.FIX_CONFIG,
                              "nodehealth runs with a locked-memory limit under `min_bytes` (16 GiB) on an RDMA "
                              "node, and processes started the same way inherit it: RDMA memory registration fails "
                              "with ENOMEM. Raise it to unlimited"),
    "MemlockLimitFinite": Reason(Severity.INFO, Action.FIX_CONFIG,
                                 "the limit is large but not unlimited on an RDMA node (`expect_unlimited_on_rdma`)"),
    "RdmaProcessMemlockLow": Reason(Severity.WARNING, Action.FIX_CONFIG,
                                    "a process that holds a verbs device open has a limit under `min_bytes` and no "
                                    "CAP_IPC_LOCK (the device is the process name)"),
}

SELF_DEVICE = "nodehealth"
MAX_PIDS_SHOWN = 8
BREAKS = ("RDMA memory registration (ibv_reg_mr, NCCL over InfiniBand/RoCE) fails with ENOMEM "
          "(\"Couldn't allocate MR with error=12\") once more than that is pinned")
FIXES = ("raise it to unlimited (--ulimit memlock=-1, LimitMEMLOCK=infinity in the systemd or containerd "
         "unit, /etc/security/limits.conf) or grant a root process CAP_IPC_LOCK (Kubernetes capabilities.add: "
         "[IPC_LOCK]; non-root processes get no effective capabilities, so only the limit helps them)")

_UNITS = ((1 << 40, "TiB"), (1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB"))


def human_bytes(n: int) -> str:
    for size, unit in _UNITS:
        if n >= size:
            return f"{n / size:.4g} {unit}"
    return f"{n} bytes"


def _limit_words(soft: int) -> str:
    """The limit in human units and as `ulimit -l` shows it (KiB), so nobody mixes the two up."""
    return f"{human_bytes(soft)} (ulimit -l {soft // 1024})"


def _devices(count: int) -> str:
    return "1 RDMA device" if count == 1 else f"{count} RDMA devices"


def judge(obs: Observed, cfg: dict) -> list[Finding]:
    facts = obs.facts["limits"]
    # Without a verbs device nothing registers memory for RDMA, and a finding would fire on every
    # host with a distribution's default limit (64 KiB or 8 MiB) while nothing is broken; other
    # mlock(2) users report their own EPERM/ENOMEM. So on such a node this check says nothing.
    if not facts.rdma_devices:
        return []
    findings = _own_limit(facts, cfg)
    findings.extend(_rdma_processes(facts, cfg))
    return findings


def _own_limit(facts, cfg: dict) -> list[Finding]:
    """Our limit stands for the runtime's default (container runtime, systemd unit) that processes
    started the same way inherit; our own capabilities do not change that, so they are evidence only."""
    limit = facts.self_memlock
    if limit.soft_unlimited:
        return []
    devices = len(facts.rdma_devices)
    evidence = {"soft_bytes": limit.soft, "hard_bytes": limit.hard, "cap_ipc_lock": facts.self_cap_ipc_lock,
                "rdma_devices": devices}
    if limit.soft < cfg["min_bytes"]:
        return [Finding(
            NAME, Severity.WARNING, "MemlockLimitLow",
            f"nodehealth runs with a locked-memory limit of {_limit_words(limit.soft)}, under "
            f"{human_bytes(cfg['min_bytes'])}, on a node with {_devices(devices)}, and processes started the "
            f"same way inherit it: {BREAKS}; {FIXES}.",
            device=SELF_DEVICE, action=Action.FIX_CONFIG, evidence=evidence)]
    if not cfg["expect_unlimited_on_rdma"]:
        return []
    return [Finding(
        NAME, Severity.INFO, "MemlockLimitFinite",
        f"nodehealth runs with a locked-memory limit of {_limit_words(limit.soft)} rather than unlimited on a "
        f"node with {_devices(devices)}: {BREAKS}; set it to unlimited (--ulimit memlock=-1, "
        f"LimitMEMLOCK=infinity) unless the limit is deliberate.",
        device=SELF_DEVICE, action=Action.FIX_CONFIG, evidence=evidence)]


def _rdma_processes(facts, cfg: dict) -> list[Finding]:
    """One finding per command name, so eight ranks of one job are one finding, not eight."""
    by_comm: dict = {}
    for p in facts.rdma_processes:
        # With CAP_IPC_LOCK pinning is not charged to the limit; an unreadable limit is not judged.
        if p.memlock is None or p.cap_ipc_lock or p.memlock.soft_bytes_or_inf >= cfg["min_bytes"]:
            continue
        by_comm.setdefault(p.comm, []).append(p)
    return [_process_finding(comm, procs) for comm, procs in sorted(by_comm.items())]


def _process_finding(comm: str, procs: list) -> Finding:
    smallest = min(p.memlock.soft for p in procs)
    pids = [p.pid for p in procs]
    shown = ", ".join(str(pid) for pid in pids[:MAX_PIDS_SHOWN])
    if len(pids) > MAX_PIDS_SHOWN:
        shown += f" and {len(pids) - MAX_PIDS_SHOWN} more"
    who = f"process {comm} (pid {shown})" if len(pids) == 1 else f"{len(pids)} {comm} processes (pids {shown})"
    return Finding(
        NAME, Severity.WARNING, "RdmaProcessMemlockLow",
        f"RDMA {who} run{'s' if len(pids) == 1 else ''} with a locked-memory limit of {_limit_words(smallest)} "
        f"and without CAP_IPC_LOCK: {BREAKS}; {FIXES}.",
        device=comm, action=Action.FIX_CONFIG,
        evidence={"pids": pids[:32], "soft_bytes": smallest,
                  "devices": sorted({d for p in procs for d in p.devices})})
