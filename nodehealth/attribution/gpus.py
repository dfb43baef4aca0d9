"""Which GPU a finding is about, and which containers were given that GPU: pure functions of plain data.

A GPU is known by its NVML index, UUID and PCI bus id (collectors/gpu_facts.py). The kubelet names
the devices it handed out by the device plugin's ids; the NVIDIA device plugin uses GPU UUIDs
(`GPU-…`), MIG UUIDs (`MIG-…`, or `MIG-GPU-<uuid>/<gi>/<ci>` before driver R470), a replica suffix
`::N` when a GPU is time-sliced, or NVML indices (`3`, `3:1` for a MIG device) with
`--device-id-strategy=index`. An id that looks like a GPU's but matches none here is reported as
unresolved, never dropped: a container we cannot place may be the one that was hit.
"""
from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from nodehealth.collectors.gpu_facts import MigDevice, NvmlFacts
from nodehealth.collectors.kernel_events import canonical_pci
from nodehealth.model import Finding, Report

# Resources whose plain numeric ids are NVML indices (device-id-strategy=index).
NVIDIA_RESOURCE_PREFIX = "nvidia.com/"
MAX_ID_CHARS = 128  # a GPU, MIG or replica id is under 60 characters; longer is not one
SHOWN_ID_CHARS = 64

_UUID = r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
_GPU_UUID = re.compile(rf"GPU-{_UUID}", re.IGNORECASE)
_MIG_UUID = re.compile(rf"MIG-{_UUID}", re.IGNORECASE)
_MIG_LEGACY = re.compile(rf"MIG-(?P<gpu>GPU-{_UUID})/(?P<gi>\d{{1,3}})/(?P<ci>\d{{1,3}})", re.IGNORECASE)
_INDEX = re.compile(r"(?P<gpu>\d{1,3})(?::(?P<mig>\d{1,3}))?")
_REPLICA = re.compile(r"::\d{1,6}$")
_GPU_LABEL = re.compile(r"GPU (\d{1,3})")  # checks' device when NVML gave neither bus id nor UUID


@dataclass(frozen=True)
class GpuRef:
    """One GPU of this node as NVML knows it, with its MIG devices."""

    index: int
    uuid: str | None
    bus_id: str | None  # sysfs spelling, 0000:cb:00.0
    migs: tuple[MigDevice, ...] = ()


@dataclass(frozen=True)
class ContainerDevices:
    """One resource the kubelet gave one container: a row of its PodResources answer."""

    namespace: str
    pod: str
    container: str
    resource: str  # e.g. nvidia.com/gpu, nvidia.com/mig-1g.10gb
    device_ids: tuple[str, ...]


@dataclass(frozen=True, order=True)
class PodRef:
    """A container that holds (part of) a GPU, and the device id it holds it by."""

    namespace: str
    pod: str
    container: str
    device: str

    def to_dict(self) -> dict[str, str]:
        return {"namespace": self.namespace, "pod": self.pod, "container": self.container, "device": self.device}


@dataclass(frozen=True)
class Assignment:
    by_gpu: dict[int, tuple[PodRef, ...]]  # NVML index -> the containers holding it, sorted
    unresolved: tuple[str, ...]  # GPU-like ids that match no GPU here, in answer order
    inferred: tuple[int, ...] = ()  # GPUs placed by elimination: NVML had no UUID for them (lost)


def nvml_facts(report: Report) -> NvmlFacts | None:
    """The NVML facts a report rests on: its nvml collector's, when that succeeded."""
    return next((c.facts for c in report.collectors if c.name == "nvml" and c.success), None)


def gpu_refs(facts: NvmlFacts | None) -> tuple[GpuRef, ...]:
    """The node's GPUs, with their MIG devices, from the NVML facts."""
    if facts is None:
        return ()
    return tuple(GpuRef(g.index, g.uuid, canonical_pci(g.pci_bus_id or "") or None, g.mig_devices)
                 for g in facts.gpus)


def gpu_of(finding: Finding, gpus: Sequence[GpuRef]) -> GpuRef | None:
    """The GPU a finding is about: its device as a bus id, a UUID or "GPU n", else its evidence's UUID."""
    device = (finding.device or "").strip()
    uuid = finding.evidence.get("uuid") if isinstance(finding.evidence.get("uuid"), str) else None
    bus = canonical_pci(device) if device and not device.upper().startswith(("GPU-", "MIG-")) else ""
    label = _GPU_LABEL.fullmatch(device)
    for gpu in gpus:
        if bus and gpu.bus_id == bus:
            return gpu
        if gpu.uuid and gpu.uuid.lower() in (device.lower(), (uuid or "").lower()):
            return gpu
        if label and int(label.group(1)) == gpu.index:
            return gpu
    return None


def assign(entries: Iterable[ContainerDevices], gpus: Sequence[GpuRef]) -> Assignment:
    """Place every GPU-like device id of the kubelet's answer on a GPU of this node."""
    by_uuid: dict[str, int] = {}
    by_index = {g.index: g.index for g in gpus}
    for g in gpus:
        if g.uuid:
            by_uuid[g.uuid.lower()] = g.index
        for mig in g.migs:
            by_uuid[mig.uuid.lower()] = g.index
    placed: dict[int, set[PodRef]] = {}
    pending: list[tuple[str | int, PodRef]] = []  # ids no GPU here matches
    for entry in entries:
        nvidia = entry.resource.startswith(NVIDIA_RESOURCE_PREFIX)
        for raw in entry.device_ids:
            key = _gpu_key(raw, nvidia)
            if key is None:
                continue
            ref = PodRef(entry.namespace, entry.pod, entry.container, raw)
            index = by_uuid.get(key) if isinstance(key, str) else by_index.get(key)
            if index is None:
                pending.append((key, ref))
            else:
                placed.setdefault(index, set()).add(ref)
    inferred = _by_elimination(pending, gpus)
    if inferred is not None:
        placed.setdefault(inferred, set()).update(ref for _, ref in pending)
        pending = []
    unresolved: list[str] = []
    for _, ref in pending:
        shown = ref.device if len(ref.device) <= SHOWN_ID_CHARS else ref.device[:SHOWN_ID_CHARS] + "..."
        if shown not in unresolved:
            unresolved.append(shown)
    return Assignment({i: tuple(sorted(refs)) for i, refs in sorted(placed.items())}, tuple(unresolved),
                      () if inferred is None else (inferred,))


def _by_elimination(pending: list[tuple[str | int, PodRef]], gpus: Sequence[GpuRef]) -> int | None:
    """The GPU that unplaced ids belong to when it can be only one: NVML gives every GPU's UUID but one
    (a GPU that fell off the bus answers nothing), and the ids left over name one and the same GPU UUID.
    The device plugin lists only this node's GPUs, so that UUID is the unnamed GPU's."""
    unnamed = [g.index for g in gpus if not g.uuid]
    keys = {key for key, _ in pending}
    if len(unnamed) != 1 or len(keys) != 1:
        return None
    (key,) = keys
    return unnamed[0] if isinstance(key, str) and key.startswith("gpu-") else None


def _gpu_key(raw: str, nvidia: bool) -> str | int | None:
    """What a device id names: a (lower-case) GPU or MIG UUID, an NVML index, "" for an NVIDIA id that
    is none of these (unresolvable), or None for a device that is not a GPU at all."""
    text = raw.strip()
    if len(text) > MAX_ID_CHARS:
        return "" if nvidia or text.upper().startswith(("GPU-", "MIG-")) else None
    text = _REPLICA.sub("", text)
    legacy = _MIG_LEGACY.fullmatch(text)
    if legacy:
        return legacy.group("gpu").lower()
    if _GPU_UUID.fullmatch(text) or _MIG_UUID.fullmatch(text):
        return text.lower()
    if nvidia:
        index = _INDEX.fullmatch(text)
        return int(index.group("gpu")) if index else ""
    return "" if text.upper().startswith(("GPU-", "MIG-")) else None
