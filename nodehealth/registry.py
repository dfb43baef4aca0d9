"""The one explicit list of collectors and checks. Read it to see everything nodehealth does.

Collectors and checks follow the contracts in nodehealth/collectors/__init__.py and
nodehealth/checks/__init__.py. Two checks judge what the daemon alone gathers, outside the polled
collectors: rdma_bw (its bandwidth tests) and pingmesh (the controller's verdicts).
"""
from __future__ import annotations

from nodehealth.checks import (
    clocks,
    crashes,
    gpu_driver,
    gpu_memory,
    gpu_nic,
    gpu_pcie,
    kernel,
    link_events,
    memlock,
    memory,
    memory_errors,
    nic_health,
    nvlink,
    nvlink_errors,
    pingmesh,
    rdma_bw,
    storage_errors,
    thp,
    xid,
)
from nodehealth.checks import edac as edac_check
from nodehealth.checks import infiniband as infiniband_check
from nodehealth.checks import modules as modules_check
from nodehealth.checks import mounts as mounts_check
from nodehealth.checks import pcie as pcie_check
from nodehealth.collectors import buddyinfo, edac, infiniband, kmsg, limits, modules, mounts, nvml, pcie, topology, vm

COLLECTORS = (
    kmsg,
    buddyinfo,
    vm,
    limits,
    modules,
    mounts,
    pcie,
    topology,
    infiniband,
    edac,
    nvml,
)

CHECKS = (
    xid,
    kernel,
    link_events,
    crashes,
    memory_errors,
    edac_check,
    storage_errors,
    nic_health,
    memory,
    thp,
    memlock,
    modules_check,
    mounts_check,
    pcie_check,
    infiniband_check,
    gpu_driver,
    gpu_memory,
    nvlink,
    nvlink_errors,
    gpu_pcie,
    clocks,
    gpu_nic,
    rdma_bw,
    pingmesh,
)
