"""Transparent huge page settings known to stall applications, and how THP faults fare.

Only vm facts (THP settings, vmstat rates) are needed, so this is a check of its own beside
checks/memory.py: a failing buddyinfo collector never blanks it, and the other way round.

- enabled=always with defrag=always makes every fault that could take a huge page compact memory
  synchronously: a warning as a setting, degraded once compact_stall shows the stalls happening.
- a high share of THP faults falling back to small pages is information: it is what the
  recommended defer/madvise settings choose over stalling, and it points at fragmentation.
Rates exist from the second pass on, so a one-shot `nodehealth check` judges the settings only.
"""
from __future__ import annotations

from nodehealth.model import Action, Finding, Observed, Reason, Severity

NAME = "thp"
NEEDS = ("vm",)
SUBSYSTEM = "memory"
DEBOUNCE = True

DEFAULTS = {
    # Direct compaction stalls per second (vmstat compact_stall) above which enabled=always +
    # defrag=always is degraded, not just risky. nodehealth's choice: hosts with deferred defrag
    # show about none; one per second, sustained over the debounce, means threads keep blocking.
    "compact_stall_per_second": 1.0,
    # Share of THP faults falling back to small pages (thp_fault_fallback over alloc + fallback)
    # above which an info finding is raised. nodehealth's choice: more misses than hits.
    "fallback_ratio": 0.5,
    # Judge the fallback share only when at least this many THP faults per second happened: a few
    # faults make a noisy ratio.
    "min_thp_faults_per_second": 1.0,
}

MEANINGS = {  # what each key means, in docs/configuration.md
    "compact_stall_per_second": ("direct compaction stalls per second above which THP `always`/`always` is degraded "
                                 "rather than a warning"),
    "fallback_ratio": "share of THP faults falling back to small pages above which an info finding is raised",
    "min_thp_faults_per_second": "the fallback share is judged only from this many THP faults per second",
}
SOURCE = "`/sys/kernel/mm/transparent_hugepage`, `/proc/vmstat`"
FINDS = "THP `enabled=always` with `defrag=always` (stalls), compaction stall rate, THP fallback"
REASONS = {
    "ThpCompactionStalls": Reason(Severity.DEGRADED, Action.FIX_CONFIG,
                                  "THP `enabled=always` with `defrag=always` and direct compaction over "
                                  "`compact_stall_per_second` (1/s): page faults stall applications. Set `defrag` "
                                  "to `defer+madvise` or `madvise`"),
    "ThpDefragAlways": Reason(Severity.WARNING, Action.FIX_CONFIG,
                              "THP `enabled=always` with `defrag=always`: page faults compact memory synchronously "
                              "first"),
    "ThpFaultFallbackHigh": Reason(Severity.INFO, Action.NONE,
                                   "over `fallback_ratio` (50 %) of THP faults fell back to 4 KiB pages"),
}

DEFRAG_FIX = ("set 'echo defer+madvise > /sys/kernel/mm/transparent_hugepage/defrag' (or madvise) so that only "
              "regions that ask for huge pages compact at fault time and kcompactd does the rest")


def judge(obs: Observed, cfg: dict) -> list[Finding]:
    findings = []
    settings = stall_finding(obs, cfg)
    if settings is not None:
        findings.append(settings)
    fallback = fallback_finding(obs, cfg)
    if fallback is not None:
        findings.append(fallback)
    return findings


def stall_finding(obs: Observed, cfg: dict) -> Finding | None:
    thp = obs.facts["vm"].thp
    if thp.enabled != "always" or thp.defrag != "always":
        return None
    stalls = obs.rate("vm", "compact_stall")
    evidence = {"enabled": thp.enabled, "defrag": thp.defrag, "compact_stall_per_second": stalls}
    if stalls is not None and stalls > cfg["compact_stall_per_second"]:
        return Finding(
            NAME, Severity.DEGRADED, "ThpCompactionStalls",
            f"Transparent huge pages are enabled=always with defrag=always and processes entered direct "
            f"compaction {stalls:.1f} times per second (threshold {cfg['compact_stall_per_second']:g}): page "
            f"faults are stalling applications while the kernel defragments memory; {DEFRAG_FIX}.",
            action=Action.FIX_CONFIG, evidence=evidence)
    return Finding(
        NAME, Severity.WARNING, "ThpDefragAlways",
        "Transparent huge pages are enabled=always with defrag=always: every page fault that could take a huge "
        f"page compacts memory synchronously first, so threads stall whenever memory is fragmented; {DEFRAG_FIX}.",
        action=Action.FIX_CONFIG, evidence=evidence)


def fallback_finding(obs: Observed, cfg: dict) -> Finding | None:
    allocated = obs.rate("vm", "thp_fault_alloc")
    fell_back = obs.rate("vm", "thp_fault_fallback")
    if allocated is None or fell_back is None:
        return None
    faults = allocated + fell_back
    if faults < cfg["min_thp_faults_per_second"]:
        return None
    ratio = fell_back / faults
    if ratio <= cfg["fallback_ratio"]:
        return None
    return Finding(
        NAME, Severity.INFO, "ThpFaultFallbackHigh",
        f"{ratio:.0%} of transparent huge page faults fell back to 4 KiB pages ({fell_back:.1f} of {faults:.1f} "
        f"per second): free 2 MiB blocks are scarce (see the memory check) or a cgroup memory limit refused the "
        f"charge, so THP-backed memory costs more TLB misses; compacting memory "
        f"('echo 1 > /proc/sys/vm/compact_memory') or reserving hugetlb pages at boot helps.",
        action=Action.NONE,
        evidence={"fallback_ratio": round(ratio, 3), "thp_faults_per_second": faults})
