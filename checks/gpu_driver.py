"""The NVIDIA driver and the GPUs it manages: NVML down, GPUs lost or missing, a driver too old.

These are the faults that leave a GPU unusable whatever its health counters say. The PCI bus
(the pcie collector's facts, when present) tells how many NVIDIA GPUs the host has, so a GPU the
driver never brought up shows as missing instead of silently absent.
"""
from __future__ import annotations

from nodehealth.checks.gpu_sku import GpuSku, device_of, match_sku
from nodehealth.collectors.gpu_facts import Gpu, NvmlFacts
from nodehealth.model import Action, Finding, Observed, Reason, Severity

NAME = "gpu_driver"
NEEDS = ("nvml",)
SUBSYSTEM = "gpu"
DEBOUNCE = False
DEFAULTS: dict = {
    # PCI addresses (0000:19:00.0) of NVIDIA GPUs that NVML is not meant to see, e.g. GPUs bound to
    # vfio-pci and passed through to virtual machines.
    "ignore_devices": [],
}

MEANINGS = {  # what each key means, in docs/configuration.md
    "ignore_devices": ("PCI addresses of NVIDIA GPUs NVML is not meant to see, e.g. GPUs bound to vfio-pci for "
                       "virtual machines"),
}
SOURCE = "NVML, sysfs"
FINDS = ("NVML that cannot start while NVIDIA GPUs are on the bus, fewer GPUs in NVML than in sysfs, lost GPUs "
         "(GpuIsLost), GPUs that need a reset, a driver older than the GPU's architecture needs, NVML calls an old "
         "driver lacks")
REASONS = {
    "NvmlInitFailed": Reason((Severity.FATAL, Severity.UNKNOWN), (Action.REBOOT, Action.NONE),
                             "NVML did not start while the PCI bus shows NVIDIA GPUs (fatal); unknown when the PCI "
                             "facts are missing too"),
    "NvmlLibraryNotFound": Reason(Severity.UNKNOWN, Action.FIX_CONFIG,
                                  "`libnvidia-ml.so.1` was not found: no driver, or a container started without "
                                  "the NVIDIA runtime"),
    "GpusMissing": Reason(Severity.FATAL, Action.REBOOT, "NVML sees fewer GPUs than the PCI bus shows"),
    "GpuLost": Reason(Severity.FATAL, Action.REBOOT, "NVML says the GPU is lost (GpuIsLost): it fell off the bus"),
    "GpuResetRequired": Reason(Severity.FATAL, Action.RESET_GPU,
                               "NVML says the GPU needs a reset before it can run work"),
    "DriverTooOld": Reason(Severity.FATAL, Action.FIX_CONFIG,
                           "the driver is older than the minimum the GPU's SKU needs"),
    "NvmlFunctionsMissing": Reason(Severity.INFO, Action.NONE,
                                   "the driver lacks NVML calls nodehealth uses; their facts are not judged"),
}


def judge(obs: Observed, cfg: dict) -> list[Finding]:
    facts: NvmlFacts = obs.facts["nvml"]
    on_bus = _gpus_on_bus(obs, cfg["ignore_devices"])
    if facts.init_error:
        return _init_failed(facts.init_error, on_bus)
    findings = _missing_gpus(facts, on_bus) + _driver_version(facts)
    for gpu in facts.gpus:
        findings += _gpu_state(gpu)
    if facts.missing_functions:
        findings.append(Finding(
            NAME, Severity.INFO, "NvmlFunctionsMissing",
            f"The NVIDIA driver {facts.driver_version or '(version unknown)'} lacks NVML calls nodehealth uses "
            f"({', '.join(sorted(facts.missing_functions))}): the facts they give are not judged, or come from "
            "older calls; a newer driver brings them.",
            evidence={"functions": sorted(facts.missing_functions)}))
    return findings


def _gpus_on_bus(obs: Observed, ignored: list) -> list[str] | None:
    """Addresses of the NVIDIA GPUs on the PCI bus; None when the pcie collector gave no facts."""
    pcie = obs.facts.get("pcie")
    if pcie is None:
        return None
    skip = {str(a).lower() for a in ignored}
    return sorted(d.address.lower() for d in pcie.devices if d.kind == "gpu" and d.address.lower() not in skip)


def _init_failed(error: str, on_bus: list[str] | None) -> list[Finding]:
    if on_bus == []:
        return []  # no NVIDIA GPU on the bus: nothing for NVML to manage
    if error == "LibraryNotFound":
        # Either the host has no driver or nodehealth runs without its library (a container started
        # without the NVIDIA runtime). A deployment fault must not take every GPU node out of service.
        return [Finding(
            NAME, Severity.UNKNOWN, "NvmlLibraryNotFound",
            "Could not judge the GPUs: the NVML library (libnvidia-ml.so.1) was not found; install the NVIDIA "
            "driver, or run nodehealth with the NVIDIA container runtime so that the library is mounted.",
            action=Action.FIX_CONFIG, evidence={"error": error, "gpus_on_bus": on_bus})]
    if on_bus is None:
        return [Finding(
            NAME, Severity.UNKNOWN, "NvmlInitFailed",
            f"Could not judge the GPUs: NVML did not start ({error}) and without the PCI bus facts nodehealth "
            "cannot tell whether this host has NVIDIA GPUs.",
            evidence={"error": error})]
    return [Finding(
        NAME, Severity.FATAL, "NvmlInitFailed",
        f"NVML did not start ({error}) although the PCI bus shows {len(on_bus)} NVIDIA GPU(s) "
        f"({_addresses(on_bus)}): the driver is not loaded, does not match its library, or is wedged, and no GPU "
        "work can run; drain the node, check 'nvidia-smi' and the kernel log, and reboot it.",
        action=Action.REBOOT, evidence={"error": error, "gpus_on_bus": on_bus})]


def _missing_gpus(facts: NvmlFacts, on_bus: list[str] | None) -> list[Finding]:
    if on_bus is None or facts.device_count is None or facts.device_count >= len(on_bus):
        return []
    seen = {g.pci_bus_id.lower() for g in facts.gpus if g.pci_bus_id}
    missing = [a for a in on_bus if a not in seen] if seen else []
    named = f" (not in NVML: {_addresses(missing)})" if missing else ""
    return [Finding(
        NAME, Severity.FATAL, "GpusMissing",
        f"NVML sees {facts.device_count} GPU(s) but the PCI bus shows {len(on_bus)} NVIDIA GPU(s){named}: the "
        "driver did not bring them all up (look for RmInitAdapter or Xid 79 in the kernel log), so jobs get fewer "
        "GPUs than the node offers; drain the node and reboot it, and have the GPU inspected if it stays missing.",
        action=Action.REBOOT,
        evidence={"nvml_count": facts.device_count, "pci_count": len(on_bus), "missing": missing})]


def parse_version(text: str | None) -> tuple[int, ...] | None:
    """`535.154.05` -> (535, 154, 5); anything else -> None."""
    parts = (text or "").strip().split(".")
    if not all(p.isascii() and p.isdigit() for p in parts):
        return None
    return tuple(int(p) for p in parts)


def _show_version(version: tuple[int, ...]) -> str:
    """(520,) -> `R520`; (570, 133, 20) -> `570.133.20`."""
    return f"R{version[0]}" if len(version) == 1 else ".".join(map(str, version))


def _driver_version(facts: NvmlFacts) -> list[Finding]:
    version = parse_version(facts.driver_version)
    if version is None:
        return []
    behind: list[tuple[Gpu, GpuSku]] = []
    for gpu in facts.gpus:
        sku = match_sku(gpu.name)
        if sku is not None and sku.min_driver is not None and version < sku.min_driver:
            behind.append((gpu, sku))
    if not behind:
        return []
    minimum = max(sku.min_driver for _, sku in behind if sku.min_driver is not None)
    products = sorted({sku.name for _, sku in behind})
    indexes = ", ".join(str(gpu.index) for gpu, _ in behind)
    return [Finding(
        NAME, Severity.FATAL, "DriverTooOld",
        f"The NVIDIA driver {facts.driver_version} is older than {_show_version(minimum)}, which the "
        f"{', '.join(products)} GPU(s) here need (GPU {indexes}): the driver does not "
        f"fully support them; install {_show_version(minimum)} or later.",
        action=Action.FIX_CONFIG,
        evidence={"driver_version": facts.driver_version, "minimum": _show_version(minimum), "products": products})]


def _gpu_state(gpu: Gpu) -> list[Finding]:
    if gpu.lost:
        return [Finding(
            NAME, Severity.FATAL, "GpuLost",
            f"{gpu.label} is lost to the driver (NVML GpuIsLost): it fell off the bus or stopped answering and "
            "nothing can run on it; drain the node and reboot it (power-cycle it if the GPU does not come back), "
            "and have it inspected if it happens again.",
            device=device_of(gpu), action=Action.REBOOT, evidence={"uuid": gpu.uuid})]
    if gpu.reset_required:
        return [Finding(
            NAME, Severity.FATAL, "GpuResetRequired",
            f"{gpu.label} needs a reset before it can run work again (NVML ResetRequired); drain its work and reset "
            "it (nvidia-smi -r), and reboot if the reset fails.",
            device=device_of(gpu), action=Action.RESET_GPU, evidence={"uuid": gpu.uuid})]
    return []


def _addresses(addresses: list[str], most: int = 8) -> str:
    shown = ", ".join(addresses[:most])
    return shown + (f" and {len(addresses) - most} more" if len(addresses) > most else "")
