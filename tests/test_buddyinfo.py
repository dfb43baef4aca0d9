"""The buddyinfo collector: /proc/buddyinfo and /proc/pagetypeinfo parsers, derived arithmetic, metrics."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nodehealth.checks import memory
from nodehealth.collectors import CollectError, buddyinfo
from nodehealth.host import HostPaths
from nodehealth.model import Observed, Severity

FIXTURES = Path(__file__).parent / "fixtures"
MEMORY = FIXTURES / "memory"
MIB = 1 << 20
TWO_MIB = 2 * MIB


def read(name: str) -> str:
    return (MEMORY / name).read_text()


def zones(name: str):
    return {(z.node, z.name): z for z in buddyinfo.parse_buddyinfo(read(name), 4096)}


# --- /proc/buddyinfo -------------------------------------------------------------------------------

def test_node_exporter_buddyinfo_counts_with_trailing_spaces():
    parsed = zones("node_exporter/proc_buddyinfo")
    assert list(parsed) == [(0, "DMA"), (0, "DMA32"), (0, "Normal")]
    assert parsed[0, "Normal"].free_blocks == (4381, 1093, 185, 1530, 567, 102, 4, 0, 0, 0, 0)
    assert parsed[0, "DMA"].free_blocks == (1, 0, 1, 0, 2, 1, 1, 0, 1, 1, 3)


def test_procfs_copy_without_trailing_spaces_parses_the_same():
    assert buddyinfo.parse_buddyinfo(read("procfs/proc_buddyinfo"), 4096) == \
        buddyinfo.parse_buddyinfo(read("node_exporter/proc_buddyinfo"), 4096)


def test_node_exporter_normal_zone_worked_example():
    """host-memory.md section 3: 32,139 pages free, none in >= 2 MiB blocks, index 1.000."""
    normal = zones("node_exporter/proc_buddyinfo")[0, "Normal"]
    assert normal.free_pages == 32139
    assert normal.free_bytes == 32139 * 4096
    assert normal.free_hugepage_bytes == 0
    assert normal.blocks_available_of(TWO_MIB) == 0
    assert normal.hugepage_unusable_index == 1.0


def test_rhcos_normal_zone_worked_example():
    """host-memory.md section 3: 10,852 pages free, 1,024 (9.4 %) in >= 2 MiB blocks, index 0.906."""
    normal = zones("rhcos-4.18/buddyinfo")[0, "Normal"]
    assert normal.free_pages == 10852
    assert normal.free_hugepage_bytes == 1024 * 4096
    assert round(normal.free_hugepage_bytes / normal.free_bytes, 3) == 0.094
    assert round(normal.hugepage_unusable_index, 3) == 0.906
    assert normal.blocks_available_of(TWO_MIB) == 2


def test_rhcos_dma32_zone_worked_example():
    dma32 = zones("rhcos-4.18/buddyinfo")[0, "DMA32"]
    assert dma32.free_pages == 123190
    assert dma32.free_hugepage_bytes == 117248 * 4096
    assert round(dma32.hugepage_unusable_index, 3) == 0.048
    assert dma32.blocks_available_of(TWO_MIB) == 7 + 111 * 2


def test_rhcos_lines_quoted_in_the_doc():
    text = ("Node 0, zone      DMA      1      1      1      0      2      1      1      0      1      1      3 \n"
            "Node 0, zone    DMA32    170     66     58     60     26     17     10     12      7      7    111 \n"
            "Node 0, zone   Normal    356    154    571    302    143     14      7      4      3      2      0 \n")
    assert buddyinfo.parse_buddyinfo(text, 4096) == buddyinfo.parse_buddyinfo(read("rhcos-4.18/buddyinfo"), 4096)


def test_centos_capture_without_normal_zone():
    parsed = zones("centos-stream-9/buddyinfo")
    assert list(parsed) == [(0, "DMA"), (0, "DMA32")]
    assert parsed[0, "DMA32"].free_blocks[-1] == 4


def test_development_vm_capture():
    normal = zones("dev-vm-6.18/buddyinfo")[0, "Normal"]
    assert normal.free_blocks == (2299, 1561, 795, 401, 171, 67, 30, 21, 16, 4, 11)
    assert normal.blocks_available_of(TWO_MIB) == 4 + 11 * 2


@pytest.mark.parametrize("page_size, size, order", [
    (4096, TWO_MIB, 9), (4096, 4 * MIB, 10), (4096, MIB, 8), (4096, 4096, 0), (4096, 1, 0),
    (4096, TWO_MIB + 1, 10), (65536, TWO_MIB, 5), (16384, TWO_MIB, 7),
])
def test_order_for_size(page_size, size, order):
    assert buddyinfo.Zone(0, "Normal", (0,), page_size).order_for(size) == order


def test_free_bytes_in_larger_blocks_and_index_at_4_mib():
    zone = buddyinfo.Zone(0, "Normal", (0, 0, 0, 0, 0, 0, 0, 0, 0, 3, 2), 4096)
    assert zone.free_bytes_in_blocks_of(4 * MIB) == 2 * 4 * MIB
    assert zone.free_bytes_in_blocks_of(TWO_MIB) == 3 * TWO_MIB + 2 * 4 * MIB
    assert zone.unusable_index(4 * MIB) == pytest.approx(3 * 2 / (3 * 2 + 2 * 4))
    assert zone.blocks_available_of(4 * MIB) == 2


def test_larger_pages_use_a_lower_order():
    zone = buddyinfo.Zone(0, "Normal", (10, 0, 0, 0, 0, 1), 65536)
    assert zone.free_hugepage_bytes == 32 * 65536
    assert zone.hugepage_unusable_index == pytest.approx(10 / 42)


def test_nothing_free_is_all_unusable():
    zone = buddyinfo.Zone(0, "Normal", (0,) * 11, 4096)
    assert zone.free_bytes == 0
    assert zone.hugepage_unusable_index == 1.0


def test_fewer_orders_than_the_huge_page_order():
    zone = buddyinfo.Zone(0, "Normal", (5, 5, 5), 4096)
    assert zone.free_hugepage_bytes == 0
    assert zone.hugepage_unusable_index == 1.0


@pytest.mark.parametrize("text, fragment", [
    ("", "no zone lines"),
    ("\n \n", "no zone lines"),
    ("Node 0, zone DMA 1 2 3\nNode 0, zone Normal 1 2\n", "2 orders where the first line has 3"),
    ("Node 0, zone Normal 1 2 x 4\n", "expected counts"),
    ("Node 0, zone Normal 1 -2 3\n", "expected counts"),
    ("Node 0, zone Normal\n", "expected counts"),
    ("Node 0, zone\n", "expected 'Node <n>, zone <name>"),
    ("Node x, zone Normal 1 2\n", "expected 'Node <n>, zone <name>"),
    ("Nodes 0, zone Normal 1 2\n", "expected 'Node <n>, zone <name>"),
    ("Node 0, zone Normal 1 2\nNode 0, zone Normal 1 2\n", "appears twice"),
    ("Node 0, zone Normal 1 " + "9" * 30 + "\n", "expected counts"),
    ("Node 0, zone Normal 1 +2 3\n", "expected counts"),  # int() takes a sign,
    ("Node 0, zone Normal 1 2_000 3\n", "expected counts"),  # underscores,
    ("Node 0, zone Normal 1 \u0663 3\n", "expected counts"),  # and other scripts' digits: counts do not
])
def test_malformed_buddyinfo(text, fragment):
    with pytest.raises(CollectError, match="/proc/buddyinfo") as err:
        buddyinfo.parse_buddyinfo(text, 4096)
    assert fragment in str(err.value)


# --- /proc/pagetypeinfo ----------------------------------------------------------------------------

def test_centos_pagetypeinfo():
    info = buddyinfo.parse_pagetypeinfo(read("centos-stream-9/pagetypeinfo"))
    assert (info.pageblock_order, info.pages_per_block) == (9, 512)
    free = {(i.node, i.zone, i.type): i for i in info.free}
    assert len(free) == 12
    assert free[0, "DMA32", "Movable"].free_blocks == (5371, 2097, 820, 400, 91, 151, 76, 34, 15, 14, 4)
    assert free[0, "DMA", "Unmovable"].free_pages == 32 + 64 + 128
    assert (0, "DMA32", "CMA") in free
    blocks = {(b.node, b.zone, b.type): b.pageblocks for b in info.blocks}
    assert blocks[0, "DMA32", "Unmovable"] == 171
    assert blocks[0, "DMA32", "Movable"] == 309
    assert blocks[0, "DMA32", "Reclaimable"] == 24
    assert blocks[0, "DMA", "Movable"] == 7
    assert len(blocks) == 12


def test_development_vm_pagetypeinfo():
    info = buddyinfo.parse_pagetypeinfo(read("dev-vm-6.18/pagetypeinfo"))
    types = {i.type for i in info.free}
    assert types == {"Unmovable", "Movable", "Reclaimable", "HighAtomic", "Isolate"}
    blocks = {(b.node, b.zone, b.type): b.pageblocks for b in info.blocks}
    assert blocks[0, "Normal", "Unmovable"] == 58
    assert blocks[0, "Normal", "Movable"] == 734


def test_lines_quoted_in_the_doc():
    text = (
        "Page block order: 9\n"
        "Pages per block:  512\n"
        "\n"
        "Free pages count per migrate type at order       0      1      2      3      4      5      6      7      8"
        "      9     10 \n"
        "Node    0, zone      DMA, type    Unmovable      0      0      0      0      0      1      1      1      0"
        "      0      0 \n"
        "Node    0, zone    DMA32, type      Movable   5371   2097    820    400     91    151     76     34     15"
        "     14      4 \n"
        "\n"
        "Number of blocks type     Unmovable      Movable  Reclaimable   HighAtomic          CMA      Isolate \n"
        "Node 0, zone    DMA32          171          309           24            0            0            0 \n")
    info = buddyinfo.parse_pagetypeinfo(text)
    assert [(i.zone, i.type) for i in info.free] == [("DMA", "Unmovable"), ("DMA32", "Movable")]
    assert [(b.type, b.pageblocks) for b in info.blocks] == [
        ("Unmovable", 171), ("Movable", 309), ("Reclaimable", 24), ("HighAtomic", 0), ("CMA", 0), ("Isolate", 0)]


def test_unknown_migrate_types_and_page_block_order_10_are_kept():
    # Shape of old 3.x kernels (Reserve type) and of the Android capture (order 10); values made up.
    text = ("Page block order: 10\nPages per block:  1024\n\n"
            "Free pages count per migrate type at order       0      1      2\n"
            "Node    0, zone   Normal, type      Reserve      2      0      1\n"
            "Node    0, zone   Normal, type   FutureType      1      1      1\n\n"
            "Number of blocks type     Reserve   FutureType\n"
            "Node 0, zone   Normal            1            3\n")
    info = buddyinfo.parse_pagetypeinfo(text)
    assert info.pageblock_order == 10
    assert {i.type: i.free_pages for i in info.free} == {"Reserve": 2 + 4, "FutureType": 1 + 2 + 4}
    assert {b.type: b.pageblocks for b in info.blocks} == {"Reserve": 1, "FutureType": 3}


def test_two_nodes_repeat_the_headers():
    node0 = read("centos-stream-9/pagetypeinfo")
    node1 = node0.replace("Node    0,", "Node    1,").replace("Node 0,", "Node 1,")
    info = buddyinfo.parse_pagetypeinfo(node0 + node1)
    assert {i.node for i in info.free} == {0, 1}
    assert len(info.blocks) == 24


def test_mixed_blocks_section_is_skipped():
    # The section CONFIG_PAGE_OWNER kernels add (sample from the kernel commit that introduced it).
    text = read("centos-stream-9/pagetypeinfo") + (
        "\nNumber of mixed blocks    Unmovable  Reclaimable      Movable      Reserve\n"
        "Node 0, zone      DMA            0            1            2            1\n")
    assert buddyinfo.parse_pagetypeinfo(text) == buddyinfo.parse_pagetypeinfo(read("centos-stream-9/pagetypeinfo"))


HEADER = "Page block order: 9\nPages per block:  512\n\nFree pages count per migrate type at order 0 1 2\n"


@pytest.mark.parametrize("text, fragment", [
    ("", "no 'Page block order:' line"),
    ("Pages per block: 512\n", "no 'Page block order:' line"),
    ("Page block order: 9\n", "no 'Pages per block:' line"),
    ("Page block order: nine\n", "not a number"),
    ("Page block order: 9\nPages per block: 512\nPage block order: 10\n", "differs"),
    (HEADER + "Node 0, zone DMA, type Movable 1 2\n", "2 counts under 3 order columns"),
    (HEADER + "Node 0, zone DMA, type Movable 1 2 x\n", "expected counts"),
    (HEADER + "Node 0, zone DMA, kind Movable 1 2 3\n", "type <type>"),
    (HEADER + "Node 0, zone DMA, type Movable 1 2 3\nNode 0, zone DMA, type Movable 1 2 3\n", "appears twice"),
    (HEADER + "Free pages count per migrate type at order 0 1\n", "2 orders where an earlier table has 3"),
    ("Free pages count per migrate type at order 0 2 3\n", "not 0, 1, 2"),
    ("Free pages count per migrate type at order\n", "not 0, 1, 2"),
    ("Node 0, zone DMA, type Movable 1 2 3\n", "unexpected line"),
    (HEADER + "something else\n", "unexpected line"),
    (HEADER + "Number of blocks type\n", "no migrate types"),
    (HEADER + "Number of blocks type Unmovable Movable\nNode 0, zone DMA 1\n", "1 counts under 2 migrate types"),
])
def test_malformed_pagetypeinfo(text, fragment):
    with pytest.raises(CollectError, match="/proc/pagetypeinfo") as err:
        buddyinfo.parse_pagetypeinfo(text)
    assert fragment in str(err.value)


# --- collect, supported, metrics -------------------------------------------------------------------

def machine(tmp_path: Path, **files: str) -> HostPaths:
    (tmp_path / "proc").mkdir()
    for name, source in files.items():
        shutil.copy(MEMORY / source, tmp_path / "proc" / name)
    return HostPaths(str(tmp_path))


def test_collect_fixture_root(tmp_path):
    host = machine(tmp_path, buddyinfo="dev-vm-6.18/buddyinfo", pagetypeinfo="dev-vm-6.18/pagetypeinfo")
    assert buddyinfo.supported(host, {}) is None
    facts = buddyinfo.collect(host, {})
    assert facts.page_size == 4096
    assert len(facts.zones) == 3
    assert facts.pagetypes is not None and facts.pagetypes.pageblock_order == 9


def test_pagetypeinfo_absent_is_not_an_error(tmp_path):
    facts = buddyinfo.collect(machine(tmp_path, buddyinfo="rhcos-4.18/buddyinfo"), {})
    assert facts.pagetypes is None
    assert len(facts.zones) == 3


def test_pagetypeinfo_unreadable_is_not_an_error(tmp_path, monkeypatch):
    host = machine(tmp_path, buddyinfo="rhcos-4.18/buddyinfo", pagetypeinfo="centos-stream-9/pagetypeinfo")
    real = buddyinfo.read_text

    def root_only(path, *args):
        if path.endswith("pagetypeinfo"):
            raise PermissionError(13, "Permission denied", path)
        return real(path, *args)

    monkeypatch.setattr(buddyinfo, "read_text", root_only)
    assert buddyinfo.collect(host, {}).pagetypes is None


def test_malformed_pagetypeinfo_fails_the_collector(tmp_path):
    host = machine(tmp_path, buddyinfo="rhcos-4.18/buddyinfo", pagetypeinfo="centos-stream-9/vmstat")
    with pytest.raises(CollectError, match="pagetypeinfo"):
        buddyinfo.collect(host, {})


def test_unsupported_without_buddyinfo(tmp_path):
    assert "no /proc/buddyinfo" in buddyinfo.supported(HostPaths(str(tmp_path)), {})


def test_live_page_size_comes_from_the_host():
    assert buddyinfo.page_size(HostPaths("/")) == os.sysconf("SC_PAGE_SIZE")


def samples(metrics, name):
    family = next(m for m in metrics if m.name == name)
    return dict(family.samples)


def test_metrics():
    facts = buddyinfo.Buddyinfo(4096, buddyinfo.parse_buddyinfo(read("rhcos-4.18/buddyinfo"), 4096),
                                buddyinfo.parse_pagetypeinfo(read("centos-stream-9/pagetypeinfo")))
    metrics = buddyinfo.metrics(facts)
    names = [m.name for m in metrics]
    assert names == ["nodehealth_buddyinfo_free_blocks", "nodehealth_memory_zone_free_bytes",
                     "nodehealth_memory_zone_free_hugepage_bytes", "nodehealth_memory_zone_unusable_index",
                     "nodehealth_pagetype_free_pages", "nodehealth_pagetype_blocks"]
    assert all(m.name.startswith("nodehealth_") and m.help.endswith(".") for m in metrics)
    blocks = samples(metrics, "nodehealth_buddyinfo_free_blocks")
    assert len(blocks) == 33
    assert blocks["0", "Normal", "2"] == 571
    assert samples(metrics, "nodehealth_memory_zone_free_bytes")["0", "Normal"] == 10852 * 4096
    assert samples(metrics, "nodehealth_memory_zone_free_hugepage_bytes")["0", "Normal"] == 1024 * 4096
    assert samples(metrics, "nodehealth_memory_zone_unusable_index")["0", "Normal"] == pytest.approx(9828 / 10852)
    assert samples(metrics, "nodehealth_pagetype_blocks")["0", "DMA32", "Unmovable"] == 171
    assert samples(metrics, "nodehealth_pagetype_free_pages")["0", "DMA", "Movable"] == 512 + 3 * 1024
    for family in metrics:
        keys = [labels for labels, _ in family.samples]
        assert keys == sorted(keys, key=lambda k: tuple(int(v) if v.isdigit() else v for v in k))


def test_metrics_without_pagetypeinfo():
    facts = buddyinfo.Buddyinfo(4096, buddyinfo.parse_buddyinfo(read("rhcos-4.18/buddyinfo"), 4096), None)
    assert not any(m.name.startswith("nodehealth_pagetype") for m in buddyinfo.metrics(facts))


# --- fixture machines (the pieces this module provides) --------------------------------------------

@pytest.mark.parametrize("name, reasons", [
    ("plain-host", []),
    ("h100-8x-cx7", []),
    ("small-memlock", []),
    ("fragmented", [("HugeBlocksExhausted", Severity.DEGRADED, "Normal zone of node 0")]),
])
def test_fixture_machines(name, reasons):
    host = HostPaths(str(FIXTURES / "machines" / name))
    facts = buddyinfo.collect(host, {})
    findings = memory.judge(Observed({"buddyinfo": facts}), dict(memory.DEFAULTS))
    assert [(f.reason, f.severity, f.device) for f in findings] == reasons


# --- fuzz ------------------------------------------------------------------------------------------

TOKENS = ["Node", "0,", "1,", "zone", "Normal", "DMA32,", "type", "Movable", "12", "0", "-1", "x", "",
          "Page block order:", "Pages per block:", "9", "Free pages count per migrate type at order",
          "Number of blocks type", "Number of mixed blocks", "\t", "١٢", "²"]
structured = st.lists(st.lists(st.sampled_from(TOKENS), max_size=14).map(" ".join), max_size=8).map("\n".join)
texts = st.one_of(st.text(max_size=300), structured)


@settings(max_examples=200, deadline=None)
@given(texts)
def test_fuzz_buddyinfo(text):
    try:
        result = buddyinfo.parse_buddyinfo(text, 4096)
    except CollectError:
        return
    assert result and all(0.0 <= z.hugepage_unusable_index <= 1.0 for z in result)


@settings(max_examples=200, deadline=None)
@given(texts)
def test_fuzz_pagetypeinfo(text):
    try:
        result = buddyinfo.parse_pagetypeinfo(text)
    except CollectError:
        return
    assert isinstance(result.pageblock_order, int)


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 50), st.integers(0, 10))
def test_fuzz_mutated_real_buddyinfo(position, garbage_index):
    """Real lines with one field replaced: still facts or CollectError."""
    lines = read("rhcos-4.18/buddyinfo").splitlines()
    fields = lines[-1].split()
    fields[position % len(fields)] = ["", "x", "-3", "3.5", "Node", "zone", "0,", "99", "١", "\x00", "1e3"][
        garbage_index]
    text = "\n".join(lines[:-1] + [" ".join(fields)])
    try:
        buddyinfo.parse_buddyinfo(text, 4096)
    except CollectError as e:
        assert "/proc/buddyinfo" in str(e)


def test_zoneinfo_sizes_and_meminfo_bytes():
    sizes = buddyinfo.parse_zoneinfo(read("dev-vm-6.18/zoneinfo"))
    normal = next(s for s in sizes if s.name == "Normal")
    assert (normal.node, normal.managed_pages, normal.present_pages, normal.high_pages) == (0, 720896, 5505024, 12199)
    assert buddyinfo.counters(buddyinfo.Buddyinfo(4096, (), None, None, sizes))["0:Normal:managed_pages"] == 720896
    info = buddyinfo.parse_meminfo(read("dev-vm-6.18/meminfo"))
    assert info["MemTotal"] == 24731708 * 1024 and info["HugePages_Total"] == 0
    assert buddyinfo.parse_zoneinfo("Node 0, zone Normal\n  managed x\n") == ()


@pytest.mark.parametrize("line, parsed", [
    ("MemFree: 12 kB", {"MemFree": 12 * 1024}),
    ("  MemFree:\t12   kB  ", {"MemFree": 12 * 1024}),
    ("MemFree: 12 kB extra", {"MemFree": 12 * 1024}),
    ("HugePages_Total: 12", {"HugePages_Total": 12}),
    ("MemFree: 12 MB", {"MemFree": 12}),  # only kB is scaled
    ("Odd:: 1", {"Odd:": 1}),
    ("MemFree: " + "9" * 20, {"MemFree": int("9" * 20)}),
    ("MemFree: " + "9" * 21, {}),
    ("MemFree: -1 kB", {}),
    ("MemFree: +1 kB", {}),
    ("MemFree: 1_0 kB", {}),
    ("MemFree: \u0661\u0662 kB", {}),
    ("MemFree 12 kB", {}),
    ("MemFree:12 kB", {}),
    ("MemFree:", {}),
    ("", {}),
])
def test_meminfo_lines_that_do_not_parse_are_skipped(line, parsed):
    assert buddyinfo.parse_meminfo(f"MemTotal: 1 kB\n{line}\nSwapTotal: 0 kB\n") == {
        "MemTotal": 1024, **parsed, "SwapTotal": 0}


@pytest.mark.parametrize("node", ["\u00b2,", "\u0661,", "9" * 5000 + ",", "-1,"])
def test_zoneinfo_garbage_node_number_is_not_a_section(node):
    """Not a number to convert (int() raised on some of these): the line is skipped like any other."""
    text = f"Node 0, zone DMA\n  managed 1\nNode {node} zone Normal\n  managed 2\n"
    assert [(s.node, s.name, s.managed_pages) for s in buddyinfo.parse_zoneinfo(text)] == [(0, "DMA", 1)]


def test_errors_name_the_line():
    with pytest.raises(CollectError, match=r"^/proc/buddyinfo line 3: 2 orders where the first line has 3$"):
        buddyinfo.parse_buddyinfo("Node 0, zone DMA 1 2 3\n\nNode 0, zone Normal 1 2\n", 4096)
    with pytest.raises(CollectError, match=r"^/proc/pagetypeinfo line 5: 2 counts under 3 order columns$"):
        buddyinfo.parse_pagetypeinfo(HEADER + "Node 0, zone DMA, type Movable 1 2\n")
    with pytest.raises(CollectError, match=r"^/proc/pagetypeinfo line 3: unexpected line 'Node 0, zone DMA 1'$"):
        buddyinfo.parse_pagetypeinfo("Page block order: 9\n\n  Node 0, zone DMA 1  \n")  # a row before any table


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 10**12), max_size=14), st.sampled_from([1, 3, 4096, 16384, 65536]),
       st.integers(-5, 1 << 42))
def test_zone_arithmetic_matches_its_definition(counts, page_size, size):
    """order_for and the sums are computed arithmetically; they must agree with the plain definitions."""
    zone = buddyinfo.Zone(0, "Normal", tuple(counts), page_size)
    order = 0
    while (page_size << order) < size:
        order += 1
    assert zone.order_for(size) == order
    assert zone.free_pages == sum(count << i for i, count in enumerate(counts))
    in_blocks = sum(count << i for i, count in enumerate(counts) if i >= order) * page_size
    assert zone.free_bytes_in_blocks_of(size) == in_blocks
    free = zone.free_bytes
    assert zone.unusable_index(size) == ((free - in_blocks) / free if free else 1.0)


def test_metrics_agree_with_the_zone_properties():
    facts = buddyinfo.collect(HostPaths(str(FIXTURES / "machines" / "h100-8x-cx7")), {})
    metrics = buddyinfo.metrics(facts)
    for zone in facts.zones:
        labels = (str(zone.node), zone.name)
        assert samples(metrics, "nodehealth_memory_zone_free_bytes")[labels] == zone.free_bytes
        assert samples(metrics, "nodehealth_memory_zone_free_hugepage_bytes")[labels] == zone.free_hugepage_bytes
        assert samples(metrics, "nodehealth_memory_zone_unusable_index")[labels] == zone.hugepage_unusable_index
    free_pages = samples(metrics, "nodehealth_pagetype_free_pages")
    assert free_pages == {(str(i.node), i.zone, i.type): i.free_pages for i in facts.pagetypes.free}
