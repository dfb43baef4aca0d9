"""Memory fragmentation that starves huge-page and large pinned allocations, per Normal zone.

Only buddyinfo facts are needed, so a failing vm collector never blanks this verdict (THP
settings and compaction stalls are judged separately in checks/thp.py).

Per Normal zone of each node:
- fragmented: the unusable free space index at 2 MiB is above `unusable_index`, or (Meta GCM's
  rule) no block size of at least `large_block_bytes` has `large_block_min_free` free blocks;
- if the zone also has less than `low_free_bytes` free, the node is short of memory rather than
  fragmented: compaction has nothing to work with, so that is a warning with a different fix;
- otherwise, fewer than `min_free_2mib_blocks` free 2 MiB blocks is degraded (THP faults fall
  back, runtime hugetlb reservations and large pinned/DMA buffers fail or stall), and more is a
  warning (allocations still succeed, but through compaction).
"""
from __future__ import annotations

from nodehealth.collectors.buddyinfo import HUGE_BLOCK_BYTES, Zone
from nodehealth.model import Action, Finding, Observed, Severity

NAME = "memory"
NEEDS = ("buddyinfo",)
DEBOUNCE = True

# GCM rates the Normal zone only; DMA and DMA32 cover just the lowest 4 GiB of physical memory.
JUDGED_ZONE = "Normal"

DEFAULTS = {
    # Unusable free space index at the 2 MiB order (kernel debugfs extfrag/unusable_index) above which
    # a zone is fragmented. 0.9 is host-memory.md's proposal; the RHCOS worked example sits at 0.906.
    "unusable_index": 0.9,
    # Meta GCM (check_processor.py, process_buddy_info): fragmented when no column of order >= 8
    # has >= 10 free blocks. Order 8 is 1 MiB at 4 KiB pages; stated in bytes so other page sizes agree.
    "large_block_bytes": 1 << 20,
    "large_block_min_free": 10,
    # Below this much free memory in the zone the story is memory pressure, not fragmentation: the
    # kernel skips compaction when free pages barely cover the watermarks. nodehealth's choice: 64 MiB,
    # the cap of the kernel's default min_free_kbytes on older kernels (256 MiB on newer ones; the
    # default is 4 * sqrt(low memory in KiB), about 180 MiB for a 2 TiB node, shared by its zones).
    "low_free_bytes": 64 << 20,
    # "A handful" of 2 MiB blocks: fewer free than this, with at least low_free_bytes free, is degraded.
    # nodehealth's choice: 8 blocks (16 MiB); a zone this short serves the next few huge-page faults only
    # through compaction.
    "min_free_2mib_blocks": 8,
}

ADVICE = ("compact memory with 'echo 1 > /proc/sys/vm/compact_memory' (and 'echo 3 > /proc/sys/vm/drop_caches' "
          "to free page cache), reserve huge pages at boot (hugepages= on the kernel command line), "
          "or reboot the node if it stays fragmented")


def judge(obs: Observed, cfg: dict) -> list[Finding]:
    findings = []
    for zone in obs.facts["buddyinfo"].zones:
        if zone.name == JUDGED_ZONE:
            finding = judge_zone(zone, cfg)
            if finding is not None:
                findings.append(finding)
    return findings


def largest_column(zone: Zone, min_bytes: int) -> int:
    """The most free blocks any single order of at least `min_bytes` holds (GCM's columns)."""
    start = zone.order_for(min_bytes)
    return max(zone.free_blocks[start:], default=0)


def judge_zone(zone: Zone, cfg: dict) -> Finding | None:
    index = zone.hugepage_unusable_index
    column = largest_column(zone, cfg["large_block_bytes"])
    if index <= cfg["unusable_index"] and column >= cfg["large_block_min_free"]:
        return None
    free = zone.free_bytes
    huge_free = zone.free_hugepage_bytes
    blocks = zone.blocks_available_of(HUGE_BLOCK_BYTES)
    device = f"{zone.name} zone of node {zone.node}"
    evidence = {
        "free_bytes": free,
        "free_hugepage_bytes": huge_free,
        "free_2mib_blocks": blocks,
        "unusable_index": round(index, 3),
        "most_free_blocks_of_large_size": column,
    }
    amounts = f"{_size(free)} free, {_size(huge_free)} of it in blocks of 2 MiB or more"
    if free < cfg["low_free_bytes"]:
        return Finding(
            NAME, Severity.WARNING, "ZoneLowOnMemory",
            f"The {device} has only {amounts}: the node is short of memory rather than fragmented, so compaction "
            f"cannot help; find what holds the memory (or drop caches with 'echo 3 > /proc/sys/vm/drop_caches') "
            f"before huge-page and large pinned allocations start failing.",
            device=device, action=Action.NONE, evidence=evidence)
    if blocks < cfg["min_free_2mib_blocks"]:
        return Finding(
            NAME, Severity.DEGRADED, "HugeBlocksExhausted",
            f"The {device} has {amounts} ({blocks} blocks, unusable index {index:.3f}): memory is so fragmented "
            f"that huge pages and large pinned or DMA buffers fall back, stall in compaction or fail; {ADVICE}.",
            device=device, action=Action.REBOOT, evidence=evidence)
    return Finding(
        NAME, Severity.WARNING, "MemoryFragmented",
        f"The {device} has {amounts} (unusable index {index:.3f}, at most {column} free blocks of any size "
        f"of {_size(cfg['large_block_bytes'])} or more): huge-page and large pinned allocations will stall in "
        f"compaction; {ADVICE}.",
        device=device, action=Action.NONE, evidence=evidence)


def _size(n: int) -> str:
    if n >= 1 << 30:
        return f"{n / (1 << 30):.1f} GiB"
    return f"{n / (1 << 20):.1f} MiB"
