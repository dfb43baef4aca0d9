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

Where /proc/meminfo and /proc/zoneinfo are readable they keep the zone's free lists honest:
- a zone that is still growing (its managed pages rose since the last pass: deferred struct page
  init, a VM adding or accepting memory), or a node whose MemFree is well above what the free
  lists hold (memory not yet handed to the zones), is not judged: its lists describe a moment;
- a zone under its high watermark is low on free memory even above `low_free_bytes`, and low free
  memory in a zone is a shortage only when MemAvailable is small too: with plenty available the
  kernel reclaims cache on demand;
- dropping caches is advised only when reclaimable page cache is a real share of memory.
"""
from __future__ import annotations

from nodehealth.collectors.buddyinfo import HUGE_BLOCK_BYTES, Buddyinfo, Zone, ZoneSize, managed_key
from nodehealth.model import Action, Finding, Observed, Reason, Severity

NAME = "memory"
NEEDS = ("buddyinfo",)
SUBSYSTEM = "memory"
DEBOUNCE = True

# GCM rates the Normal zone only; DMA and DMA32 cover just the lowest 4 GiB of physical memory.
JUDGED_ZONE = "Normal"

DEFAULTS = {
    # Unusable free space index at the 2 MiB order (kernel debugfs extfrag/unusable_index) above which
    # a zone is fragmented. 0.9: docs/sources.md, "Memory fragmentation"; the RHCOS worked example sits at 0.906.
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
    # A zone low on free memory is a shortage only while MemAvailable (free plus what the kernel can
    # reclaim) is under this share of MemTotal; above it the zone is a busy cache, reclaimed on
    # demand. nodehealth's choice: 10%, the usual "memory low" alert level (node_exporter mixins).
    "low_available_ratio": 0.1,
    # Advise dropping caches only when reclaimable page cache (Cached + Buffers + SReclaimable -
    # Shmem) is at least this share of MemTotal; dropping less rarely frees enough 2 MiB blocks.
    "drop_caches_min_ratio": 0.1,
    # MemFree above the sum of the free lists by more than this share means memory the zones have
    # not taken in yet (a VM adding or accepting memory): their lists do not describe the node.
    # Both count the same pages, so they differ only by what changed between the two reads (2% in a
    # real capture, 12% in the fragmented machine, whose files come from different captures); the
    # development VM that showed the problem has 7 times more in MemFree than in its lists.
    "unsettled_free_ratio": 0.5,
}

MEANINGS = {  # what each key means, in docs/configuration.md
    "unusable_index": "unusable free space index at 2 MiB above which a Normal zone is fragmented",
    "large_block_bytes": ("block size for the large-block test: fragmented when no order of at least this size has "
                          "`large_block_min_free` free blocks"),
    "large_block_min_free": "see `large_block_bytes`",
    "low_free_bytes": ("below this much free memory in a zone (or its high watermark) the problem is memory "
                       "pressure, not fragmentation"),
    "min_free_2mib_blocks": ("fewer free 2 MiB blocks than this (with enough free memory) is `HugeBlocksExhausted` "
                             "(degraded)"),
    "low_available_ratio": ("a zone low on free memory is a shortage only while MemAvailable is under this share of "
                            "MemTotal"),
    "drop_caches_min_ratio": ("the advice mentions dropping caches only when reclaimable page cache is at least "
                              "this share of MemTotal"),
    "unsettled_free_ratio": ("MemFree above the zones' free lists by more than this share means memory not yet "
                             "handed to the zones (a VM adding memory): the zones are not judged"),
}
SOURCE = "`/proc/buddyinfo`, `/proc/pagetypeinfo`, `/proc/meminfo`, `/proc/zoneinfo`"
FINDS = ("Normal zones too fragmented to supply 2 MiB blocks (huge pages, pinned buffers), and zones low on memory "
         "while MemAvailable is low too; a zone that is still being given memory (a VM's deferred or added memory) "
         "is not judged")
REASONS = {
    "HugeBlocksExhausted": Reason(Severity.DEGRADED, Action.REBOOT,
                                  "a Normal zone has fewer than `min_free_2mib_blocks` (8) free 2 MiB blocks: huge "
                                  "pages and large pinned or DMA buffers fall back, stall or fail. Compact memory, "
                                  "reserve huge pages at boot, or reboot"),
    "MemoryFragmented": Reason(Severity.WARNING, Action.NONE,
                               "a Normal zone's unusable index at 2 MiB is over `unusable_index` (0.9), or no "
                               "order of 1 MiB or more has 10 free blocks: huge-page allocations will stall in "
                               "compaction"),
    "ZoneLowOnMemory": Reason(Severity.WARNING, Action.NONE,
                              "a Normal zone has under `low_free_bytes` (64 MiB, or its high watermark) free while "
                              "MemAvailable is under `low_available_ratio` (10 %) of MemTotal: the node is short "
                              "of memory, not fragmented"),
}

COMPACT = "compact memory with 'echo 1 > /proc/sys/vm/compact_memory'"
DROP_CACHES = " (and 'echo 3 > /proc/sys/vm/drop_caches' to free page cache)"
RESERVE = ("reserve huge pages at boot (hugepages= on the kernel command line), or reboot the node if it stays "
           "fragmented")


def judge(obs: Observed, cfg: dict) -> list[Finding]:
    facts: Buddyinfo = obs.facts["buddyinfo"]
    if _unsettled(facts, cfg):
        return []
    findings = []
    for zone in facts.zones:
        if zone.name == JUDGED_ZONE and not obs.rate("buddyinfo", managed_key(zone.node, zone.name)):
            finding = judge_zone(zone, cfg, facts.meminfo, facts.size_of(zone))
            if finding is not None:
                findings.append(finding)
    return findings


def _unsettled(facts: Buddyinfo, cfg: dict) -> bool:
    """MemFree well above what the zones' free lists hold: memory not yet handed to the zones."""
    mem_free = (facts.meminfo or {}).get("MemFree")
    listed = sum(z.free_bytes for z in facts.zones)
    return mem_free is not None and mem_free > listed * (1 + cfg["unsettled_free_ratio"])


def _share(meminfo: dict[str, int] | None, amount: int | None) -> float | None:
    total = (meminfo or {}).get("MemTotal")
    return amount / total if amount is not None and total else None


def _caches_help(meminfo: dict[str, int] | None, cfg: dict) -> bool:
    """Whether dropping caches would free a real share of memory (unknown meminfo: assume it may)."""
    if meminfo is None:
        return True
    caches = sum(meminfo.get(k, 0) for k in ("Cached", "Buffers", "SReclaimable")) - meminfo.get("Shmem", 0)
    share = _share(meminfo, caches)
    return share is None or share >= cfg["drop_caches_min_ratio"]


def _advice(meminfo: dict[str, int] | None, cfg: dict) -> str:
    return f"{COMPACT}{DROP_CACHES if _caches_help(meminfo, cfg) else ''}, {RESERVE}"


def largest_column(zone: Zone, min_bytes: int) -> int:
    """The most free blocks any single order of at least `min_bytes` holds (GCM's columns)."""
    start = zone.order_for(min_bytes)
    return max(zone.free_blocks[start:], default=0)


def judge_zone(zone: Zone, cfg: dict, meminfo: dict[str, int] | None = None,
               size: ZoneSize | None = None) -> Finding | None:
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
    # Below the zone's high watermark kswapd is already reclaiming there: low, whatever the fixed floor.
    high = size.high_pages * zone.page_size if size is not None and size.high_pages is not None else 0
    if free < max(cfg["low_free_bytes"], high):
        available = _share(meminfo, (meminfo or {}).get("MemAvailable"))
        if available is not None and available >= cfg["low_available_ratio"]:
            return None  # little free here, but the node has plenty to reclaim: not a shortage
        drop = (" (or drop caches with 'echo 3 > /proc/sys/vm/drop_caches')" if _caches_help(meminfo, cfg)
                else " (processes, pinned or huge pages: page cache is not what holds it)")
        return Finding(
            NAME, Severity.WARNING, "ZoneLowOnMemory",
            f"The {device} has only {amounts}: the node is short of memory rather than fragmented, so compaction "
            f"cannot help; find what holds the memory{drop} "
            f"before huge-page and large pinned allocations start failing.",
            device=device, action=Action.NONE, evidence=evidence)
    if blocks < cfg["min_free_2mib_blocks"]:
        return Finding(
            NAME, Severity.DEGRADED, "HugeBlocksExhausted",
            f"The {device} has {amounts} ({blocks} blocks, unusable index {index:.3f}): memory is so fragmented "
            f"that huge pages and large pinned or DMA buffers fall back, stall in compaction or fail; "
            f"{_advice(meminfo, cfg)}.",
            device=device, action=Action.REBOOT, evidence=evidence)
    return Finding(
        NAME, Severity.WARNING, "MemoryFragmented",
        f"The {device} has {amounts} (unusable index {index:.3f}, at most {column} free blocks of any size "
        f"of {_size(cfg['large_block_bytes'])} or more): huge-page and large pinned allocations will stall in "
        f"compaction; {_advice(meminfo, cfg)}.",
        device=device, action=Action.NONE, evidence=evidence)


def _size(n: int) -> str:
    if n >= 1 << 30:
        return f"{n / (1 << 30):.1f} GiB"
    return f"{n / (1 << 20):.1f} MiB"
