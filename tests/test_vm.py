"""The vm collector: THP settings, compact_*/thp_* counters from /proc/vmstat, /proc/meminfo."""
from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nodehealth.checks import thp
from nodehealth.collectors import CollectError, vm
from nodehealth.host import HostPaths
from nodehealth.model import Observed, Severity

FIXTURES = Path(__file__).parent / "fixtures"
MEMORY = FIXTURES / "memory"
KIB = 1024


def read(name: str) -> str:
    return (MEMORY / name).read_text()


# --- /proc/vmstat ----------------------------------------------------------------------------------

def test_node_exporter_vmstat_older_kernel():
    counters = vm.parse_vmstat(read("node_exporter/proc_vmstat"))
    assert len(counters) == 13
    assert counters["compact_stall"] == 210959
    assert counters["thp_fault_fallback"] == 98119
    assert counters["thp_split"] == 69984
    assert "thp_split_page" not in counters  # absent, not 0
    assert "compact_daemon_wake" not in counters
    assert "pgmajfault" not in counters  # only compaction and THP are kept


def test_centos_vmstat():
    counters = vm.parse_vmstat(read("centos-stream-9/vmstat"))
    assert counters["thp_fault_alloc"] == 200
    assert counters["thp_collapse_alloc"] == 13
    assert counters["thp_deferred_split_page"] == 33
    assert counters["thp_split_pmd"] == 40
    assert counters["compact_stall"] == 0
    assert "thp_split" not in counters


def test_development_vm_vmstat():
    counters = vm.parse_vmstat(read("dev-vm-6.18/vmstat"))
    assert len(counters) == 34
    assert "thp_underused_split_page" in counters
    assert all(name.startswith(("compact_", "thp_")) for name in counters)


@pytest.mark.parametrize("text, fragment", [
    ("", "is empty"),
    ("\n\n", "is empty"),
    ("compact_stall\n", "line 1 is not 'name value'"),
    ("nr_free_pages 1\ncompact_stall many\n", "line 2 is not 'name value'"),
    ("compact_stall 1 2\n", "line 1"),
    ("compact_stall 1.5\n", "line 1"),
    ("compact_stall " + "1" * 25 + "\n", "line 1"),
])
def test_malformed_vmstat(text, fragment):
    with pytest.raises(CollectError, match="/proc/vmstat") as err:
        vm.parse_vmstat(text)
    assert fragment in str(err.value)


VMSTAT_FILES = sorted(FIXTURES.glob("**/*vmstat"))
MEMINFO_FILES = sorted(FIXTURES.glob("**/*meminfo"))


@pytest.mark.parametrize("path", VMSTAT_FILES + MEMINFO_FILES, ids=lambda p: str(p.relative_to(FIXTURES)))
def test_the_kernels_text_parses_as_the_line_loop_parses_it(path):
    """Text as the kernel writes it is read by two regexes over the whole text; with tabs for spaces it
    goes through the line loop."""
    parse = vm.parse_vmstat if path.name.endswith("vmstat") else vm.parse_meminfo
    text = path.read_text()
    assert parse(text) == parse(text.replace(" ", "\t")) == parse("\n" + text + "\n")


# --- /proc/meminfo ---------------------------------------------------------------------------------

def test_node_exporter_meminfo_without_memavailable():
    info = vm.parse_meminfo(read("node_exporter/proc_meminfo"))
    assert info.mem_total_bytes == 3742148 * KIB
    assert info.mem_free_bytes == 225472 * KIB
    assert info.mem_available_bytes is None  # older kernel: absent, not 0
    assert info.anon_hugepages_bytes == 0
    assert info.hugepage_size_bytes == 2048 * KIB
    assert (info.hugepages_total, info.hugepages_free) == (0, 0)
    assert info.hugepages_pool_bytes == 0


def test_centos_meminfo():
    info = vm.parse_meminfo(read("centos-stream-9/meminfo"))
    assert info.mem_available_bytes == 506936 * KIB
    assert info.anon_hugepages_bytes == 12288 * KIB


def test_procfs_meminfo():
    info = vm.parse_meminfo(read("procfs/proc_meminfo"))
    assert info.mem_total_bytes == 15666184 * KIB
    assert info.anon_hugepages_bytes == 12288 * KIB


def test_hugetlb_pool_in_bytes():
    info = vm.parse_meminfo("MemTotal: 100 kB\nHugePages_Total:  4\nHugePages_Free:  1\nHugepagesize: 2048 kB\n")
    assert info.hugepages_pool_bytes == 4 * 2048 * KIB
    assert info.hugepages_free_bytes == 2048 * KIB
    assert vm.parse_meminfo("MemTotal: 100 kB\nHugePages_Total: 4\n").hugepages_pool_bytes is None


@pytest.mark.parametrize("text, fragment", [
    ("", "no MemTotal"),
    ("MemFree: 10 kB\n", "no MemTotal"),
    ("MemTotal 10 kB\n", "line 1 is not"),
    ("MemTotal: ten kB\n", "line 1 is not"),
    ("MemTotal: 10 kB\nMemFree: 10 MB\n", "line 2 is not"),
])
def test_malformed_meminfo(text, fragment):
    with pytest.raises(CollectError, match="/proc/meminfo") as err:
        vm.parse_meminfo(text)
    assert fragment in str(err.value)


# --- transparent_hugepage files --------------------------------------------------------------------

@pytest.mark.parametrize("text, mode", [
    ("[always] madvise never\n", "always"),
    ("always [madvise] never\n", "madvise"),
    ("always madvise [never]", "never"),
    ("[always] defer defer+madvise madvise never\n", "always"),
    ("always defer [defer+madvise] madvise never\n", "defer+madvise"),
    ("always within_size advise [never] deny force\n", "never"),
    ("always madvise never [defer]\n", "defer"),  # a mode this code does not know is kept
])
def test_parse_mode(text, mode):
    assert vm.parse_mode(text, "enabled") == mode


@pytest.mark.parametrize("text", ["", "always madvise never", "[always] [madvise] never", "[] never", "[a b]"])
def test_malformed_mode(text):
    with pytest.raises(CollectError, match="transparent_hugepage/enabled"):
        vm.parse_mode(text, "enabled")


@pytest.mark.parametrize("text, value", [("1\n", True), ("0\n", False), ("[yes] no\n", True), ("yes [no]\n", False)])
def test_parse_flag(text, value):
    assert vm.parse_flag(text, "khugepaged/defrag") is value


@pytest.mark.parametrize("text", ["", "2", "maybe", "[maybe] no"])
def test_malformed_flag(text):
    with pytest.raises(CollectError, match="khugepaged/defrag"):
        vm.parse_flag(text, "khugepaged/defrag")


# --- collect, supported, counters, metrics ---------------------------------------------------------

def build(tmp_path: Path, thp_files: dict, meminfo: bool = True) -> HostPaths:
    proc = tmp_path / "proc"
    proc.mkdir()
    shutil.copy(MEMORY / "dev-vm-6.18/vmstat", proc / "vmstat")
    if meminfo:
        shutil.copy(MEMORY / "dev-vm-6.18/meminfo", proc / "meminfo")
    for name, source in thp_files.items():
        target = tmp_path / "sys/kernel/mm/transparent_hugepage" / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(MEMORY / source, target)
    return HostPaths(str(tmp_path))


ALL_THP = {"enabled": "dev-vm-6.18/thp_enabled", "defrag": "dev-vm-6.18/thp_defrag",
           "shmem_enabled": "dev-vm-6.18/thp_shmem_enabled", "khugepaged/defrag": "dev-vm-6.18/thp_khugepaged_defrag"}


def test_collect_development_vm(tmp_path):
    host = build(tmp_path, ALL_THP)
    assert vm.supported(host, {}) is None
    facts = vm.collect(host, {})
    assert facts.thp == vm.ThpSettings(enabled="madvise", defrag="madvise", shmem_enabled="never",
                                       khugepaged_defrag=True)
    assert facts.meminfo.mem_total_bytes == 24731708 * KIB
    assert facts.vmstat["compact_stall"] == 0


def test_collect_without_thp_or_meminfo(tmp_path):
    facts = vm.collect(build(tmp_path, {}, meminfo=False), {})
    assert facts.thp == vm.ThpSettings(None, None, None, None)
    assert facts.meminfo == vm.Meminfo()
    assert facts.meminfo.mem_total_bytes is None
    assert len(facts.vmstat) == 34


def test_collect_without_shmem_enabled(tmp_path):
    files = {k: v for k, v in ALL_THP.items() if k != "shmem_enabled"}
    facts = vm.collect(build(tmp_path, files), {})
    assert facts.thp.shmem_enabled is None
    assert facts.thp.enabled == "madvise"


def test_collect_fails_on_a_garbled_thp_file(tmp_path):
    host = build(tmp_path, {"enabled": "dev-vm-6.18/thp_khugepaged_defrag"})
    with pytest.raises(CollectError, match="transparent_hugepage/enabled"):
        vm.collect(host, {})


def test_thp_files_are_read_again_each_pass(tmp_path, monkeypatch):
    """They are read through descriptors kept between passes: a mode changed in place, a file that came,
    one that went and the whole directory going and coming back are all seen at the next pass."""
    host = build(tmp_path, {k: v for k, v in ALL_THP.items() if k != "shmem_enabled"})
    thp_dir = tmp_path / "sys/kernel/mm/transparent_hugepage"
    assert vm.collect(host, {}).thp == vm.ThpSettings("madvise", "madvise", None, True)
    (thp_dir / "enabled").write_text("[always] madvise never\n")  # in place, as the kernel changes it
    shutil.copy(MEMORY / ALL_THP["shmem_enabled"], thp_dir / "shmem_enabled")
    assert vm.collect(host, {}).thp == vm.ThpSettings("always", "madvise", "never", True)
    real_pread = os.pread

    def sysfs_pread(fd, size, offset):  # sysfs answers a read of an attribute that went with ENODEV
        if os.readlink(f"/proc/self/fd/{fd}").endswith(" (deleted)"):
            raise OSError(errno.ENODEV, os.strerror(errno.ENODEV))
        return real_pread(fd, size, offset)

    monkeypatch.setattr(os, "pread", sysfs_pread)
    (thp_dir / "defrag").unlink()
    assert vm.collect(host, {}).thp == vm.ThpSettings("always", None, "never", True)
    shutil.rmtree(thp_dir)
    assert vm.collect(host, {}).thp == vm.ThpSettings()
    (thp_dir / "khugepaged").mkdir(parents=True)
    (thp_dir / "khugepaged" / "defrag").write_text("0\n")
    assert vm.collect(host, {}).thp == vm.ThpSettings(khugepaged_defrag=False)


def test_unsupported_without_vmstat(tmp_path):
    assert "no /proc/vmstat" in vm.supported(HostPaths(str(tmp_path)), {})


def test_counters_are_the_vmstat_counters():
    facts = vm.Vm(vm.ThpSettings(), vm.parse_vmstat(read("node_exporter/proc_vmstat")), vm.Meminfo())
    counters = vm.counters(facts)
    assert counters["compact_stall"] == 210959.0
    assert set(counters) == set(facts.vmstat)


def family(metrics, name):
    return next(m for m in metrics if m.name == name)


def test_metrics():
    facts = vm.Vm(vm.ThpSettings(enabled="always", defrag="defer", shmem_enabled=None, khugepaged_defrag=False),
                  vm.parse_vmstat(read("node_exporter/proc_vmstat")),
                  vm.parse_meminfo(read("node_exporter/proc_meminfo")))
    metrics = vm.metrics(facts)
    assert dict(family(metrics, "nodehealth_thp_enabled").samples) == {
        ("always",): 1.0, ("madvise",): 0.0, ("never",): 0.0}
    defrag = dict(family(metrics, "nodehealth_thp_defrag").samples)
    assert defrag[("defer",)] == 1.0 and sum(defrag.values()) == 1.0 and len(defrag) == 5
    assert family(metrics, "nodehealth_thp_shmem_enabled").samples == []  # absent, not 0
    assert family(metrics, "nodehealth_thp_khugepaged_defrag").samples == [((), 0.0)]
    stall = family(metrics, "nodehealth_vmstat_compact_stall_total")
    assert stall.kind == "counter" and stall.samples == [((), 210959.0)]
    assert family(metrics, "nodehealth_vmstat_thp_split_total").samples == [((), 69984.0)]
    assert not any(m.name == "nodehealth_vmstat_thp_split_page_total" for m in metrics)
    assert family(metrics, "nodehealth_memory_total_bytes").samples == [((), 3742148.0 * KIB)]
    assert family(metrics, "nodehealth_memory_available_bytes").samples == []
    assert family(metrics, "nodehealth_memory_hugepage_size_bytes").samples == [((), 2048.0 * KIB)]
    names = [m.name for m in metrics]
    assert len(names) == len(set(names))
    assert all(n.startswith("nodehealth_") and m.help.endswith(".") for n, m in zip(names, metrics))
    counters = [n[len("nodehealth_vmstat_"):-len("_total")] for n in names if n.startswith("nodehealth_vmstat_")]
    assert counters == sorted(facts.vmstat)


def test_unknown_current_mode_gets_its_own_series():
    facts = vm.Vm(vm.ThpSettings(enabled="defer"), {}, vm.Meminfo())
    samples = dict(family(vm.metrics(facts), "nodehealth_thp_enabled").samples)
    assert samples == {("always",): 0.0, ("defer",): 1.0, ("madvise",): 0.0, ("never",): 0.0}


@pytest.mark.parametrize("current", ["never", "always", "zzz", "aaa"])
def test_mode_series_are_sorted(current):
    facts = vm.Vm(vm.ThpSettings(current, current, current), {}, vm.Meminfo())
    metrics = vm.metrics(facts)
    for name in ("nodehealth_thp_enabled", "nodehealth_thp_defrag", "nodehealth_thp_shmem_enabled"):
        labels = [labels for labels, _ in family(metrics, name).samples]
        assert labels == sorted(labels) and (current,) in labels


def test_counter_family_texts_are_kept_for_at_most_a_bound_of_names():
    vm._counter_texts.cache_clear()
    bound = vm._counter_texts.cache_parameters()["maxsize"]
    names = [f"thp_made_up_{i:03}" for i in range(bound + 10)]
    facts = vm.Vm(vm.ThpSettings(), dict.fromkeys(names, 7), vm.Meminfo())
    for _ in range(2):
        metrics = [m for m in vm.metrics(facts) if m.name.startswith("nodehealth_vmstat_")]
        assert [m.name for m in metrics] == [f"nodehealth_vmstat_{n}_total" for n in names]
        assert metrics[-1].help == f"Kernel event counter {names[-1]} from /proc/vmstat."
        assert all(m.kind == "counter" and m.samples == [((), 7.0)] for m in metrics)
    assert vm._counter_texts.cache_info().currsize == bound


# --- fixture machines (the pieces this module provides) --------------------------------------------

@pytest.mark.parametrize("name, enabled, defrag, reasons", [
    ("plain-host", "madvise", "madvise", []),
    ("h100-8x-cx7", "madvise", "madvise", []),
    ("small-memlock", "madvise", "madvise", []),
    ("fragmented", "always", "always", [("ThpDefragAlways", Severity.WARNING)]),
])
def test_fixture_machines(name, enabled, defrag, reasons):
    facts = vm.collect(HostPaths(str(FIXTURES / "machines" / name)), {})
    assert (facts.thp.enabled, facts.thp.defrag) == (enabled, defrag)
    findings = thp.judge(Observed({"vm": facts}), dict(thp.DEFAULTS))
    assert [(f.reason, f.severity) for f in findings] == reasons


# --- fuzz ------------------------------------------------------------------------------------------

LINES = ["compact_stall 12", "thp_fault_alloc 3", "nr_free_pages 7", "MemTotal: 100 kB", "HugePages_Total: 2",
         "Hugepagesize: 2048 kB", "x", "", "compact_stall -1", "MemFree: 1 MB", "a b c", ":", "١٢", "thp_x ²"]
texts = st.one_of(st.text(max_size=300), st.lists(st.sampled_from(LINES), max_size=10).map("\n".join))


@settings(max_examples=200, deadline=None)
@given(texts)
def test_fuzz_vmstat(text):
    try:
        counters = vm.parse_vmstat(text)
    except CollectError:
        return
    assert all(name.startswith(("compact_", "thp_")) and isinstance(v, int) for name, v in counters.items())


@settings(max_examples=200, deadline=None)
@given(texts)
def test_fuzz_meminfo(text):
    try:
        info = vm.parse_meminfo(text)
    except CollectError:
        return
    assert isinstance(info.mem_total_bytes, int)


def outcome(parse, text):
    """What parse makes of text: its result, or which error (without the line it quotes)."""
    try:
        return parse(text)
    except CollectError as e:
        return str(e).split(":")[0]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(LINES + ["thp_split_pmd 40", "compact_x1 0", "Hugepagesize:       2048 kB"]),
                max_size=10).map(lambda lines: "".join(line + "\n" for line in lines)))
def test_fuzz_kernel_like_text_parses_as_the_line_loop_parses_it(text):
    for parse in (vm.parse_vmstat, vm.parse_meminfo):
        assert outcome(parse, text) == outcome(parse, text.replace(" ", "\t"))


MODE_TOKENS = ["[always]", "always", "[madvise]", "madvise", "never", "[", "]", "[]", "defer+madvise", "1", "0",
               "[yes]", "no", " ", "\n"]
modes = st.one_of(st.text(max_size=60), st.lists(st.sampled_from(MODE_TOKENS), max_size=6).map(" ".join))


@settings(max_examples=200, deadline=None)
@given(modes)
def test_fuzz_thp_files(text):
    try:
        mode = vm.parse_mode(text, "enabled")
        assert mode and "[" not in mode and "]" not in mode
    except CollectError:
        pass
    try:
        assert vm.parse_flag(text, "khugepaged/defrag") in (True, False)
    except CollectError:
        pass
