"""RDMA WRITE bandwidth of the daemon's periodic tests (collectors/rdma_bw.py): slow, broken or untested rails.

Judged on each rail's newest runs, never on a rail that has not been tested (no finding, and no
bandwidth metric: nothing ran, so nothing is called healthy):
- The last test could not run (no device, port down, memlock, no pyverbs, this host's verbs
  objects): unknown, naming the reason. Its peer did not answer: unknown too, since the rail was
  not measured (the peer's daemon may be down or not serving).
- The RDMA path failed (queue pairs would not connect, writes failed or stalled, bytes differed):
  degraded while the failures were against one peer, which may be the peer's fault; fatal once the
  rail failed against `fatal_after_peers` different peers in a row (DLRover's rule: a node that fails
  with two partners is the faulty one).
- Bandwidth: degraded when the last `low_runs` tests in a row measured below `min_fraction` of the
  rail's expected rate. Like is compared with like: the expectation is the configured rate of that
  port, device, HCA model or link layer, else that port's own line rate when its HCA model is known
  (a ConnectX HDR rail against 200 Gb/s, an NDR one against 400). A software device (Soft-RoCE,
  whose speed is the CPU's) has no line rate to compare with and is judged only when configured.
  The peer's rail is half of the path, so the message says "this rail or the peer's" until
  different peers agree.
"""
from __future__ import annotations

from nodehealth.collectors.rdma_bw import OK, RdmaBw, Run
from nodehealth.model import Action, Finding, Observed, Reason, Severity

NAME = "rdma_bw"
NEEDS = ("rdma_bw",)
SUBSYSTEM = "network"
DEBOUNCE = False  # each test is a run of its own; the check counts runs in a row

DEFAULTS: dict = {
    # A healthy rail reaches 96-98 % of its line rate in ib_write_bw at 64 KiB (EDR 96.6, HDR 196.5,
    # NDR 392.3 Gb/s; docs/sources.md, "Reference bandwidths"); Azure's node health checks pass an NDR rail at
    # 360-390 Gb/s, i.e. 0.90-0.975. 0.9 takes their loosest: a rail below it lost a PCIe lane, trained
    # lower, or retransmits, while a busy host's noise stays above it.
    "min_fraction": 0.9,
    # Expected Gb/s by port ("mlx5_0:1"), device ("mlx5_0"), HCA model (hca_type, "MT4129") or link layer
    # ("InfiniBand", "Ethernet"), the first listed; otherwise the port's line rate when its model is known.
    "expected_gbps": {},
    # One slow test can be a peer's busy moment: two in a row on the same rail are a finding.
    "low_runs": 2,
    # A rail whose writes fail against this many different peers in a row is broken (fatal).
    "fatal_after_peers": 2,
}

MEANINGS = {  # what each key means, in docs/configuration.md
    "min_fraction": "a rail below this share of its expected rate is slow",
    "expected_gbps": ("expected Gb/s by port (`mlx5_0:1`), device, HCA model (`MT4129`) or link layer, the first "
                      "listed; else the port's line rate when its model is known"),
    "low_runs": "slow tests in a row on one rail that make `RdmaBandwidthLow`",
    "fatal_after_peers": "different peers in a row a rail's writes must fail against to be fatal",
}
SOURCE = "the daemon's periodic RDMA WRITE tests (`rdma_bw.enabled`)"
FINDS = ("a rail whose last 2 tests wrote below 90 % of its line rate (a known HCA model) or of the rate configured "
         "for its port, device, model or link layer; writes that failed; a test that could not run or whose peer "
         "did not answer")
REASONS = {
    "RdmaBandwidthLow": Reason(Severity.DEGRADED, Action.HW_INSPECTION,
                               "a rail's last `low_runs` (2) tests wrote below `min_fraction` (0.9) of its "
                               "expected rate"),
    "RdmaWriteFailed": Reason((Severity.DEGRADED, Severity.FATAL), Action.HW_INSPECTION,
                              "RDMA writes failed: degraded against one peer, fatal against `fatal_after_peers` "
                              "(2) different peers in a row"),
    "RdmaBwNotRun": Reason(Severity.UNKNOWN, Action.FIX_CONFIG,
                           "the test could not run (no device, port down, memlock, pyverbs missing)"),
    "RdmaBwPeerUnavailable": Reason(Severity.UNKNOWN, Action.NONE,
                                    "no peer took the test: check that the peers' daemons serve `rdma_bw`"),
}


def judge(obs: Observed, cfg: dict) -> list[Finding]:
    facts: RdmaBw = obs.facts["rdma_bw"]
    ib = obs.facts.get("infiniband")
    findings = []
    if facts.error:
        findings.append(Finding(NAME, Severity.UNKNOWN, "RdmaBwNotRun",
                                f"The RDMA bandwidth tests could not run: {facts.error}.", action=Action.FIX_CONFIG))
    for rail in facts.rails:
        runs = [r for r in facts.runs if r.rail == rail]
        if runs:
            findings.extend(_rail(rail, runs, ib, cfg))
    return findings


def _rail(rail: str, runs: list[Run], ib, cfg: dict) -> list[Finding]:
    last = runs[-1]
    evidence = {"peer": last.peer, "stage": last.stage, "time": last.time}
    if last.stage in ("preflight", "setup"):
        return [Finding(NAME, Severity.UNKNOWN, "RdmaBwNotRun",
                        f"The RDMA bandwidth test of {rail} could not run: {last.error}.", device=rail,
                        action=Action.FIX_CONFIG, evidence=evidence)]
    if last.stage == "peer":
        return [Finding(NAME, Severity.UNKNOWN, "RdmaBwPeerUnavailable",
                        f"{rail} was not measured: its peer {last.peer} did not take the test ({last.error}); "
                        "check that the peer's daemon serves rdma_bw.", device=rail, evidence=evidence)]
    # A peer that did not take the test measured nothing: the streaks skip it rather than end at it
    # (a busy peer is tried and passed over in the same round as the peer that measured the rail).
    runs = [r for r in runs if r.stage != "peer"]
    if last.stage != OK:
        failed = _streak(runs, lambda r: r.stage == last.stage)
        peers = sorted({r.peer for r in failed})
        evidence.update(peers=peers, runs=len(failed), error=last.error)
        if len(peers) >= cfg["fatal_after_peers"]:
            return [Finding(NAME, Severity.FATAL, "RdmaWriteFailed",
                            f"RDMA writes on {rail} failed against {len(peers)} different peers in a row "
                            f"({', '.join(peers)}): this rail cannot carry RDMA traffic ({last.error}); check the "
                            "port's counters, the cable and the switch port.", device=rail,
                            action=Action.HW_INSPECTION, evidence=evidence)]
        return [Finding(NAME, Severity.DEGRADED, "RdmaWriteFailed",
                        f"RDMA writes on {rail} to {last.peer} failed ({last.error}): this rail or the peer's "
                        "is broken; a test against another peer tells which.", device=rail,
                        action=Action.HW_INSPECTION, evidence=evidence)]
    expected, basis = _expected(last, ib, cfg["expected_gbps"])
    if expected is None:
        return []
    floor = cfg["min_fraction"] * expected
    low = _streak(runs, lambda r: r.stage == OK and r.bw_avg_gbps is not None and r.bw_avg_gbps < floor)
    if len(low) < cfg["low_runs"]:
        return []
    peers = sorted({r.peer for r in low})
    whose = "this rail" if len(peers) > 1 else f"this rail or {last.peer}'s"
    measured = ", ".join(f"{r.bw_avg_gbps:.3g}" for r in low)
    evidence.update(bw_avg_gbps=[r.bw_avg_gbps for r in low], expected_gbps=expected, basis=basis, peers=peers)
    return [Finding(NAME, Severity.DEGRADED, "RdmaBandwidthLow",
                    f"{rail} wrote at {measured} Gb/s in its last {len(low)} tests (to {', '.join(peers)}), below "
                    f"{cfg['min_fraction']:.0%} of {expected:g} Gb/s ({basis}): {whose} is slow; check its PCIe "
                    "link, error counters, cable and switch port.", device=rail, action=Action.HW_INSPECTION,
                    evidence=evidence)]


def _streak(runs: list[Run], bad) -> list[Run]:
    """The newest runs, in a row, for which `bad` holds."""
    out = []
    for run in reversed(runs):
        if not bad(run):
            break
        out.append(run)
    return out[::-1]


def _expected(run: Run, ib, configured: dict) -> tuple[float | None, str]:
    device = next((d for d in (ib.devices if ib else ()) if d.name == run.device), None)
    port = next((p for p in (device.ports if device else ()) if p.port == run.port), None)
    keys = (run.rail, run.device, device.hca_type if device else None, port.link_layer if port else None)
    for key in keys:
        if key and key in configured:
            return float(configured[key]), f"configured for {key}"
    if device is not None and (device.hca_type or device.board_id) and port is not None and port.rate_gbps:
        return port.rate_gbps, f"the port's line rate, {port.rate_text or 'unknown width'}"
    return None, ""
