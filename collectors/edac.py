"""Memory error counters of the EDAC subsystem: /sys/devices/system/edac/mc/mc*/ and their DIMMs.

Both layouts of Documentation/admin-guide/ras.rst: dimmN/ (or rankN/), and the legacy csrowN/,
whose channels count corrected errors (chK_ce_count) but whose uncorrected ones are counted per
row only (csrowN/ue_count). A counter that cannot be read is absent (None), never 0: a DIMM
without counters is not a DIMM without errors. Counters restart at boot (and at a write to
reset_counters).
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass

from nodehealth.collectors import require_sysfs
from nodehealth.host import HostPaths, list_dir, read_attr
from nodehealth.model import Metric

NAME = "edac"
DEFAULTS: dict = {}

_MC = re.compile(r"mc\d{1,4}\Z")
_DIMM = re.compile(r"(?:dimm|rank)\d{1,5}\Z")
_CSROW = re.compile(r"csrow\d{1,5}\Z")
_CHANNEL_CE = re.compile(r"ch(\d{1,3})_ce_count\Z")
MAX_DIMMS = 1024  # per controller; a bounded label set for metrics


@dataclass(frozen=True)
class Dimm:
    name: str  # dimm0, rank3, or csrow0/ch1 on the legacy layout
    label: str  # the DIMM's label (dimm_label / chK_dimm_label), "" when unset
    location: str
    ce_count: int | None
    ue_count: int | None


@dataclass(frozen=True)
class Csrow:
    """A legacy chip-select row: it spans one DIMM (rank) per channel, so an error counted per row is on one of them."""

    name: str  # csrow2
    ce_count: int | None
    ue_count: int | None
    labels: tuple[str, ...]  # its channels' DIMM labels (chK_dimm_label), "" where unset


@dataclass(frozen=True)
class MemoryController:
    name: str  # mc0
    mc_name: str  # the driver's name for it: "Intel_10nm Socket#0 IMC#0"
    ce_count: int | None
    ue_count: int | None
    ce_noinfo_count: int | None
    ue_noinfo_count: int | None
    dimms: tuple[Dimm, ...]
    csrows: tuple[Csrow, ...] = ()  # the legacy layout only (its channels are in `dimms`)


@dataclass(frozen=True)
class Edac:
    controllers: tuple[MemoryController, ...]


def _root(host: HostPaths) -> str:
    return host.sys("devices", "system", "edac", "mc")


def supported(host: HostPaths, cfg: dict) -> str | None:
    if host.sysfs_missing():
        return None  # collect() says why: unknown, not absent
    if not os.path.isdir(_root(host)) or not any(_MC.match(n) for n in list_dir(_root(host))):
        return ("no EDAC memory controllers (no EDAC driver for this platform, or firmware-first error "
                "reporting: memory errors then appear only as APEI/CPER records in the kernel log)")
    return None


def _int(path: str) -> int | None:
    text = read_attr(path)
    if text is None or not text.strip().isdigit() or len(text.strip()) > 20:
        return None
    return int(text.strip())


def _text(path: str) -> str:
    return (read_attr(path) or "").strip()[:120]


def collect(host: HostPaths, cfg: dict) -> Edac:
    require_sysfs(host)
    controllers = []
    root = _root(host)
    for name in sorted((n for n in list_dir(root) if _MC.match(n)), key=lambda n: int(n[2:])):
        mc = os.path.join(root, name)
        entries = sorted(list_dir(mc))
        dimms = [_dimm(os.path.join(mc, n), n) for n in entries if _DIMM.match(n)]
        csrows: list[Csrow] = []
        if not dimms:  # the legacy csrow layout: one entry per csrow and channel
            for row in sorted((n for n in entries if _CSROW.match(n)), key=lambda n: int(n[5:])):
                channels = _channels(os.path.join(mc, row), row)
                dimms.extend(channels)
                csrows.append(Csrow(row, _int(os.path.join(mc, row, "ce_count")),
                                    _int(os.path.join(mc, row, "ue_count")), tuple(c.label for c in channels)))
        controllers.append(MemoryController(
            name, _text(os.path.join(mc, "mc_name")), _int(os.path.join(mc, "ce_count")),
            _int(os.path.join(mc, "ue_count")), _int(os.path.join(mc, "ce_noinfo_count")),
            _int(os.path.join(mc, "ue_noinfo_count")), tuple(dimms[:MAX_DIMMS]), tuple(csrows[:MAX_DIMMS])))
    return Edac(tuple(controllers))


def _dimm(path: str, name: str) -> Dimm:
    return Dimm(name, _text(os.path.join(path, "dimm_label")), _text(os.path.join(path, "dimm_location")),
                _int(os.path.join(path, "dimm_ce_count")), _int(os.path.join(path, "dimm_ue_count")))


def _channels(path: str, row: str) -> list[Dimm]:
    channels = []
    for entry in sorted(list_dir(path), key=lambda n: (len(n), n)):
        m = _CHANNEL_CE.match(entry)
        if m:
            ch = m.group(1)
            channels.append(Dimm(f"{row}/ch{ch}", _text(os.path.join(path, f"ch{ch}_dimm_label")),
                                 f"{row} channel {ch}", _int(os.path.join(path, entry)),
                                 None))  # the legacy layout counts UEs per csrow only (Csrow.ue_count)
    return channels


def metrics(facts: Edac) -> list[Metric]:
    mc = Metric("nodehealth_edac_errors_total", "EDAC memory errors since boot, by memory controller and type "
                "(corrected, uncorrected); absent where the counter cannot be read.", "counter",
                labels=("controller", "type"))
    dimm = Metric("nodehealth_edac_dimm_errors_total",
                  "EDAC memory errors since boot, by DIMM (with its label) and type.", "counter",
                  labels=("controller", "dimm", "label", "type"))
    for c in facts.controllers:
        for kind, value in (("corrected", c.ce_count), ("uncorrected", c.ue_count)):
            if value is not None:
                mc.add((c.name, kind), value)
        for d in c.dimms:
            for kind, value in (("corrected", d.ce_count), ("uncorrected", d.ue_count)):
                if value is not None:
                    dimm.add((c.name, d.name, d.label, kind), value)
    return [mc, dimm]
