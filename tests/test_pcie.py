import os
import re
import shutil
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nodehealth.checks import pcie as pcie_check
from nodehealth.collectors import pcie
from nodehealth.host import HostPaths
from nodehealth.model import Observed

HERE = os.path.dirname(__file__)
H100 = os.path.join(HERE, "fixtures", "machines", "h100-8x-cx7")
PLAIN = os.path.join(HERE, "fixtures", "machines", "plain-host")
LSPCI = os.path.join(HERE, "fixtures", "pcie", "gpud-h100-lspci-vvv")


def collect(root):
    return pcie.collect(HostPaths(root), {})


def device(facts, address):
    return next(d for d in facts.devices if d.address == address)


def samples(metrics, name):
    return dict(next(m for m in metrics if m.name == name).samples)


def lspci_links():
    """LnkCap / LnkSta of every device in the lspci -vvv capture the H100 tree was built from."""
    links = {}
    with open(LSPCI, encoding="utf-8") as f:
        text = f.read()
    for block in re.split(r"\n(?=[0-9a-f]{2}:[0-9a-f]{2}\.[0-7] )", text):
        cap = re.search(r"LnkCap:\s+Port #\d+, Speed ([\d.]+)GT/s, Width x(\d+)", block)
        sta = re.search(r"LnkSta:\s+Speed ([\d.]+)GT/s \([^)]*\), Width x(\d+)", block)
        if cap and sta:
            speeds = (float(sta.group(1)), float(cap.group(1)))
            links["0000:" + block[:7]] = speeds + (int(sta.group(2)), int(cap.group(2)))
    return links


def make_device(root, address, files):
    path = root / "sys" / "bus" / "pci" / "devices" / address
    path.mkdir(parents=True)
    for name, content in files.items():
        (path / name).write_text(content)
    return path


GPU_FILES = {"class": "0x030200\n", "vendor": "0x10de\n", "device": "0x2330\n",
             "current_link_speed": "32.0 GT/s PCIe\n", "max_link_speed": "32.0 GT/s PCIe\n",
             "current_link_width": "16\n", "max_link_width": "16\n"}


# --- the H100 node, built from its lspci -vvv capture -------------------------------------------

def test_h100_devices_of_interest():
    facts = collect(H100)
    assert Counter(d.kind for d in facts.devices) == {"gpu": 8, "nic": 12, "nvme": 8, "nvswitch": 4}
    gpu = device(facts, "0000:19:00.0")
    assert (gpu.kind, gpu.vendor_id, gpu.device_id) == ("gpu", 0x10DE, 0x2330)
    assert (gpu.current_speed_gts, gpu.max_speed_gts, gpu.current_width, gpu.max_width) == (32.0, 32.0, 16, 16)
    assert gpu.label == "0000:19:00.0 (GPU)"
    cx7 = device(facts, "0000:1a:00.0")
    assert (cx7.kind, cx7.vendor_id, cx7.device_id, cx7.max_speed_gts) == ("nic", 0x15B3, 0x1021, 32.0)
    cx6 = device(facts, "0000:1b:00.1")
    assert (cx6.device_id, cx6.max_speed_gts, cx6.max_width) == (0x101D, 16.0, 16)
    nvswitch = device(facts, "0000:83:00.0")
    assert (nvswitch.kind, nvswitch.device_id, nvswitch.current_width) == ("nvswitch", 0x22A3, 2)
    nvme = device(facts, "0000:4b:00.0")
    assert (nvme.kind, nvme.vendor_id, nvme.device_id, nvme.max_width) == ("nvme", 0x8086, 0x0B60, 4)


def test_h100_aer_counters_are_zero_with_named_types():
    gpu = device(collect(H100), "0000:3b:00.0")
    assert {s: gpu.aer_total(s) for s in pcie.AER_SEVERITIES} == {"fatal": 0, "nonfatal": 0, "correctable": 0}
    assert list(gpu.aer["correctable"].by_type)[:3] == ["RxErr", "BadTLP", "BadDLLP"]
    assert gpu.aer["fatal"].by_type["PoisonTLPBlocked"] == 0


def test_h100_tree_matches_the_lspci_capture():
    links = lspci_links()
    facts = collect(H100)
    assert len(facts.devices) == 32
    for d in facts.devices:
        assert (d.current_speed_gts, d.max_speed_gts, d.current_width, d.max_width) == links[d.address], d.address


def test_plain_fixture_directories_have_no_parent_port():
    assert all(d.parent_address is None for d in collect(H100).devices)


def test_h100_metrics():
    facts = collect(H100)
    metrics = pcie.metrics(facts)
    speed = samples(metrics, "nodehealth_pcie_link_speed_transfers_per_second")
    assert speed[("0000:19:00.0", "gpu", "current")] == 32e9
    assert speed[("0000:83:00.0", "nvswitch", "max")] == 16e9
    width = samples(metrics, "nodehealth_pcie_link_width_lanes")
    assert width[("0000:18:00.0", "nvme", "max")] == 4
    aer = samples(metrics, "nodehealth_pcie_aer_errors_total")
    assert aer[("0000:1a:00.0", "nic", "correctable")] == 0
    assert len(aer) == 32 * 3
    info = samples(metrics, "nodehealth_pcie_device_info")
    assert info[("0000:4b:00.0", "nvme", "0x8086", "0x0b60")] == 1
    assert next(m for m in metrics if m.name == "nodehealth_pcie_aer_errors_total").kind == "counter"
    assert pcie.counters(facts)["0000:19:00.0:aer_fatal"] == 0


def test_the_h100_node_is_healthy_by_the_check():
    obs = Observed({"pcie": collect(H100)})
    assert pcie_check.judge(obs, dict(pcie_check.DEFAULTS)) == []


def test_plain_host_is_this_vm_with_one_virtio_nic():
    facts = collect(PLAIN)
    assert [(d.address, d.kind, d.vendor_id, d.device_id) for d in facts.devices] == [
        ("0000:00:03.0", "nic", 0x1AF4, 0x1041)]
    nic = facts.devices[0]
    assert (nic.current_speed_gts, nic.max_width, nic.aer) == (None, None, {})  # not PCIe: no link files
    assert pcie.counters(facts) == {}
    assert samples(pcie.metrics(facts), "nodehealth_pcie_link_width_lanes") == {}


def test_supported():
    assert pcie.supported(HostPaths(H100), {}) is None
    assert "no PCI bus" in pcie.supported(HostPaths(os.path.join(HERE, "nonexistent")), {})


# --- the parent port, as in the real sysfs tree -------------------------------------------------

def test_parent_port_from_the_real_device_path(tmp_path):
    """/sys/bus/pci/devices/X links to /sys/devices/pci0000:00/<root port>/X."""
    port = tmp_path / "sys" / "devices" / "pci0000:00" / "0000:00:01.0"
    gpu = port / "0000:01:00.0"
    gpu.mkdir(parents=True)
    for name, content in dict(GPU_FILES, current_link_speed="16.0 GT/s PCIe\n", current_link_width="8\n").items():
        (gpu / name).write_text(content)
    for name, content in {"class": "0x060400\n", "vendor": "0x8086\n", "max_link_speed": "16.0 GT/s PCIe\n",
                          "max_link_width": "8\n"}.items():
        (port / name).write_text(content)
    devices = tmp_path / "sys" / "bus" / "pci" / "devices"
    devices.mkdir(parents=True)
    (devices / "0000:00:01.0").symlink_to("../../../devices/pci0000:00/0000:00:01.0")
    (devices / "0000:01:00.0").symlink_to("../../../devices/pci0000:00/0000:00:01.0/0000:01:00.0")
    facts = collect(tmp_path)
    assert [d.address for d in facts.devices] == ["0000:01:00.0"]  # the root port is a bridge: skipped
    d = facts.devices[0]
    assert (d.parent_address, d.parent_max_speed_gts, d.parent_max_width) == ("0000:00:01.0", 16.0, 8)
    findings = pcie_check.judge(Observed({"pcie": facts}), dict(pcie_check.DEFAULTS))
    assert [f.reason for f in findings] == ["PCIeSlotSlowerThanDevice"]


# --- what goes wrong while reading --------------------------------------------------------------

def test_a_device_that_vanishes_mid_walk_keeps_none(tmp_path, monkeypatch):
    victim = make_device(tmp_path, "0000:3b:00.0", GPU_FILES)
    make_device(tmp_path, "0000:19:00.0", GPU_FILES)
    make_device(tmp_path, "0000:5d:00.0", GPU_FILES)
    real_read_attr = pcie.read_attr

    def read_attr(path):
        if path.endswith("0000:3b:00.0/device") and victim.exists():
            shutil.rmtree(victim)
        if path.endswith("0000:5d:00.0/class"):
            shutil.rmtree(os.path.dirname(path))
        return real_read_attr(path)

    monkeypatch.setattr(pcie, "read_attr", read_attr)
    facts = collect(tmp_path)
    assert [d.address for d in facts.devices] == ["0000:19:00.0", "0000:3b:00.0"]  # 5d vanished before its class
    gone = device(facts, "0000:3b:00.0")
    assert (gone.kind, gone.device_id, gone.current_speed_gts, gone.max_width) == ("gpu", None, None, None)
    assert gone.aer == {}
    assert device(facts, "0000:19:00.0").max_width == 16
    assert pcie_check.judge(Observed({"pcie": facts}), dict(pcie_check.DEFAULTS)) == []


def test_unreadable_attributes_are_none(tmp_path):
    path = make_device(tmp_path, "0000:3b:00.0", {k: v for k, v in GPU_FILES.items() if k != "max_link_width"})
    (path / "max_link_width").mkdir()  # a directory where a file is expected
    (path / "current_link_speed").unlink()
    os.mkfifo(path / "current_link_speed")  # read_attr reads a FIFO as empty instead of blocking
    d = collect(tmp_path).devices[0]
    assert (d.max_width, d.current_speed_gts, d.current_width, d.max_speed_gts) == (None, None, 16, 32.0)


def test_other_devices_and_other_vendors_gpus_are_skipped(tmp_path):
    make_device(tmp_path, "0000:00:00.0", {"class": "0x060000\n", "vendor": "0x8086\n"})
    make_device(tmp_path, "0000:03:00.0", {"class": "0x030000\n", "vendor": "0x102b\n"})  # Matrox BMC VGA
    make_device(tmp_path, "0000:0c:00.0", {"class": "0x020700\n", "vendor": "0x15b3\n"})  # IB-mode ConnectX
    make_device(tmp_path, "0000:0d:00.0", {"class": "garbage\n", "vendor": "0x15b3\n"})
    assert [(d.address, d.kind) for d in collect(tmp_path).devices] == [("0000:0c:00.0", "nic")]


# --- the attribute parsers ----------------------------------------------------------------------

@pytest.mark.parametrize("text, expected", [
    ("32.0 GT/s PCIe", 32.0), ("2.5 GT/s PCIe", 2.5), ("8 GT/s", 8.0), ("16.0 GT/s", 16.0),
    ("Unknown", None), ("Unknown speed", None), ("", None), ("0 GT/s PCIe", None), ("nan GT/s PCIe", None),
    (None, None),
])
def test_parse_speed(text, expected):
    assert pcie.parse_speed(text) == expected


@pytest.mark.parametrize("text, expected", [("16", 16), ("0", 0), ("x16", None), ("-1", None), ("", None),
                                            (None, None)])
def test_parse_width(text, expected):
    assert pcie.parse_width(text) == expected


def test_parse_aer_with_unnamed_bits():
    counts = pcie.parse_aer("RxErr 3\nBadTLP 0\ndev_cor_errs_bit[5] 2\nTOTAL_ERR_COR 5\n")
    assert counts == pcie.AerCounts(5, {"RxErr": 3, "BadTLP": 0, "dev_cor_errs_bit[5]": 2})
    assert pcie.parse_aer("garbage") is None
    assert pcie.parse_aer("RxErr 1") == pcie.AerCounts(None, {"RxErr": 1})


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_parsers_never_raise(text):
    speed = pcie.parse_speed(text)
    assert speed is None or speed > 0
    width = pcie.parse_width(text)
    assert width is None or width >= 0
    counts = pcie.parse_aer(text)
    assert counts is None or all(v >= 0 for v in counts.by_type.values())
    assert pcie.parse_hex(text) is None or pcie.parse_hex(text) >= 0


@settings(max_examples=200, deadline=None)
@given(st.sampled_from([2.5, 5.0, 8.0, 16.0, 32.0, 64.0]), st.integers(min_value=0, max_value=32))
def test_kernel_formats_round_trip(gts, lanes):
    assert pcie.parse_speed(f"{gts:.1f} GT/s PCIe\n".strip()) == gts
    assert pcie.parse_width(str(lanes)) == lanes


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.from_regex(r"[A-Za-z]{1,12}", fullmatch=True), st.integers(min_value=0, max_value=2**64)))
def test_parse_aer_round_trip(by_type):
    text = "".join(f"{k} {v}\n" for k, v in by_type.items()) + f"TOTAL_ERR_FATAL {sum(by_type.values())}\n"
    assert pcie.parse_aer(text) == pcie.AerCounts(sum(by_type.values()), by_type)


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(st.sampled_from(sorted(GPU_FILES) + ["aer_dev_fatal", "aer_dev_correctable"]),
                       st.binary(max_size=64), min_size=1))
def test_any_file_content_gives_facts(tmp_path_factory, files):
    root = tmp_path_factory.mktemp("pci")
    path = root / "sys" / "bus" / "pci" / "devices" / "0000:3b:00.0"
    path.mkdir(parents=True)
    for name, content in dict({"class": b"0x030200\n", "vendor": b"0x10de\n"}, **files).items():
        (path / name).write_bytes(content)
    facts = collect(root)
    pcie.metrics(facts)
    pcie.counters(facts)
    pcie_check.judge(Observed({"pcie": facts}), dict(pcie_check.DEFAULTS))
