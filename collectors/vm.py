"""Transparent huge page settings, compaction and THP counters from /proc/vmstat, and /proc/meminfo.

THP settings decide whether a page fault may stall in direct compaction; the compact_* and thp_*
counters show whether it does. checks/thp.py judges them; this module only reads.
"""
from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass

from nodehealth.collectors import CollectError
from nodehealth.host import HostPaths, read_text
from nodehealth.model import Metric

NAME = "vm"
DEFAULTS: dict = {}

THP_DIR = ("kernel", "mm", "transparent_hugepage")
THP_FILES = ("enabled", "defrag", "shmem_enabled", "khugepaged/defrag")

# Modes the kernel documents; the metric carries these plus whatever the host reports as current.
# Sorted, as the metric's series are.
ENABLED_MODES = ("always", "madvise", "never")
DEFRAG_MODES = ("always", "defer", "defer+madvise", "madvise", "never")
SHMEM_MODES = ("advise", "always", "deny", "force", "never", "within_size")

_BRACKETED = re.compile(r"\[([^\[\]\s]+)\]")
_VMSTAT_LINE = re.compile(r"(\S+)\s+(-?[0-9]{1,20})")
_KEPT_COUNTER = re.compile(r"(compact|thp)_[a-z0-9_]+")
_MEMINFO_LINE = re.compile(r"([^:\s]+):\s+(-?[0-9]{1,20})(\s+kB)?")


@dataclass(frozen=True)
class ThpSettings:
    """Current modes under /sys/kernel/mm/transparent_hugepage; None where the file is absent."""

    enabled: str | None = None
    defrag: str | None = None
    shmem_enabled: str | None = None
    khugepaged_defrag: bool | None = None


@dataclass(frozen=True)
class Meminfo:
    """The /proc/meminfo fields that matter to huge pages, in bytes (hugetlb pool sizes in pages)."""

    mem_total_bytes: int | None = None
    mem_free_bytes: int | None = None
    mem_available_bytes: int | None = None  # absent before Linux 3.14
    anon_hugepages_bytes: int | None = None
    hugepage_size_bytes: int | None = None
    hugepages_total: int | None = None
    hugepages_free: int | None = None

    @property
    def hugepages_pool_bytes(self) -> int | None:
        return _times(self.hugepages_total, self.hugepage_size_bytes)

    @property
    def hugepages_free_bytes(self) -> int | None:
        return _times(self.hugepages_free, self.hugepage_size_bytes)


def _times(count: int | None, size: int | None) -> int | None:
    return None if count is None or size is None else count * size


MEMINFO_FIELDS = {
    "MemTotal": "mem_total_bytes",
    "MemFree": "mem_free_bytes",
    "MemAvailable": "mem_available_bytes",
    "AnonHugePages": "anon_hugepages_bytes",
    "Hugepagesize": "hugepage_size_bytes",
    "HugePages_Total": "hugepages_total",
    "HugePages_Free": "hugepages_free",
}

# /proc/vmstat and /proc/meminfo as the kernel writes them (one space after a name, spaces after a
# colon, `\n`-ended lines, no blank one): the whole text is checked by one regex and the kept lines are
# picked by another, on "\n" + text so that the first line has its "\n" too. That is a quarter to a third
# of a loop over the lines (by instruction count); other text goes through the loop, which names a bad line.
_VMSTAT_TEXT = re.compile(r"(?:[!-~]+ [0-9]{1,20}\n)+")
_VMSTAT_KEPT = re.compile(r"\n((?:compact|thp)_[a-z0-9_]+) ([0-9]+)")
_MEMINFO_TEXT = re.compile(r"(?:[!-9;-~]+: +-?[0-9]{1,20}(?: kB)?\n)+")
_MEMINFO_KEPT = re.compile(r"\n(" + "|".join(MEMINFO_FIELDS) + r"): +(-?[0-9]+)( kB)?")


@dataclass(frozen=True)
class Vm:
    thp: ThpSettings
    # compact_* and thp_* counters as this kernel names them; a counter it lacks is not a key.
    vmstat: dict[str, int]
    meminfo: Meminfo


def supported(host: HostPaths, cfg: dict) -> str | None:
    if not os.path.exists(host.proc("vmstat")):
        return "no /proc/vmstat (not a Linux procfs)"
    return None


def collect(host: HostPaths, cfg: dict) -> Vm:
    vmstat = parse_vmstat(read_text(host.proc("vmstat")))
    try:
        meminfo = parse_meminfo(read_text(host.proc("meminfo")))
    except FileNotFoundError:
        meminfo = Meminfo()
    return Vm(read_thp(host), vmstat, meminfo)


def read_thp(host: HostPaths) -> ThpSettings:
    """Each file is optional: kernels without THP have none, older ones lack shmem_enabled. They are
    read through descriptors kept open between passes (host.KeptFiles), as read_attr reads them: a
    read at offset 0 shows the current mode, without an open and a close a file each pass (a third of
    the CPU, most of it the kernel's). A sysfs file that went fails that read and is looked for again."""
    texts = host.kept(NAME).read_texts(host.sys(*THP_DIR), THP_FILES)
    enabled, defrag, shmem, khugepaged = (texts[name] for name in THP_FILES)
    return ThpSettings(
        enabled=None if enabled is None else parse_mode(enabled, "enabled"),
        defrag=None if defrag is None else parse_mode(defrag, "defrag"),
        shmem_enabled=None if shmem is None else parse_mode(shmem, "shmem_enabled"),
        khugepaged_defrag=None if khugepaged is None else parse_flag(khugepaged, "khugepaged/defrag"),
    )


def parse_mode(text: str, name: str) -> str:
    """The bracketed word of `always [madvise] never`; an unknown word (a future `defer`) is kept."""
    current = _BRACKETED.findall(text)
    if len(current) != 1:
        raise CollectError(f"transparent_hugepage/{name}: expected one [bracketed] mode, got {text.strip()[:80]!r}")
    return current[0]


def parse_flag(text: str, name: str) -> bool:
    """`0`/`1` on current kernels, `[yes] no` / `yes [no]` on older ones."""
    value = text.strip()
    if "[" in value:
        value = parse_mode(value, name)
    if value in ("1", "yes"):
        return True
    if value in ("0", "no"):
        return False
    raise CollectError(f"transparent_hugepage/{name}: expected 0/1 or yes/no, got {text.strip()[:80]!r}")


def parse_vmstat(text: str) -> dict[str, int]:
    """`name value` lines; keeps the compact_* and thp_* counters."""
    if _VMSTAT_TEXT.fullmatch(text):
        rows = _VMSTAT_KEPT.findall("\n" + text)
    else:
        rows = _vmstat_lines(text)
    return {name: int(value) for name, value in rows}


def _vmstat_lines(text: str) -> list[tuple[str, str]]:
    """parse_vmstat's kept (name, value) lines, line by line: for text the kernel would not write."""
    rows = []
    lines = 0
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        match = _VMSTAT_LINE.fullmatch(line.strip())
        if match is None:
            raise CollectError(f"/proc/vmstat line {number} is not 'name value': {line[:80]!r}")
        lines += 1
        if _KEPT_COUNTER.fullmatch(match[1]):
            rows.append((match[1], match[2]))
    if not lines:
        raise CollectError("/proc/vmstat is empty")
    return rows


def parse_meminfo(text: str) -> Meminfo:
    """`Name:   value kB` lines (pool sizes have no unit); kB become bytes."""
    if _MEMINFO_TEXT.fullmatch(text):
        rows = _MEMINFO_KEPT.findall("\n" + text)
    else:
        rows = _meminfo_lines(text)
    values = {MEMINFO_FIELDS[name]: int(value) * (1024 if unit else 1) for name, value, unit in rows}
    if "mem_total_bytes" not in values:
        raise CollectError("/proc/meminfo has no MemTotal line")
    return Meminfo(**values)


def _meminfo_lines(text: str) -> list[tuple[str, str, str | None]]:
    """parse_meminfo's (name, value, unit) lines of MEMINFO_FIELDS, line by line: for text the kernel
    would not write."""
    rows = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        match = _MEMINFO_LINE.fullmatch(line.strip())
        if match is None:
            raise CollectError(f"/proc/meminfo line {number} is not 'Name: value [kB]': {line[:80]!r}")
        if match[1] in MEMINFO_FIELDS:
            rows.append(match.groups())
    return rows


def counters(facts: Vm) -> dict[str, float]:
    return {name: float(value) for name, value in facts.vmstat.items()}


@functools.lru_cache(maxsize=256)  # the kernel names a few dozen compact_* and thp_* counters
def _counter_texts(name: str) -> tuple[str, str]:
    """A vmstat counter's family name and help, made once, not at each scrape."""
    return f"nodehealth_vmstat_{name}_total", f"Kernel event counter {name} from /proc/vmstat."


def metrics(facts: Vm) -> list[Metric]:
    thp = facts.thp
    out = [
        _mode_metric("nodehealth_thp_enabled", "1 for the current transparent huge page mode, 0 for the others.",
                     ENABLED_MODES, thp.enabled),
        _mode_metric("nodehealth_thp_defrag", "1 for the current THP defrag (fault-time compaction) mode, "
                     "0 for the others.", DEFRAG_MODES, thp.defrag),
        _mode_metric("nodehealth_thp_shmem_enabled", "1 for the current THP mode of shmem/tmpfs, 0 for the others.",
                     SHMEM_MODES, thp.shmem_enabled),
    ]
    khugepaged = Metric("nodehealth_thp_khugepaged_defrag", "1 if khugepaged may compact memory to collapse huge "
                        "pages, 0 if not.")
    khugepaged.put((), None if thp.khugepaged_defrag is None else int(thp.khugepaged_defrag))
    out.append(khugepaged)
    for name, value in sorted(facts.vmstat.items()):
        family, help = _counter_texts(name)
        counter = Metric(family, help, "counter")
        counter.put((), value)
        out.append(counter)
    out.extend(_meminfo_metrics(facts.meminfo))
    return out


def _mode_metric(name: str, help: str, known: tuple, current: str | None) -> Metric:
    """Info-style gauge; no samples when the setting is absent (absent is not zero)."""
    metric = Metric(name, help, labels=("mode",))
    if current is not None:
        for mode in known if current in known else sorted((*known, current)):
            metric.put((mode,), 1 if mode == current else 0)
    return metric


def _meminfo_metrics(info: Meminfo) -> list[Metric]:
    rows = (
        ("nodehealth_memory_total_bytes", "Usable memory of the host (MemTotal).", info.mem_total_bytes),
        ("nodehealth_memory_free_bytes", "Memory not in use at all (MemFree).", info.mem_free_bytes),
        ("nodehealth_memory_available_bytes", "Memory the kernel estimates new work can get without swapping "
         "(MemAvailable).", info.mem_available_bytes),
        ("nodehealth_memory_anon_hugepages_bytes", "Anonymous memory backed by transparent huge pages "
         "(AnonHugePages).", info.anon_hugepages_bytes),
        ("nodehealth_memory_hugepage_size_bytes", "Size of the default hugetlb page (Hugepagesize).",
         info.hugepage_size_bytes),
        ("nodehealth_memory_hugepages_pool_bytes", "Memory reserved in the default-size hugetlb pool "
         "(HugePages_Total times Hugepagesize).", info.hugepages_pool_bytes),
        ("nodehealth_memory_hugepages_free_bytes", "Unused memory in the default-size hugetlb pool "
         "(HugePages_Free times Hugepagesize).", info.hugepages_free_bytes),
    )
    out = []
    for name, help, value in rows:
        metric = Metric(name, help)
        metric.put((), value)
        out.append(metric)
    return out
