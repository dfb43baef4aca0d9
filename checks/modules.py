"""GPUDirect RDMA readiness from the loaded kernel modules."""
from __future__ import annotations

from nodehealth.model import Action, Finding, Observed, Reason, Severity

NAME = "modules"
NEEDS = ("modules",)
SUBSYSTEM = "kernel"
DEFAULTS: dict = {}
DEBOUNCE = False

SOURCE = "`/proc/modules`"
FINDS = "GPUDirect RDMA not ready: NVIDIA and RDMA drivers loaded, `nvidia_peermem` (or `nv_peer_mem`) not"
REASONS = {
    "GPUDirectRDMANotReady": Reason(Severity.WARNING, Action.FIX_CONFIG,
                                    "NVIDIA and RDMA drivers are loaded but `nvidia_peermem` is not: NCCL stages "
                                    "GPU data through host memory. `modprobe nvidia_peermem`"),
}

PEER_MEMORY_MODULES = ("nvidia_peermem", "nv_peer_mem")
RDMA_MODULES = ("ib_core", "mlx5_ib", "ib_uverbs")


def judge(obs: Observed, cfg: dict) -> list[Finding]:
    loaded = obs.facts["modules"].loaded
    if "nvidia" not in loaded or not any(m in loaded for m in RDMA_MODULES):
        return []
    if any(m in loaded for m in PEER_MEMORY_MODULES):
        return []
    return [Finding(
        NAME, Severity.WARNING, "GPUDirectRDMANotReady",
        "The NVIDIA driver and the RDMA stack are loaded but neither nvidia_peermem nor nv_peer_mem is: "
        "NCCL and other RDMA users fall back to staging GPU data through host memory; "
        "load it with 'modprobe nvidia_peermem'.",
        device="", action=Action.FIX_CONFIG,
        evidence={"rdma_modules": sorted(m for m in RDMA_MODULES if m in loaded)})]
