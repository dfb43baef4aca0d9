"""Free memory by block size per (NUMA node, zone) from /proc/buddyinfo, and by migrate type
from /proc/pagetypeinfo when it is readable.

The buddy allocator keeps free memory in blocks of 2^order contiguous pages. Huge pages and
large pinned or DMA buffers need big blocks; when free memory exists only as small blocks, those
allocations stall in compaction or fail. This module reports the arithmetic (how much is free,
how much of it in blocks of a given size); checks/memory.py judges it.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from operator import attrgetter

from nodehealth.collectors import CollectError
from nodehealth.host import HostPaths, read_text
from nodehealth.model import Metric

NAME = "buddyinfo"
DEFAULTS: dict = {}

# The x86-64 huge page (PMD/THP) size: order 9 at 4 KiB pages.
HUGE_BLOCK_BYTES = 2 << 20
FIXTURE_PAGE_SIZE = 4096

# A kernel counter is at most 20 decimal digits (u64); longer is garbage, not a number to convert.
MAX_COUNT_DIGITS = 20


def _is_count(text: str) -> bool:
    """1 to MAX_COUNT_DIGITS ASCII digits (int() alone takes signs, underscores and other digits)."""
    return text.isdigit() and text.isascii() and len(text) <= MAX_COUNT_DIGITS


def _pages(free_blocks: tuple[int, ...], start: int = 0) -> int:
    """Pages held in the free blocks of order `start` and up: each count << its order, summed (by
    Horner's rule, the fewest Python steps: metrics() sums every zone and migrate type each scrape)."""
    pages = 0
    for count in reversed(free_blocks[start:]):
        pages = pages * 2 + count
    return pages << start


def _unusable_index(free_bytes: int, usable_bytes: int) -> float:
    """Zone.unusable_index from the two sums, for metrics(), which has them already."""
    return (free_bytes - usable_bytes) / free_bytes if free_bytes else 1.0


@dataclass(frozen=True)
class Zone:
    """One buddyinfo line: free blocks per order (order 0 first) of one zone of one node."""

    node: int
    name: str
    free_blocks: tuple[int, ...]
    page_size: int

    def order_for(self, size_bytes: int) -> int:
        """The smallest order whose blocks hold at least `size_bytes`: the pages it needs, rounded up to a
        power of two (arithmetic, not a loop: metrics() asks for every zone on every scrape)."""
        pages = -(-size_bytes // self.page_size)
        return max(pages - 1, 0).bit_length()

    @property
    def free_pages(self) -> int:
        return _pages(self.free_blocks)

    @property
    def free_bytes(self) -> int:
        return self.free_pages * self.page_size

    def free_bytes_in_blocks_of(self, size_bytes: int) -> int:
        """Free bytes held in blocks of at least `size_bytes`."""
        return _pages(self.free_blocks, self.order_for(size_bytes)) * self.page_size

    def blocks_available_of(self, size_bytes: int) -> int:
        """How many allocations of `size_bytes` the free lists could serve without compaction."""
        return self.free_bytes_in_blocks_of(size_bytes) // (self.page_size << self.order_for(size_bytes))

    def unusable_index(self, size_bytes: int) -> float:
        """The kernel's unusable free space index for allocations of `size_bytes`.

        Share of free memory in blocks too small for such an allocation: 0 = all usable,
        1 = none usable (also when nothing is free), as debugfs extfrag/unusable_index prints it.
        """
        return _unusable_index(self.free_bytes, self.free_bytes_in_blocks_of(size_bytes))

    @property
    def free_hugepage_bytes(self) -> int:
        return self.free_bytes_in_blocks_of(HUGE_BLOCK_BYTES)

    @property
    def hugepage_unusable_index(self) -> float:
        return self.unusable_index(HUGE_BLOCK_BYTES)


@dataclass(frozen=True)
class MigrateTypeFree:
    """Free blocks per order of one migrate type in one zone (pagetypeinfo's first table)."""

    node: int
    zone: str
    type: str
    free_blocks: tuple[int, ...]

    @property
    def free_pages(self) -> int:
        return _pages(self.free_blocks)


@dataclass(frozen=True)
class MigrateTypeBlocks:
    """How many pageblocks of a zone carry one migrate type (pagetypeinfo's second table)."""

    node: int
    zone: str
    type: str
    pageblocks: int


@dataclass(frozen=True)
class PageTypeInfo:
    pageblock_order: int
    pages_per_block: int
    free: tuple[MigrateTypeFree, ...]
    blocks: tuple[MigrateTypeBlocks, ...]


@dataclass(frozen=True)
class ZoneSize:
    """A zone's size from /proc/zoneinfo: `managed` grows while the kernel still hands memory to it
    (deferred struct page init, a VM adding or accepting memory); `present` is what it will hold."""

    node: int
    name: str
    managed_pages: int
    present_pages: int | None
    high_pages: int | None = None  # the high watermark: below it kswapd is reclaiming in this zone


@dataclass(frozen=True)
class Buddyinfo:
    page_size: int
    zones: tuple[Zone, ...]
    # None when /proc/pagetypeinfo is absent or unreadable (root-only, mode 0400, on current kernels).
    pagetypes: PageTypeInfo | None
    # /proc/meminfo in bytes (kB fields converted, counts such as HugePages_Total as they are);
    # None when absent or unreadable.
    meminfo: dict[str, int] | None = None
    sizes: tuple[ZoneSize, ...] = ()  # from /proc/zoneinfo; empty when it is absent or unreadable

    def size_of(self, zone: Zone) -> ZoneSize | None:
        return next((s for s in self.sizes if (s.node, s.name) == (zone.node, zone.name)), None)


def supported(host: HostPaths, cfg: dict) -> str | None:
    if not os.path.exists(host.proc("buddyinfo")):
        return "no /proc/buddyinfo (not a Linux procfs)"
    return None


def page_size(host: HostPaths) -> int:
    """The live host's page size; fixture machines are recorded on 4 KiB-page hosts."""
    return os.sysconf("SC_PAGE_SIZE") if host.is_live else FIXTURE_PAGE_SIZE


def collect(host: HostPaths, cfg: dict) -> Buddyinfo:
    size = page_size(host)
    zones = parse_buddyinfo(read_text(host.proc("buddyinfo")), size)
    try:
        pagetypes: PageTypeInfo | None = parse_pagetypeinfo(read_text(host.proc("pagetypeinfo")))
    except (FileNotFoundError, PermissionError):
        pagetypes = None
    return Buddyinfo(size, zones, pagetypes, _optional(host.proc("meminfo"), parse_meminfo),
                     _optional(host.proc("zoneinfo"), parse_zoneinfo) or ())


def _optional(path: str, parse):
    """A file that only refines the verdict: unreadable or absent reads as None, never a failure."""
    try:
        return parse(read_text(path))
    except OSError:
        return None


def parse_meminfo(text: str) -> dict[str, int]:
    """`MemAvailable:  24109808 kB` lines to bytes; lines that do not parse are skipped."""
    out: dict[str, int] = {}
    for fields in map(str.split, text.splitlines()):
        if len(fields) >= 2 and fields[0][-1] == ":" and _is_count(fields[1]):
            out[fields[0][:-1]] = int(fields[1]) << 10 if len(fields) > 2 and fields[2] == "kB" else int(fields[1])
    return out


def parse_zoneinfo(text: str) -> tuple[ZoneSize, ...]:
    """Each `Node N, zone NAME` section's managed and present pages and high watermark; a section
    without managed is skipped."""
    sizes: list[ZoneSize] = []
    current: tuple[int, str] | None = None
    values: dict[str, int] = {}

    def close() -> None:
        if current is not None and "managed" in values:
            sizes.append(ZoneSize(current[0], current[1], values["managed"], values.get("present"), values.get("high")))

    for fields in map(str.split, text.splitlines()):
        if len(fields) == 2:
            if fields[0] in ("managed", "present", "high") and _is_count(fields[1]):
                values.setdefault(fields[0], int(fields[1]))
        elif len(fields) >= 4 and fields[0] == "Node" and fields[2] == "zone" and _is_count(fields[1].rstrip(",")):
            close()
            current, values = (int(fields[1].rstrip(",")), fields[3]), {}
    close()
    return tuple(sizes)


def managed_key(node: int, zone: str) -> str:
    """Key of a zone's managed pages in counters(): its rate says the zone is still growing."""
    return f"{node}:{zone}:managed_pages"


def counters(facts: Buddyinfo) -> dict[str, float]:
    """Managed pages per zone. Not a counter of events, but only growth gives a rate (the engine
    skips decreases), and growth is what the memory check needs to know."""
    return {managed_key(s.node, s.name): s.managed_pages for s in facts.sizes}


# The row checks below raise CollectError without a place; the parse loops add the file and line.

def _counts(fields: list[str]) -> tuple[int, ...]:
    """Fields that are each _is_count, checked on the joined row at once (a call per field costs more than
    the check); the longest field is only looked for when the row is long enough to hold a too long one."""
    joined = "".join(fields)
    if not (joined.isdigit() and joined.isascii()) or (
            len(joined) > MAX_COUNT_DIGITS and len(max(fields, key=len)) > MAX_COUNT_DIGITS):
        raise CollectError(f"expected counts, got {' '.join(fields)[:80]!r}")
    return tuple(map(int, fields))


def _node_zone(fields: list[str]) -> tuple[int, str]:
    """`Node <n>, zone <name>` as split fields (the zone name may end in a comma)."""
    if len(fields) < 4 or fields[0] != "Node" or fields[2] != "zone" or not _is_count(fields[1].rstrip(",")):
        raise CollectError("expected 'Node <n>, zone <name> ...'")
    return int(fields[1].rstrip(",")), fields[3].rstrip(",")


def parse_buddyinfo(text: str, page_size: int) -> tuple[Zone, ...]:
    """`Node 0, zone   Normal  356  154 ...` lines; every line must have the first line's bucket count."""
    zones: list[Zone] = []
    seen = set()
    for number, line in enumerate(text.splitlines(), 1):
        fields = line.split()
        if not fields:
            continue
        try:
            node, name = _node_zone(fields)
            counts = _counts(fields[4:])
            if zones and len(counts) != len(zones[0].free_blocks):
                raise CollectError(f"{len(counts)} orders where the first line has {len(zones[0].free_blocks)}")
            if (node, name) in seen:
                raise CollectError(f"node {node} zone {name} appears twice")
        except CollectError as e:
            raise CollectError(f"/proc/buddyinfo line {number}: {e}") from None
        seen.add((node, name))
        zones.append(Zone(node, name, counts, page_size))
    if not zones:
        raise CollectError("/proc/buddyinfo has no zone lines")
    return tuple(zones)


FREE_HEADER = "Free pages count per migrate type at order"
BLOCKS_HEADER = "Number of blocks type"
MIXED_HEADER = "Number of mixed blocks"  # CONFIG_PAGE_OWNER kernels only; its table is skipped


class _PageTypeParser:
    """/proc/pagetypeinfo, section by section. Each node repeats the headers and both tables."""

    def __init__(self) -> None:
        self.header: dict[str, int] = {}
        self.orders: int | None = None
        self.types: list[str] = []
        self.section: str | None = None  # the table that `Node ...` rows belong to: free, blocks or mixed
        self.free: dict[tuple[int, str, str], MigrateTypeFree] = {}
        self.blocks: dict[tuple[int, str, str], MigrateTypeBlocks] = {}

    def header_line(self, line: str) -> None:
        if line.startswith(("Page block order:", "Pages per block:")):
            self.header_value(line)
        elif line.startswith(FREE_HEADER):
            self.free_header(line[len(FREE_HEADER):].split())
        elif line.startswith(BLOCKS_HEADER):
            self.types = line[len(BLOCKS_HEADER):].split()
            if not self.types:
                raise CollectError("no migrate types in the pageblock table header")
            self.section = "blocks"
        elif line.startswith(MIXED_HEADER):
            self.section = "mixed"
        else:
            raise CollectError(f"unexpected line {line[:80]!r}")

    def header_value(self, line: str) -> None:
        key, _, value = line.partition(":")
        value = value.strip()
        if not _is_count(value):
            raise CollectError(f"{key} is not a number: {value[:40]!r}")
        if self.header.setdefault(key, int(value)) != int(value):
            raise CollectError(f"{key} {value} differs from the earlier {self.header[key]}")

    def free_header(self, columns: list[str]) -> None:
        if not columns or columns != [str(order) for order in range(len(columns))]:
            raise CollectError(f"order columns are not 0, 1, 2, ...: {' '.join(columns)[:80]!r}")
        if self.orders is not None and self.orders != len(columns):
            raise CollectError(f"{len(columns)} orders where an earlier table has {self.orders}")
        self.orders = len(columns)
        self.section = "free"

    def free_row(self, fields: list[str]) -> None:
        node, zone = _node_zone(fields)
        if len(fields) < 6 or fields[4] != "type":
            raise CollectError("expected 'Node <n>, zone <name>, type <type> <counts>'")
        counts = _counts(fields[6:])
        if len(counts) != self.orders:
            raise CollectError(f"{len(counts)} counts under {self.orders} order columns")
        item = MigrateTypeFree(node, zone, fields[5], counts)
        if self.free.setdefault((node, zone, item.type), item) is not item:
            raise CollectError(f"node {node} zone {zone} type {item.type} appears twice")

    def blocks_row(self, fields: list[str]) -> None:
        node, zone = _node_zone(fields)
        counts = _counts(fields[4:])
        if len(counts) != len(self.types):
            raise CollectError(f"{len(counts)} counts under {len(self.types)} migrate types")
        for migrate_type, count in zip(self.types, counts):
            item = MigrateTypeBlocks(node, zone, migrate_type, count)
            if self.blocks.setdefault((node, zone, migrate_type), item) is not item:
                raise CollectError(f"node {node} zone {zone} type {migrate_type} appears twice")

    def result(self) -> PageTypeInfo:
        for key in ("Page block order", "Pages per block"):
            if key not in self.header:
                raise CollectError(f"/proc/pagetypeinfo has no '{key}:' line")
        return PageTypeInfo(self.header["Page block order"], self.header["Pages per block"],
                            tuple(self.free.values()), tuple(self.blocks.values()))


def parse_pagetypeinfo(text: str) -> PageTypeInfo:
    """Page block order, free blocks per (node, zone, migrate type, order), pageblocks per migrate type.

    Migrate types differ between kernels (CMA, HighAtomic, old Reserve); all are kept as printed.
    """
    parser = _PageTypeParser()
    for number, line in enumerate(text.splitlines(), 1):
        fields = line.split()
        if not fields:
            continue
        try:
            if not fields[0].startswith("Node"):
                parser.header_line(line.strip())
            elif parser.section == "free":
                parser.free_row(fields)
            elif parser.section == "blocks":
                parser.blocks_row(fields)
            elif parser.section != "mixed":
                raise CollectError(f"unexpected line {line.strip()[:80]!r}")
        except CollectError as e:
            raise CollectError(f"/proc/pagetypeinfo line {number}: {e}") from None
    return parser.result()


def metrics(facts: Buddyinfo) -> list[Metric]:
    blocks = Metric("nodehealth_buddyinfo_free_blocks",
                    "Free blocks of 2^order contiguous pages in the zone's buddy allocator.",
                    labels=("node", "zone", "order"))
    free = Metric("nodehealth_memory_zone_free_bytes", "Free memory in the zone.", labels=("node", "zone"))
    huge = Metric("nodehealth_memory_zone_free_hugepage_bytes",
                  "Free memory in the zone held in blocks of at least 2 MiB.", labels=("node", "zone"))
    unusable = Metric("nodehealth_memory_zone_unusable_index",
                      "Share of the zone's free memory in blocks too small for a 2 MiB allocation (0 to 1).",
                      labels=("node", "zone"))
    for zone in sorted(facts.zones, key=attrgetter("node", "name")):
        node, name = str(zone.node), zone.name
        for order, count in enumerate(zone.free_blocks):
            blocks.put((node, name, str(order)), count)
        labels = (node, name)
        free_bytes, huge_bytes = zone.free_bytes, zone.free_hugepage_bytes
        free.put(labels, free_bytes)
        huge.put(labels, huge_bytes)
        unusable.put(labels, _unusable_index(free_bytes, huge_bytes))
    out = [blocks, free, huge, unusable]
    if facts.pagetypes is not None:
        out.extend(_pagetype_metrics(facts.pagetypes))
    return out


def _pagetype_metrics(info: PageTypeInfo) -> list[Metric]:
    key = attrgetter("node", "zone", "type")
    free = Metric("nodehealth_pagetype_free_pages", "Free pages of one migrate type in the zone.",
                  labels=("node", "zone", "type"))
    for item in sorted(info.free, key=key):
        free.put((str(item.node), item.zone, item.type), item.free_pages)
    blocks = Metric("nodehealth_pagetype_blocks", "Pageblocks of the zone marked with one migrate type.",
                    labels=("node", "zone", "type"))
    for item in sorted(info.blocks, key=key):
        blocks.put((str(item.node), item.zone, item.type), item.pageblocks)
    return [free, blocks]
