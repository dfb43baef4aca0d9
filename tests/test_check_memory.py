"""The memory (fragmentation) check: table-driven, no files."""
from __future__ import annotations

import os

import pytest

from nodehealth.checks import memory
from nodehealth.collectors.buddyinfo import Buddyinfo, Zone
from nodehealth.engine import run_check
from nodehealth.model import Action, CollectorResult, Observed, Severity

MIB = 1 << 20
FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")

# Real rows (host-memory.md and tests/fixtures/memory): free blocks per order 0..10.
RHCOS_NORMAL = (356, 154, 571, 302, 143, 14, 7, 4, 3, 2, 0)  # 42.4 MiB free, index 0.906
NODE_EXPORTER_NORMAL = (4381, 1093, 185, 1530, 567, 102, 4, 0, 0, 0, 0)  # 125.5 MiB free, none >= 2 MiB
DEV_VM_NORMAL = (2299, 1561, 795, 401, 171, 67, 30, 21, 16, 4, 11)  # 151 MiB free, 26 free 2 MiB blocks
RHCOS_DMA32 = (170, 66, 58, 60, 26, 17, 10, 12, 7, 7, 111)


def orders(**counts: int) -> tuple:
    """Free blocks per order 0..10 from keywords like o0=5, o10=2."""
    return tuple(counts.get(f"o{k}", 0) for k in range(11))


def judge(*zones: Zone, **cfg):
    return memory.judge(Observed({"buddyinfo": Buddyinfo(4096, zones, None)}), {**memory.DEFAULTS, **cfg})


def normal(blocks: tuple, node: int = 0) -> Zone:
    return Zone(node, "Normal", blocks, 4096)


CASES = [
    # name, free blocks per order, expected (reason, severity) or None
    ("development VM: healthy", DEV_VM_NORMAL, None),
    ("all free memory in 4 MiB blocks", orders(o10=5000), None),
    ("node_exporter: 125 MiB free, none in 2 MiB blocks", NODE_EXPORTER_NORMAL,
     ("HugeBlocksExhausted", Severity.DEGRADED)),
    ("RHCOS: 42 MiB free is memory pressure", RHCOS_NORMAL, ("ZoneLowOnMemory", Severity.WARNING)),
    ("nothing free at all", orders(), ("ZoneLowOnMemory", Severity.WARNING)),
    # 781 MiB in 4 KiB pages, 10 free 2 MiB blocks: index 0.975 > 0.9, GCM column ok
    ("index over 0.9 with some 2 MiB blocks left", orders(o0=200000, o9=10), ("MemoryFragmented", Severity.WARNING)),
    # index 0.19 but no order >= 8 column reaches 10 blocks: GCM's rule alone
    ("GCM rule alone", orders(o0=1000, o8=9, o9=9, o10=9), ("MemoryFragmented", Severity.WARNING)),
    ("GCM rule satisfied by an order-8 column", orders(o0=1000, o8=10, o9=9, o10=9), None),
    # boundaries of the index: 92160 pages + 10 blocks of 1024 pages -> exactly 0.900
    ("index exactly at 0.9 is not over it", orders(o0=92160, o10=10), None),
    ("index just over 0.9", orders(o0=92161, o10=10), ("MemoryFragmented", Severity.WARNING)),
    # boundaries of low free memory: 64 MiB = 16384 pages
    ("exactly 64 MiB free is not low", orders(o0=16384 - 512 * 7, o9=7), ("HugeBlocksExhausted", Severity.DEGRADED)),
    ("one page under 64 MiB is low", orders(o0=16383 - 512 * 7, o9=7), ("ZoneLowOnMemory", Severity.WARNING)),
    # boundaries of the handful of 2 MiB blocks (index stays over 0.9)
    ("8 free 2 MiB blocks is a warning", orders(o0=100000, o9=8), ("MemoryFragmented", Severity.WARNING)),
    ("7 free 2 MiB blocks is degraded", orders(o0=100000, o9=7), ("HugeBlocksExhausted", Severity.DEGRADED)),
    ("4 MiB blocks count twice", orders(o0=100000, o10=4), ("MemoryFragmented", Severity.WARNING)),
    ("gigabytes free, nothing in 2 MiB blocks", orders(o0=1 << 20, o8=100), ("HugeBlocksExhausted", Severity.DEGRADED)),
]


@pytest.mark.parametrize("name, blocks, expected", CASES, ids=[c[0] for c in CASES])
def test_normal_zone(name, blocks, expected):
    findings = judge(normal(blocks))
    assert [(f.reason, f.severity) for f in findings] == ([expected] if expected else [])
    for f in findings:
        assert f.check == "memory"
        assert f.device == "Normal zone of node 0"


def test_rhcos_gcm_and_index():
    """host-memory.md: RHCOS Normal fails GCM's rule (orders 8-10: 3, 2, 0) and has index 0.906."""
    zone = normal(RHCOS_NORMAL)
    assert memory.largest_column(zone, MIB) == 3
    assert round(zone.hugepage_unusable_index, 3) == 0.906
    # Judged as fragmentation once the zone is not considered short of memory:
    [finding] = judge(zone, low_free_bytes=32 * MIB)
    assert (finding.reason, finding.severity) == ("HugeBlocksExhausted", Severity.DEGRADED)
    assert finding.evidence["unusable_index"] == 0.906
    assert finding.evidence["free_2mib_blocks"] == 2


def test_only_normal_zones_are_judged():
    fragmented_dma32 = Zone(0, "DMA32", NODE_EXPORTER_NORMAL, 4096)
    assert judge(fragmented_dma32, Zone(0, "DMA", orders(), 4096)) == []


def test_no_normal_zone_gives_no_finding():
    assert judge(Zone(0, "DMA", orders(o10=3), 4096), Zone(0, "DMA32", RHCOS_DMA32, 4096)) == []


def test_every_node_is_judged_on_its_own():
    findings = judge(normal(DEV_VM_NORMAL, node=0), normal(NODE_EXPORTER_NORMAL, node=1),
                     normal(RHCOS_NORMAL, node=2))
    assert [(f.device, f.reason) for f in findings] == [
        ("Normal zone of node 1", "HugeBlocksExhausted"), ("Normal zone of node 2", "ZoneLowOnMemory")]


def test_degraded_message_and_action():
    [f] = judge(normal(NODE_EXPORTER_NORMAL))
    assert f.message.startswith("The Normal zone of node 0 has 125.5 MiB free, 0.0 MiB of it in blocks of 2 MiB or "
                                "more (0 blocks, unusable index 1.000)")
    assert "echo 1 > /proc/sys/vm/compact_memory" in f.message
    assert "drop_caches" in f.message and "hugepages=" in f.message and "reboot" in f.message
    assert f.action is Action.REBOOT
    assert f.evidence == {"free_bytes": 32139 * 4096, "free_hugepage_bytes": 0, "free_2mib_blocks": 0,
                          "unusable_index": 1.0, "most_free_blocks_of_large_size": 0}


def test_low_memory_message_says_it_is_pressure():
    [f] = judge(normal(RHCOS_NORMAL))
    assert "42.4 MiB free, 4.0 MiB of it in blocks of 2 MiB or more" in f.message
    assert "short of memory rather than fragmented" in f.message
    assert "compact_memory" not in f.message
    assert f.action is Action.NONE


def test_warning_message_names_the_gcm_column():
    [f] = judge(normal(orders(o0=1000, o8=9, o9=9, o10=9)))
    assert "at most 9 free blocks of any size of 1.0 MiB or more" in f.message
    assert f.message.endswith(".") and f.message.count(". ") == 0


def test_sizes_in_gib():
    [f] = judge(normal(orders(o0=1 << 20, o8=100)))
    assert "4.1 GiB free" in f.message


@pytest.mark.parametrize("cfg, expected", [
    ({"unusable_index": 0.5}, ["MemoryFragmented"]),  # development VM's 0.656 now counts
    ({"large_block_min_free": 17}, ["MemoryFragmented"]),  # its best column (order 8) has 16
    ({"large_block_bytes": 4 * MIB, "large_block_min_free": 12}, ["MemoryFragmented"]),  # order 10 has 11
    ({"unusable_index": 0.5, "min_free_2mib_blocks": 27}, ["HugeBlocksExhausted"]),  # it has 26
    ({"unusable_index": 0.5, "low_free_bytes": 200 * MIB}, ["ZoneLowOnMemory"]),
    ({}, []),
])
def test_thresholds_come_from_config(cfg, expected):
    assert [f.reason for f in judge(normal(DEV_VM_NORMAL), **cfg)] == expected


def test_defaults_are_the_documented_ones():
    assert memory.DEFAULTS == {"unusable_index": 0.9, "large_block_bytes": MIB, "large_block_min_free": 10,
                               "low_free_bytes": 64 * MIB, "min_free_2mib_blocks": 8, "low_available_ratio": 0.1,
                               "drop_caches_min_ratio": 0.1, "unsettled_free_ratio": 0.5}
    assert memory.NEEDS == ("buddyinfo",) and memory.DEBOUNCE is True


def test_larger_pages_use_the_same_sizes():
    # 64 KiB pages: 2 MiB is order 5, 1 MiB order 4. 100 MiB free in 64 KiB pages, 3 blocks of 2 MiB.
    zone = Zone(0, "Normal", (1600 - 96, 0, 0, 0, 0, 3), 65536)
    [f] = judge(zone)
    assert (f.reason, f.evidence["free_2mib_blocks"]) == ("HugeBlocksExhausted", 3)


# --- absent data, through the engine --------------------------------------------------------------

def test_failed_collector_makes_the_check_unknown():
    results = {"buddyinfo": CollectorResult("buddyinfo", supported=True, success=False, error="bad line")}
    [f] = run_check(memory, results, Observed({}), dict(memory.DEFAULTS))
    assert (f.severity, f.reason) == (Severity.UNKNOWN, "CollectorFailed")


def test_unsupported_collector_skips_the_check():
    results = {"buddyinfo": CollectorResult("buddyinfo", supported=False, success=False, error="no file")}
    assert run_check(memory, results, Observed({}), dict(memory.DEFAULTS)) == []


def test_judged_through_the_engine():
    facts = Buddyinfo(4096, (normal(NODE_EXPORTER_NORMAL),), None)
    results = {"buddyinfo": CollectorResult("buddyinfo", True, True, facts=facts)}
    [f] = run_check(memory, results, Observed({"buddyinfo": facts}), dict(memory.DEFAULTS))
    assert f.severity is Severity.DEGRADED


GIB = 1 << 30


def meminfo(total=64, free=None, available=None, cached=1, shmem=0):
    """/proc/meminfo in bytes, sizes in GiB."""
    return {"MemTotal": total * GIB, "MemFree": int((free if free is not None else 0.1) * GIB),
            "MemAvailable": int((available if available is not None else 1) * GIB), "Cached": int(cached * GIB),
            "Buffers": 0, "SReclaimable": 0, "Shmem": int(shmem * GIB)}


def judge_with(zone, info, rates=None, **cfg):
    facts = Buddyinfo(4096, (zone,), None, info)
    return memory.judge(Observed({"buddyinfo": facts}, {"buddyinfo": rates or {}}), {**memory.DEFAULTS, **cfg})


def test_a_zone_low_on_free_memory_is_no_shortage_while_memavailable_is_large():
    rhcos = normal(RHCOS_NORMAL)  # 42 MiB free in the zone
    free = rhcos.free_bytes / GIB
    assert judge_with(rhcos, meminfo(free=free, available=40, cached=38)) == []
    (f,) = judge_with(rhcos, meminfo(free=free, available=2, cached=1.5))
    assert f.reason == "ZoneLowOnMemory" and "drop_caches" not in f.message  # caches are not the cause
    (f,) = judge_with(rhcos, meminfo(free=free, available=6, cached=7, shmem=0.5))
    assert "drop_caches" in f.message  # 6.5 GiB of reclaimable cache is a tenth of memory


def test_dropping_caches_is_advised_for_fragmentation_only_when_caches_are_the_cause():
    zone = normal(NODE_EXPORTER_NORMAL)
    free = zone.free_bytes / GIB
    (f,) = judge_with(zone, meminfo(free=free, cached=20))
    assert f.reason == "HugeBlocksExhausted" and "drop_caches" in f.message
    (f,) = judge_with(zone, meminfo(free=free, cached=20, shmem=19))  # shmem cannot be dropped
    assert "drop_caches" not in f.message and "compact_memory" in f.message


def test_a_zone_still_growing_is_not_judged():
    """A VM whose Normal zone is still being handed memory looks low and fragmented for a while."""
    vm = normal(DEV_VM_NORMAL)
    low = normal(orders(o0=1000))  # 4 MiB free: low and fragmented on its own
    assert [f.reason for f in judge_with(low, None)] == ["ZoneLowOnMemory"]
    assert judge_with(low, None, rates={"0:Normal:managed_pages": 2048.0}) == []  # managed pages grew
    # The development VM: MemFree 22 GiB while the free lists hold 3 GiB.
    assert judge_with(low, meminfo(total=24, free=22, available=1)) == []
    assert judge_with(vm, meminfo(total=24, free=22, available=23)) == []


def test_the_development_vm_is_judged_as_captured():
    from nodehealth.collectors import buddyinfo
    from nodehealth.host import HostPaths

    facts = buddyinfo.collect(HostPaths(os.path.join(FIXTURES, "machines", "plain-host")), {})
    assert facts.meminfo["MemFree"] > 5 * sum(z.free_bytes for z in facts.zones)
    assert memory.judge(Observed({"buddyinfo": facts}), dict(memory.DEFAULTS)) == []


def test_a_zone_under_its_high_watermark_is_low_even_above_the_fixed_floor():
    from nodehealth.collectors.buddyinfo import ZoneSize

    zone = normal(orders(o0=25600))  # 100 MiB free, all in 4 KiB pages: over the 64 MiB floor
    info = meminfo(free=zone.free_bytes / GIB, available=2, cached=1)
    high = ZoneSize(0, "Normal", 1 << 22, 1 << 22, high_pages=51200)  # 200 MiB high watermark
    facts = Buddyinfo(4096, (zone,), None, info, (high,))
    assert [f.reason for f in memory.judge(Observed({"buddyinfo": facts}), dict(memory.DEFAULTS))] == [
        "ZoneLowOnMemory"]
    assert [f.reason for f in judge_with(zone, info)] == ["HugeBlocksExhausted"]  # without zoneinfo
