"""One pass over a node, from plain values: which collectors and checks run, the engine that runs
them, the findings with NothingChecked, and the report. `nodehealth check`, `nodehealth slurm`, the
daemon and the dashboard generator all build their pass here, so that they judge alike. The step after
the policy is here too: attribution (the pods and Slurm jobs behind GPU findings), when it is on.

NothingChecked: when no selected check has its sources on this host (a plain host asked only about
InfiniBand, a fixture folder without the files), "no findings" would read as healthy. Instead the
pass has one `unknown` finding saying so, wherever it runs.
"""
from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from nodehealth import registry
from nodehealth.config import UsageError
from nodehealth.engine import Engine
from nodehealth.host import HostPaths, boot_id, hostname
from nodehealth.model import Action, CollectorResult, Finding, Reason, Report, Severity, sort_findings, verdict
from nodehealth.policy import Policy, StateFile

log = logging.getLogger(__name__)
NOTHING_CHECKED = "NothingChecked"
# The pass's own finding, under the check name `nodehealth` (docs/checks.md).
REASONS = {
    NOTHING_CHECKED: Reason(Severity.UNKNOWN, Action.NONE,
                            "no selected check has its source on this host (see "
                            "[troubleshooting](troubleshooting.md#check-or-the-daemon-says-nothingchecked))"),
}


def names(flag: str | None) -> list[str] | None:
    """A flag's comma-separated names (`--only a,b`); None for a flag not given."""
    return None if flag is None else [n.strip() for n in flag.split(",") if n.strip()]


def select(only: Sequence[str], skip: Sequence[str]) -> tuple[list, list]:
    """Collectors and checks to run. A check name selects that check (and the collectors it
    needs); a collector name selects that collector and the checks that read it."""
    known = {m.NAME for m in registry.COLLECTORS} | {m.NAME for m in registry.CHECKS}
    unknown = sorted(set(only) - known) + sorted(set(skip) - known)
    if unknown:
        raise UsageError(f"unknown check or collector: {', '.join(unknown)} "
                         f"(known: {', '.join(sorted(known))})")
    checks = [c for c in registry.CHECKS
              if (not only or c.NAME in only or any(n in only for n in c.NEEDS))
              and c.NAME not in skip and not any(n in skip for n in c.NEEDS)]
    wanted = {n for c in checks for n in c.NEEDS}
    collectors = [m for m in registry.COLLECTORS
                  if (not only or m.NAME in only or m.NAME in wanted) and m.NAME not in skip]
    return collectors, checks


def build_engine(cfg: dict[str, Any], root: str = "/", only: Sequence[str] | None = None,
                 skip: Sequence[str] = ()) -> Engine:
    """The engine for the machine at `root`, running what `only` and `skip` select (`only` None:
    everything). UsageError for an empty `only`, an unknown name, or a root that is no machine."""
    if only is not None and not only:
        raise UsageError("--only needs at least one check or collector name")
    collectors, checks = select(only or (), skip)
    host = HostPaths(root)
    if not os.path.isdir(host.procfs):  # a typo'd or empty root would otherwise judge nothing as healthy
        raise UsageError(f"--root {root}: no proc/ directory there, so it is no machine's root")
    return Engine(collectors, checks, host, cfg, timeout=cfg["daemon"]["collector_timeout_seconds"],
                  clock=host.now)


def node_name(host: HostPaths, given: str | None = None) -> str:
    """The node's name in reports: `given` (--node-name), else $NODE_NAME, else the host's name."""
    return given or os.environ.get("NODE_NAME") or hostname(host)


def nothing_checked(checks: Sequence[Any], results: dict[str, CollectorResult]) -> Finding | None:
    """An `unknown` finding when no selected check had its sources here: "no findings" would read as healthy."""
    if any(all(results.get(n) is not None and results[n].supported for n in c.NEEDS) for c in checks):
        return None
    missing = sorted({n for c in checks for n in c.NEEDS if results.get(n) is not None})
    daemon_only = sorted({n for c in checks for n in c.NEEDS if results.get(n) is None})  # e.g. rdma_bw's tests
    why = "; ".join([f"{n}: {results[n].error}" for n in missing]
                    + [f"{n}: only the daemon runs it" for n in daemon_only]) or "no check was selected"
    return Finding("nodehealth", Severity.UNKNOWN, NOTHING_CHECKED,
                   f"Nothing was checked: no selected check has its source on this host ({why}).")


def judge(engine: Engine, results: dict[str, CollectorResult], rates: dict[str, dict[str, float]], now: float,
          checks: Sequence[Any] | None = None) -> list[Finding]:
    """The findings of `checks` (default: all of the engine's) on `results`, and NothingChecked when
    none of the engine's checks has its sources in `results`."""
    findings = engine.judge(results, rates, now, checks)
    return findings + [f for f in [nothing_checked(engine.checks, results)] if f is not None]


def silenced(findings: list[Finding], state_dir: str, cfg: dict[str, Any]) -> list[Finding]:
    """The findings with those the state directory's silences cover marked (a silence file that cannot
    be read is said once on stderr and silences nothing)."""
    import time

    from nodehealth.silences import FILE

    if not os.path.lexists(os.path.join(state_dir, FILE)):
        return findings  # the common case: no silence, and nothing more to import
    from nodehealth.silences import silence, store

    now = time.time()  # silences end on the operator's clock, even on a replayed machine
    silences, problems = store.load(state_dir, cfg["max_silences"], now, cfg["max_seconds"])
    for problem in problems:
        log.warning("silence refused: %s", problem)
    return silence.apply(findings, silences, now)[0]


def run(engine: Engine, cfg: dict[str, Any], node: str, state_dir: str | None = None, read_state: bool = True,
        fail_on_warning: bool = False) -> Report:
    """One pass and its verdict, as `check` prints it and `slurm` acts on it.

    One pass has nothing to debounce with; the daemon's state file (`state_dir`, by default the
    configured one on a live host) still contributes the sticky faults it recorded this boot, unless
    `read_state` is off (a saved kernel log is another node's story, not this host's); so do the
    operator's silences stored there.
    """
    host = engine.host
    results = engine.collect()
    now = engine.clock()
    findings = judge(engine, results, engine.rates(results, now), now)
    policy = Policy(cfg["policy"], (), boot_id(host), debounce=False)
    state_dir = state_dir or (cfg["daemon"]["state_dir"] if host.is_live else None)
    if state_dir and read_state:
        policy.restore(StateFile(state_dir).load(read_only=True))
    selected = {c.NAME for c in engine.checks}
    findings = policy.apply(findings, host.now()) + [f for f in policy.sticky_findings() if f.check in selected]
    if state_dir and read_state:
        findings = silenced(findings, state_dir, cfg["silences"])
    status = verdict(findings, fail_on_warning=fail_on_warning)
    report = Report(node, status, sort_findings(findings), list(results.values()), host.now())
    return attribute(attributor(cfg, host), report)


def attributor(cfg: dict[str, Any], host: HostPaths) -> Any:
    """The Attributor of a daemon or of one pass when attribution.enabled, else None. Its scontrol tries
    once: a drain may wait out a restarting slurmctld (slurm.attempts), a pass must not."""
    if not cfg["attribution"]["enabled"]:
        return None
    from nodehealth.attribution.attributor import Attributor
    from nodehealth.slurm.scontrol import Scontrol, slurm_node_name

    scontrol = None
    if "slurm" in cfg["attribution"]["sources"]:
        scontrol = Scontrol(dict(cfg["slurm"], attempts=1)).run
    return Attributor(cfg["attribution"], host, slurm_node_name(cfg["slurm"]["node_name"]), scontrol)


def attribute(attributor: Any, report: Report, ask: bool = True) -> Report:
    """The report with the pods and Slurm jobs behind its GPU findings, after the policy and before the
    faces. Its verdict stays: attribution adds evidence and `info` findings, never a problem. Without
    `ask`, the sources are not asked (nodehealth/attribution/attributor.py)."""
    if attributor is None:
        return report
    from nodehealth.attribution.gpus import nvml_facts

    findings = attributor.annotate(report.findings, nvml_facts(report), report.time, ask=ask)
    return replace(report, findings=sort_findings(findings))
