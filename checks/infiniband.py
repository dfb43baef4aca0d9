"""InfiniBand/RoCE ports: down or disabled rails, links that trained to a lower rate, error counters.

Severities, and why:
- A down InfiniBand port is fatal. On a rail-optimised training node every GPU has its own rail:
  with one rail down, multi-node jobs either fail at NCCL init or route that GPU's traffic through
  another rail and run at the pace of the slowest link (gpud and aznhc fail the node for it too).
  A down Ethernet (RoCE) port is degraded unless listed in required_ports: on GPU nodes these are
  often storage or front-end ports; a fleet that runs its compute fabric over RoCE lists them.
  The finding uses no sticky action: it clears when the port comes back (flaps are counted by
  the link_downed rule), so switch maintenance does not quarantine nodes until their next reboot.
- An uncabled or administratively disabled port is not a fault: ignore_ports skips ports, and a
  Disabled port is info unless required.
- Counter thresholds are NVSentinel's (docs/sources.md, "InfiniBand counter thresholds"). Its
  fatal tier becomes degraded here:
  those counters describe a link that still carries traffic, only worse (retransmits, stalls), so
  the node should be drained of new work and inspected (PreferNoSchedule), not declared unusable;
  a link that actually drops is caught by the state rule. Its non-fatal tier becomes warning.
"""
from __future__ import annotations

from nodehealth.collectors.infiniband import (
    PHYS_STATE_DISABLED,
    PHYS_STATE_LINK_UP,
    STATE_ACTIVE,
    Device,
    Port,
    counter_key,
    hw_counter_key,
)
from nodehealth.model import Action, Finding, Observed, Reason, Severity

NAME = "infiniband"
NEEDS = ("infiniband",)
SUBSYSTEM = "network"
DEBOUNCE = True

DEFAULTS: dict = {
    # "dev" or "dev:port" names that are never judged (e.g. the uncabled second port of a card).
    "ignore_ports": [],
    # "dev" or "dev:port" names that must exist and be up: a missing one is fatal, and a Disabled
    # or Ethernet one is judged like a down InfiniBand port.
    "required_ports": [],
    # Expected rate in Gb/s by port ("mlx5_8:1"), device ("mlx5_8") or link layer ("InfiniBand",
    # "Ethernet"), the first that is listed. A port with none expects the highest rate among the
    # ACTIVE ports of the same HCA model (hca_type and board_id) and link layer, so one rail that
    # trained to HDR on an NDR node stands out, while a slower card of another model (a CX-6 for
    # storage beside CX-7 rails) is never compared with it; a device whose model is unknown is
    # compared only with its own ports.
    "expected_rate_gbps": {},
    # NVSentinel fatal tier (degraded here): symbol errors above 120 per hour exceed the 1e-12
    # bit error rate the link is specified for. Its non-fatal tier (> 10 per second) lies inside it.
    "symbol_errors_per_hour": 120.0,
    # NVSentinel non-fatal tier (warning here).
    "link_error_recoveries_per_minute": 5.0,
    "receive_errors_per_second": 10.0,
    "transmit_discards_per_second": 100.0,
    "local_ack_timeouts_per_second": 1.0,
}

MEANINGS = {  # what each key means, in docs/configuration.md
    "ignore_ports": "`dev` or `dev:port` names never judged (e.g. the uncabled second port of a card)",
    "required_ports": ("`dev` or `dev:port` names that must exist and be up: missing is fatal; Disabled or Ethernet "
                       "ones are judged like a down InfiniBand port"),
    "expected_rate_gbps": ("expected Gb/s by port (`mlx5_8:1`), device (`mlx5_8`) or link layer (`InfiniBand`, "
                           "`Ethernet`), the first listed; unlisted ports expect the best rate among the ACTIVE "
                           "ports of the same HCA model and link layer"),
    "symbol_errors_per_hour": "symbol errors per hour above which a port is degraded",
    "link_error_recoveries_per_minute": "retrains per minute above which a port gets a warning",
    "receive_errors_per_second": "receive errors per second above which a port gets a warning",
    "transmit_discards_per_second": "transmit discards per second above which a port gets a warning",
    "local_ack_timeouts_per_second": "local ack timeouts per second above which a port gets a warning",
}
SOURCE = "`/sys/class/infiniband`"
FINDS = ("ports not ACTIVE/LinkUp, rates below the node's other ports of the same HCA model and link layer (or the "
         "rate configured per port, device or link layer), error counters as rates (NVSentinel's thresholds), link "
         "downs")
REASONS = {
    "PortMissing": Reason(Severity.FATAL, Action.NONE,
                          "a port in `required_ports` does not exist (driver not loaded, card failed or not seated)"),
    "PortDown": Reason((Severity.FATAL, Severity.DEGRADED), Action.NONE,
                       "a port is not ACTIVE/LinkUp. Fatal for InfiniBand and for `required_ports`, degraded for "
                       "other Ethernet (RoCE) ports. It clears when the port comes back"),
    "PortDisabled": Reason(Severity.INFO, Action.NONE, "a port is administratively disabled (and not required)"),
    "PortStateUnknown": Reason(Severity.UNKNOWN, Action.NONE, "the port's state could not be read"),
    "PortRateDegraded": Reason(Severity.DEGRADED, Action.HW_INSPECTION,
                               "a port trained below the expected rate (`expected_rate_gbps`, else the best port "
                               "of the same HCA model and link layer)"),
    "LinkDowned": Reason(Severity.DEGRADED, Action.HW_INSPECTION,
                         "the `link_downed` counter increased (a counter event)"),
    "ExcessiveBufferOverrun": Reason(Severity.DEGRADED, Action.HW_INSPECTION,
                                     "the receive buffers overran (a counter event)"),
    "LocalLinkIntegrityErrors": Reason(Severity.DEGRADED, Action.HW_INSPECTION,
                                       "the local physical error threshold was exceeded (a counter event)"),
    "SymbolErrors": Reason(Severity.DEGRADED, Action.HW_INSPECTION,
                           "symbol errors over `symbol_errors_per_hour` (120)"),
    "LinkErrorRecovery": Reason(Severity.WARNING, Action.HW_INSPECTION,
                                "retrains over `link_error_recoveries_per_minute` (5)"),
    "ReceiveErrors": Reason(Severity.WARNING, Action.HW_INSPECTION,
                            "bad received packets over `receive_errors_per_second` (10)"),
    "TransmitDiscards": Reason(Severity.WARNING, Action.HW_INSPECTION,
                               "discarded outbound packets over `transmit_discards_per_second` (100)"),
    "LocalAckTimeouts": Reason(Severity.WARNING, Action.HW_INSPECTION,
                               "transport ack timeouts over `local_ack_timeouts_per_second` (1)"),
}

# Counters that NVSentinel treats as fatal at any increase (degraded here, see the module doc).
ANY_INCREASE = (
    ("link_downed", "LinkDowned",
     "went down and came back ({rate} per hour): the jobs using this rail saw errors or timeouts; "
     "check the cable, transceiver and switch port"),
    ("excessive_buffer_overrun_errors", "ExcessiveBufferOverrun",
     "overran its receive buffers ({rate} per hour), so packets were dropped and retransmitted; "
     "check the link partner's flow-control (credit) configuration, then the cable"),
    ("local_link_integrity_errors", "LocalLinkIntegrityErrors",
     "exceeded its physical error threshold ({rate} per hour): the link is unreliable; "
     "check the cable and transceiver and reseat them"),
)

# One increase is the whole event: the policy raises these at once and holds them for a while
# instead of waiting for repeated bad passes.
EVENT_REASONS = frozenset(reason for _, reason, _ in ANY_INCREASE)


def judge(obs: Observed, cfg: dict) -> list[Finding]:
    ports = obs.facts["infiniband"].ports
    ignored = set(cfg["ignore_ports"])
    required = set(cfg["required_ports"])
    judged = [p for p in ports if not _listed(p, ignored)]
    findings = _missing(ports, required)
    for port in judged:
        findings.extend(_state(port, _listed(port, required)))
    findings.extend(_rates(obs.facts["infiniband"].devices, ignored, cfg["expected_rate_gbps"]))
    for port in judged:
        findings.extend(_counters(port, obs, cfg))
    return findings


def _listed(port: Port, names: set[str]) -> bool:
    return port.device in names or port.name in names


def _missing(ports: tuple[Port, ...], required: set[str]) -> list[Finding]:
    present = {p.name for p in ports} | {p.device for p in ports}
    return [Finding(
        NAME, Severity.FATAL, "PortMissing",
        f"Required port {name} does not exist on this node: the HCA is missing from /sys/class/infiniband "
        "(driver not loaded, card failed or not seated); check 'dmesg' for mlx5 errors and the card.",
        device=name, action=Action.NONE) for name in sorted(required - present)]


def _state(port: Port, required: bool) -> list[Finding]:
    if port.state_id is None or port.phys_state_id is None:
        return [Finding(
            NAME, Severity.UNKNOWN, "PortStateUnknown",
            f"Could not read the state of {port.name} (state {port.state!r}, physical state {port.phys_state!r}).",
            device=port.name)]
    if port.state_id == STATE_ACTIVE and port.phys_state_id == PHYS_STATE_LINK_UP:
        return []
    evidence = {"state": port.state, "state_id": port.state_id, "phys_state": port.phys_state,
                "phys_state_id": port.phys_state_id, "link_layer": port.link_layer}
    if port.phys_state_id == PHYS_STATE_DISABLED and not required:
        return [Finding(
            NAME, Severity.INFO, "PortDisabled",
            f"{port.name} is administratively disabled (state {port.state}); list it in required_ports "
            "if this node needs it.", device=port.name, evidence=evidence)]
    fatal = required or port.link_layer == "InfiniBand"
    return [Finding(
        NAME, Severity.FATAL if fatal else Severity.DEGRADED, "PortDown",
        f"{port.name} ({port.link_layer or 'unknown link layer'}) is {port.state} with physical state "
        f"{port.phys_state}: {_why_down(port)}",
        device=port.name, action=Action.NONE, evidence=evidence)]


def _why_down(port: Port) -> str:
    if port.phys_state_id == PHYS_STATE_LINK_UP:
        return ("the link is up but no subnet manager activated the port, so it carries no traffic; "
                "check the subnet manager and the switch port's partition.")
    return ("the rail carries no traffic, so multi-node jobs on this node fail or slow down; "
            "check the cable, transceiver and switch port (ignore_ports if it is meant to be unused).")


def _peers(device: Device, port: Port) -> tuple:
    """Ports whose rates are comparable: the same HCA model and link layer (else the same device)."""
    if device.hca_type or device.board_id:
        return port.link_layer, "model", device.hca_type, device.board_id
    return port.link_layer, "device", device.name


def _rates(devices: tuple[Device, ...], ignored: set[str], expected: dict) -> list[Finding]:
    active = [(d, p) for d in devices for p in d.ports
              if not _listed(p, ignored) and p.state_id == STATE_ACTIVE and p.rate_gbps is not None]
    best: dict[tuple, float] = {}
    for d, p in active:
        best[_peers(d, p)] = max(best.get(_peers(d, p), 0.0), p.rate_gbps)
    findings = []
    for d, p in active:
        want = next((expected[k] for k in (p.name, p.device, p.link_layer) if k in expected), None)
        want = best[_peers(d, p)] if want is None else float(want)
        if p.rate_gbps < want:
            findings.append(Finding(
                NAME, Severity.DEGRADED, "PortRateDegraded",
                f"{p.name} runs at {p.rate_gbps:g} Gb/s ({p.rate_text or 'unknown width'}) instead of {want:g} Gb/s: "
                f"collectives that use this rail run at {p.rate_gbps / want:.0%} of its speed; check the cable and "
                "transceiver and reseat them, then the switch port's speed setting.",
                device=p.name, action=Action.HW_INSPECTION,
                evidence={"rate_gbps": p.rate_gbps, "expected_gbps": want, "rate": p.rate_text}))
    return findings


def _counters(port: Port, obs: Observed, cfg: dict) -> list[Finding]:
    prefix = counter_key(port, "")  # once a port, not once a counter

    def rate(name: str) -> float | None:
        return obs.rate("infiniband", prefix + name)

    findings = []
    for counter, reason, what in ANY_INCREASE:
        per_second = rate(counter)
        if per_second:
            findings.append(_finding(port, Severity.DEGRADED, reason, what.format(rate=f"{per_second * 3600:.3g}"),
                                     counter, per_second))
    symbols = rate("symbol_error")
    if symbols and symbols * 3600 > cfg["symbol_errors_per_hour"]:
        findings.append(_finding(
            port, Severity.DEGRADED, "SymbolErrors",
            f"sees {symbols * 3600:.3g} symbol errors per hour, above {cfg['symbol_errors_per_hour']:g} (a bit "
            "error rate above the 1e-12 the link is specified for): packets are corrupted and retransmitted; "
            "check the cable and transceiver and reseat them", "symbol_error", symbols))
    recoveries = rate("link_error_recovery")
    if recoveries and recoveries * 60 > cfg["link_error_recoveries_per_minute"]:
        findings.append(_finding(
            port, Severity.WARNING, "LinkErrorRecovery",
            f"retrained {recoveries * 60:.3g} times per minute, above {cfg['link_error_recoveries_per_minute']:g}: "
            "each retrain stalls traffic briefly; check the cable and transceiver", "link_error_recovery", recoveries))
    findings.extend(_per_second(port, Severity.WARNING, "ReceiveErrors", rate("port_rcv_errors"),
                                cfg["receive_errors_per_second"], "port_rcv_errors",
                                "received {rate} bad packets per second, above {limit:g}: they are dropped and "
                                "resent; check the cable, transceiver and the link partner"))
    findings.extend(_per_second(port, Severity.WARNING, "TransmitDiscards", rate("port_xmit_discards"),
                                cfg["transmit_discards_per_second"], "port_xmit_discards",
                                "discarded {rate} outbound packets per second, above {limit:g}: the fabric is "
                                "congested or the link went down under traffic; check the switch port"))
    # The NVSentinel hw counters. rnr_nak_retry_err is fatal there, but it counts a peer whose
    # application did not post receive buffers in time, an application fault more often than
    # this node's, so it is not judged here. local_ack_timeout_err is transport retries.
    findings.extend(_per_second(port, Severity.WARNING, "LocalAckTimeouts",
                                obs.rate("infiniband", hw_counter_key(port, "local_ack_timeout_err")),
                                cfg["local_ack_timeouts_per_second"], "local_ack_timeout_err",
                                "timed out waiting for {rate} acknowledgements per second, above {limit:g}: "
                                "transfers are retried and slow down; check the path to the peers"))
    return findings


def _per_second(port: Port, severity: Severity, reason: str, per_second: float | None, limit: float,
                counter: str, what: str) -> list[Finding]:
    if not per_second or per_second <= limit:
        return []
    return [_finding(port, severity, reason, what.format(rate=f"{per_second:.3g}", limit=limit), counter, per_second)]


def _finding(port: Port, severity: Severity, reason: str, what: str, counter: str, per_second: float) -> Finding:
    return Finding(NAME, severity, reason, f"{port.name} {what}.", device=port.name, action=Action.HW_INSPECTION,
                   evidence={"counter": counter, "per_second": per_second})
