"""NIC and network-stack faults from the kernel log: mlx5 firmware health (heartbeat lost, fatal
syndromes, the device gone from PCIe, command timeouts), NETDEV WATCHDOG transmit timeouts and
unregister_netdevice leaks (docs/sources.md, "Host hardware severities")."""
from __future__ import annotations

from dataclasses import replace

from nodehealth.checks.host_log import Rating, judge_events
from nodehealth.checks.kernel_log import is_saved_log
from nodehealth.collectors.kernel_events import MLX5_HEALTH, NETDEV_UNREGISTER, NETDEV_WATCHDOG, KernelEvent
from nodehealth.model import Action, Finding, Observed, Reason, Severity

NAME = "nic_health"
NEEDS = ("kmsg",)
SUBSYSTEM = "network"
DEBOUNCE = False
DEFAULTS: dict = {
    # Transmit timeouts and unregister waits older than this no longer count; NIC firmware faults count all boot.
    "window_seconds": 86400.0,
    # node-problem-detector's FrequentUnregisterNetDevice: 3 reports (it uses 20 min; the kernel
    # repeats them every 10 s while the reference leaks, so 3 in our window is the same signal).
    "unregister_repeat": 3,
    # NETDEV WATCHDOG reports in the window that make a NIC suspect rather than a passing stall.
    "watchdog_repeat": 3,
}

MEANINGS = {  # what each key means, in docs/configuration.md
    "window_seconds": ("transmit timeouts and unregister waits older than this no longer count; NIC firmware faults "
                       "count all boot"),
    "unregister_repeat": "`unregister_netdevice` reports in the window that make it degraded",
    "watchdog_repeat": "`NETDEV WATCHDOG` reports in the window that make it degraded",
}
SOURCE = "kernel log"
FINDS = ("mlx5 firmware heartbeat lost, fatal health syndromes, the adapter gone from PCIe, firmware command "
         "timeouts (the whole adapter: its rail), `NETDEV WATCHDOG` transmit timeouts (interface and driver), "
         "`unregister_netdevice` waits")
REASONS = {
    "NicFirmwareHeartbeatLost": Reason(Severity.FATAL, Action.REBOOT,
                                       "an mlx5 adapter stopped answering its firmware health checks: every port "
                                       "of the adapter (its rail) is down"),
    "NicOffPcie": Reason(Severity.FATAL, Action.REBOOT, "an mlx5 adapter is no longer reachable on PCIe"),
    "NicFirmwareFatal": Reason(Severity.FATAL, Action.REBOOT,
                               "an mlx5 adapter reported a fatal firmware or hardware error (fatal health syndrome)"),
    "NicCommandTimeout": Reason(Severity.FATAL, Action.REBOOT,
                                "a firmware command to an mlx5 adapter timed out; its control plane is unresponsive"),
    "NetdevTransmitTimeout": Reason((Severity.WARNING, Severity.DEGRADED), Action.HW_INSPECTION,
                                    "an interface stopped transmitting (`NETDEV WATCHDOG`); degraded at "
                                    "`watchdog_repeat` (3)"),
    "NetdevUnregisterStuck": Reason((Severity.WARNING, Severity.DEGRADED), Action.REBOOT,
                                    "the kernel waits for an interface to be released (`unregister_netdevice`); "
                                    "new pod networks may hang behind it; degraded at `unregister_repeat` (3); "
                                    "only a reboot clears it"),
}

# Syndromes of the firmware health buffer that mean the device is lost (health.c): internal FW
# error, irisc not responding, unrecoverable HW, FW CRC, ICM fetch PCI, HW fatal, high temperature.
FATAL_SYNDROMES = frozenset({0x1, 0x7, 0x8, 0x9, 0xA, 0xB, 0x10})
_RAIL = ("every port of this adapter (its rail) is down until the device recovers: drain the node and reboot "
         "it, and have the adapter and its firmware inspected if it happens again")


def judge(obs: Observed, cfg: dict) -> list[Finding]:
    cfg = dict(DEFAULTS, **cfg)
    unregister, watchdog = int(cfg["unregister_repeat"]), int(cfg["watchdog_repeat"])
    ib = obs.facts.get("infiniband")
    # A saved log may come from another host: this host's RDMA devices say nothing about it.
    rails = rails_by_pci(ib.devices) if ib is not None and not is_saved_log(obs) else {}
    return judge_events(NAME, obs, cfg, (MLX5_HEALTH, NETDEV_UNREGISTER, NETDEV_WATCHDOG),
                        lambda e: with_rail(rate(e, unregister, watchdog), e, rails))


def rails_by_pci(devices) -> dict[str, str]:
    """PCI address -> "RDMA device mlx5_3 (ports 1, 2)" for the devices whose PCI function is known."""
    return {d.pci_bus_id: f"RDMA device {d.name} (port{'s' if len(d.ports) != 1 else ''} "
                          f"{', '.join(str(p.port) for p in d.ports) or 'none'})"
            for d in devices if d.pci_bus_id}


def with_rail(rating: Rating | None, e: KernelEvent, rails: dict[str, str]) -> Rating | None:
    pci = e.device if e.kind == MLX5_HEALTH else e.detail.get("pci_bus_id")
    rail = rails.get(str(pci)) if rating is not None and pci else None
    return replace(rating, what=f"{rating.what}, which is {rail}") if rail else rating


def rate(e: KernelEvent, unregister: int, watchdog: int) -> Rating | None:
    d = e.detail
    if e.kind == MLX5_HEALTH:
        problem = d.get("problem")
        if problem == "health_lost":
            return Rating("NicFirmwareHeartbeatLost", Severity.FATAL, Action.REBOOT,
                          f"The mlx5 adapter {e.device} stopped answering its firmware health checks", _RAIL, True)
        if problem == "pci_slot_unavailable":
            return Rating("NicOffPcie", Severity.FATAL, Action.REBOOT,
                          f"The mlx5 adapter {e.device} is no longer reachable on PCIe", _RAIL, True)
        if problem == "fatal_error" or (problem == "syndrome" and d.get("syndrome") in FATAL_SYNDROMES):
            return Rating("NicFirmwareFatal", Severity.FATAL, Action.REBOOT,
                          f"The mlx5 adapter {e.device} reported a fatal firmware or hardware error", _RAIL, True)
        if problem == "command_timeout":
            return Rating("NicCommandTimeout", Severity.FATAL, Action.REBOOT,
                          f"A firmware command to the mlx5 adapter {e.device} timed out",
                          "its control plane is unresponsive and usually loses its heartbeat next; " + _RAIL, True)
        return None  # other syndromes (EQ overruns) are reported with the health dump the check rates
    if e.kind == NETDEV_WATCHDOG:
        driver = d.get("driver") or "its driver"
        reporter = "mlx5e TX timeout" if d.get("reported_by") == "mlx5e" else "NETDEV WATCHDOG"
        return Rating("NetdevTransmitTimeout", Severity.WARNING, Action.HW_INSPECTION,
                      f"Interface {e.device} ({driver}) stopped transmitting ({reporter})",
                      "the NIC, its cable or firmware stalled; check them if it repeats",
                      repeat=watchdog, repeated=Severity.DEGRADED)
    if e.kind == NETDEV_UNREGISTER:
        return Rating("NetdevUnregisterStuck", Severity.WARNING, Action.REBOOT,
                      f"The kernel is waiting for interface {e.device} to be released (unregister_netdevice)",
                      "a leaked reference keeps it, and new pod networks may hang behind it; only a reboot clears it",
                      repeat=unregister, repeated=Severity.DEGRADED)
    return None
