import os
import shutil

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nodehealth.checks import infiniband as infiniband_check
from nodehealth.collectors import infiniband
from nodehealth.host import HostPaths, KeptFiles
from nodehealth.model import Observed

HERE = os.path.dirname(__file__)
H100 = os.path.join(HERE, "fixtures", "machines", "h100-8x-cx7")
NODE_EXPORTER = os.path.join(HERE, "fixtures", "infiniband", "node_exporter")
PROCFS = os.path.join(HERE, "fixtures", "infiniband", "procfs")


def collect(root):
    return infiniband.collect(HostPaths(root), {})


def port(facts, name):
    return next(p for p in facts.ports if p.name == name)


def device(facts, name):
    return next(d for d in facts.devices if d.name == name)


def samples(metrics, name):
    family = next(m for m in metrics if m.name == name)
    return dict(family.samples)


@pytest.fixture
def h100_copy(tmp_path):
    """A writable copy of the H100 node's /sys/class/infiniband."""
    root = tmp_path / "machine"
    shutil.copytree(os.path.join(H100, "sys", "class", "infiniband"), root / "sys" / "class" / "infiniband")
    return root


# --- the real H100 node (gpud testdata): 8 ConnectX-7 NDR rails and a RoCE bond ------------------

def test_h100_node_has_nine_devices_with_one_port_each():
    facts = collect(H100)
    assert [d.name for d in facts.devices] == [
        "mlx5_0", "mlx5_1", "mlx5_4", "mlx5_5", "mlx5_6", "mlx5_7", "mlx5_8", "mlx5_9", "mlx5_bond_0"]
    assert [p.port for p in facts.ports] == [1] * 9


def test_h100_ndr_rail_is_active_at_400_infiniband():
    facts = collect(H100)
    p = port(facts, "mlx5_0:1")
    assert (p.state_id, p.state, p.phys_state_id, p.phys_state) == (4, "ACTIVE", 5, "LinkUp")
    assert (p.rate_gbps, p.rate_text, p.link_layer) == (400.0, "4X NDR", "InfiniBand")
    d = device(facts, "mlx5_0")
    assert (d.fw_version, d.board_id, d.hca_type, d.node_guid) == ("28.41.1000", "MT_0000000838", "MT4129", None)


def test_h100_roce_bond_is_ethernet_at_200():
    facts = collect(H100)
    p = port(facts, "mlx5_bond_0:1")
    assert (p.rate_gbps, p.rate_text, p.link_layer) == (200.0, "2X NDR", "Ethernet")
    assert device(facts, "mlx5_bond_0").hca_type == "MT41692"


def test_h100_counters_are_read_from_files_without_trailing_newline():
    p = port(collect(H100), "mlx5_0:1")
    assert p.counter("excessive_buffer_overrun_errors") == 15
    assert p.counter("port_rcv_errors") == 14
    assert p.counter("port_xmit_wait") == 2489603687
    assert p.hw_counters["rx_write_requests"] == 3809045607
    assert p.hw_counters["roce_adp_retrans"] == 3
    assert "lifespan" not in p.hw_counters  # a cache setting in ms, not a counter
    assert p.counters_ext == {}
    assert p.counter("port_rcv_discards") is None  # absent on mlx5: None, never 0


def test_data_counters_are_four_byte_words():
    facts = collect(H100)
    p = port(facts, "mlx5_0:1")
    assert p.counter("port_xmit_data") == 230442669431839
    assert p.transmitted_bytes == 230442669431839 * 4
    assert p.received_bytes == 230539874932483 * 4
    metrics = infiniband.metrics(facts)
    sent = samples(metrics, "nodehealth_infiniband_port_transmitted_bytes_total")
    assert sent[("mlx5_0", "1")] == 230442669431839 * 4
    rates = infiniband.counters(facts)
    assert rates["mlx5_0:1:transmitted_bytes"] == 230442669431839 * 4
    assert "mlx5_0:1:port_xmit_data" not in rates  # words would be mistaken for bytes


def test_counter_keys_keep_hw_counters_apart():
    facts = collect(H100)
    p = port(facts, "mlx5_0:1")
    rates = infiniband.counters(facts)
    assert rates[infiniband.counter_key(p, "symbol_error")] == 0
    assert rates[infiniband.hw_counter_key(p, "local_ack_timeout_err")] == p.hw_counters["local_ack_timeout_err"]
    assert infiniband.counter_key(p, "local_ack_timeout_err") not in rates
    assert infiniband.hw_counter_key(p, "out_of_buffer") == "mlx5_0:1:hw_counters/out_of_buffer"


def test_h100_metrics():
    metrics = infiniband.metrics(collect(H100))
    names = [m.name for m in metrics]
    assert len(names) == len(set(names))
    assert all(n.startswith("nodehealth_infiniband_") for n in names)
    assert samples(metrics, "nodehealth_infiniband_port_state_id")[("mlx5_0", "1")] == 4
    assert samples(metrics, "nodehealth_infiniband_port_physical_state_id")[("mlx5_9", "1")] == 5
    assert samples(metrics, "nodehealth_infiniband_port_rate_bytes_per_second")[("mlx5_0", "1")] == 400 * 125_000_000
    assert samples(metrics, "nodehealth_infiniband_port_excessive_buffer_overrun_errors_total")[("mlx5_0", "1")] == 15
    assert samples(metrics, "nodehealth_infiniband_port_info")[("mlx5_bond_0", "1", "Ethernet")] == 1
    info = samples(metrics, "nodehealth_infiniband_device_info")
    assert info[("mlx5_0", "MT_0000000838", "28.41.1000", "MT4129")] == 1
    hw = samples(metrics, "nodehealth_infiniband_port_hw_events_total")
    assert hw[("mlx5_0", "1", "out_of_buffer")] == 0
    assert len({label[2] for label in hw}) == 25  # the driver's fixed set, lifespan left out
    # absent counters add no sample: mlx5 has no port_rcv_discards file
    assert samples(metrics, "nodehealth_infiniband_port_receive_discards_total") == {}


class Recorded(dict):
    """Rates that remember every key looked up in them."""

    def __init__(self, *args):
        super().__init__(*args)
        self.asked: set[str] = set()

    def get(self, key, default=None):
        self.asked.add(key)
        return super().get(key, default)


def test_every_rate_the_check_and_the_families_read_is_one_the_collector_rates():
    """counters() rates only RATED (and the data counters); the check must not read a rate it leaves out."""
    facts = collect(H100)
    rates = Recorded(infiniband.counters(facts))
    infiniband_check.judge(Observed({"infiniband": facts}, {"infiniband": rates}), dict(infiniband_check.DEFAULTS))
    infiniband.rate_metrics(facts, rates)
    assert rates.asked and rates.asked <= set(rates), sorted(rates.asked - set(rates))
    names = {key.split(":", 2)[2] for key in rates.asked}
    assert names == {*infiniband.RATED, *(f"hw_counters/{n}" for n in infiniband.RATED_HW), "transmitted_bytes",
                     "received_bytes"}  # and every one of them is read


def test_the_real_h100_node_is_healthy_on_the_first_pass():
    facts = collect(H100)
    cfg = dict(infiniband_check.DEFAULTS)
    assert infiniband_check.judge(Observed({"infiniband": facts}), cfg) == []


# --- node_exporter and procfs trees ---------------------------------------------------------------

def test_node_exporter_mlx4_takes_the_larger_of_counters_and_counters_ext():
    facts = collect(NODE_EXPORTER)
    p = port(facts, "mlx4_0:1")
    assert p.counters_ext["port_xmit_data_64"] is not None
    assert p.transmitted_bytes == max(p.counters_ext["port_xmit_data_64"], p.counter("port_xmit_data")) * 4
    # counters_ext/ says 0 where counters/ holds 6825908347 (more than 32 bits: not a stuck legacy file)
    assert p.counters_ext["port_rcv_packets_64"] == 0
    assert p.traffic("port_rcv_packets", "port_rcv_packets_64") == p.counter("port_rcv_packets") == 6825908347
    # /metrics and the rates read the same source
    exported = samples(infiniband.metrics(facts), "nodehealth_infiniband_port_received_packets_total")
    assert exported[("mlx4_0", "1")] == 6825908347
    exported = samples(infiniband.metrics(facts), "nodehealth_infiniband_port_transmitted_bytes_total")
    assert exported[("mlx4_0", "1")] == infiniband.counters(facts)["mlx4_0:1:transmitted_bytes"] == p.transmitted_bytes
    assert p.counter("port_xmit_wait") == 2**32 - 1
    assert p.counter("port_rcv_discards") is not None
    assert (p.rate_gbps, p.rate_text) == (40.0, "4X QDR")


def test_node_exporter_iwarp_port_has_no_pma_values():
    facts = collect(NODE_EXPORTER)
    p = port(facts, "i40iw0:1")
    assert "symbol_error" in p.counters and p.counter("symbol_error") is None  # "N/A (no PMA)"
    assert p.counter("port_rcv_data") is None and p.received_bytes is None
    assert (p.rate_gbps, p.rate_text) == (10.0, "4X")
    metrics = infiniband.metrics(facts)
    assert ("i40iw0", "1") not in samples(metrics, "nodehealth_infiniband_port_symbol_errors_total")
    assert ("i40iw0", "1") not in samples(metrics, "nodehealth_infiniband_port_received_bytes_total")
    assert ("mlx4_0", "1") in samples(metrics, "nodehealth_infiniband_port_received_bytes_total")
    assert samples(metrics, "nodehealth_infiniband_port_state_id")[("i40iw0", "1")] == 4


def test_procfs_tree_with_omni_path_and_hw_counters():
    facts = collect(PROCFS)
    hfi = device(facts, "hfi1_0")
    assert hfi.hca_type is None and hfi.board_id.startswith("HPE 100Gb 1-port OP101")
    assert (hfi.ports[0].rate_gbps, hfi.ports[0].rate_text) == (100.0, "4X EDR")
    mlx5 = device(facts, "mlx5_0")
    assert mlx5.node_guid == "0a7f:bc12:45ef:d23b"
    assert (mlx5.ports[0].rate_gbps, mlx5.ports[0].rate_text) == (25.0, "1X EDR")
    assert mlx5.ports[0].phys_state_id == 4  # this test tree says "4: ACTIVE" here; the id is what counts
    assert "out_of_buffer" in mlx5.ports[0].hw_counters
    assert [p.port for p in device(facts, "mlx4_0").ports] == [1, 2]


def test_supported():
    assert infiniband.supported(HostPaths(H100), {}) is None
    assert "no InfiniBand/RoCE devices" in infiniband.supported(HostPaths(os.path.join(HERE, "nonexistent")), {})


# --- what goes wrong while reading --------------------------------------------------------------

def test_a_device_that_vanishes_mid_walk_reads_as_partial(h100_copy, monkeypatch):
    victim = h100_copy / "sys" / "class" / "infiniband" / "mlx5_1"
    real_read_texts = KeptFiles.read_texts

    def read_texts(kept, directory, names):
        if directory.endswith("mlx5_1/ports/1") and victim.exists():
            shutil.rmtree(victim)
        return real_read_texts(kept, directory, names)

    monkeypatch.setattr(KeptFiles, "read_texts", read_texts)
    facts = collect(h100_copy)
    gone = port(facts, "mlx5_1:1")
    assert (gone.state_id, gone.rate_gbps, gone.link_layer, gone.counters) == (None, None, None, {})
    assert device(facts, "mlx5_1").fw_version is None
    assert port(facts, "mlx5_4:1").state_id == 4  # the others are untouched
    findings = infiniband_check.judge(Observed({"infiniband": facts}), dict(infiniband_check.DEFAULTS))
    assert [(f.reason, f.device) for f in findings] == [("PortStateUnknown", "mlx5_1:1")]


def test_a_device_directory_lacking_files(tmp_path):
    ports = tmp_path / "sys" / "class" / "infiniband" / "mlx5_3" / "ports"
    (ports / "1").mkdir(parents=True)
    (ports / "1" / "state").write_text("1: DOWN\n")
    (ports / "not-a-port").mkdir()
    facts = collect(tmp_path)
    p = port(facts, "mlx5_3:1")
    assert (p.state_id, p.phys_state_id, p.rate_gbps, p.counters, p.hw_counters) == (1, None, None, {}, {})
    assert device(facts, "mlx5_3").fw_version is None
    assert len(facts.ports) == 1


def test_unreadable_attributes_are_none(h100_copy):
    counters = h100_copy / "sys" / "class" / "infiniband" / "mlx5_0" / "ports" / "1" / "counters"
    (counters / "symbol_error").unlink()
    (counters / "symbol_error").mkdir()  # a directory where a file is expected: EINVAL
    (counters / "link_downed").unlink()
    os.mkfifo(counters / "link_downed")  # a FIFO would block a naive reader; read_attr reads it as empty
    rate = counters.parent / "rate"
    rate.unlink()
    rate.mkdir()
    p = port(collect(h100_copy), "mlx5_0:1")
    assert p.counter("symbol_error") is None and p.counter("link_downed") is None
    assert p.rate_gbps is None and p.state_id == 4
    assert p.counter("port_rcv_errors") == 14


# --- the attribute parsers ----------------------------------------------------------------------

@pytest.mark.parametrize("text, expected", [
    ("4: ACTIVE", (4, "ACTIVE")),
    ("1: DOWN\n", (1, "DOWN")),
    ("5: LinkUp", (5, "LinkUp")),
    ("7: Phy Test", (7, "Phy Test")),
    ("3:", (3, None)),
    ("ACTIVE", (None, None)),
    (": ACTIVE", (None, None)),
    ("-1: DOWN", (None, None)),
    (None, (None, None)),
])
def test_parse_state(text, expected):
    assert infiniband.parse_state(text) == expected


@pytest.mark.parametrize("text, expected", [
    ("400 Gb/sec (4X NDR)", (400.0, "4X NDR")),
    ("200 Gb/sec (2X NDR)", (200.0, "2X NDR")),
    ("2.5 Gb/sec (1X SDR)", (2.5, "1X SDR")),
    ("10 Gb/sec (4X)", (10.0, "4X")),
    ("56 Gb/sec", (56.0, None)),
    ("0 GB/sec", (0.0, None)),  # the kernel's rate_show for a rate it does not know
    ("0 GB/sec\n", (0.0, None)),
    ("5 GB/sec", (None, None)),
    ("nan Gb/sec (4X)", (None, None)),
    ("inf Gb/sec (4X)", (None, None)),
    ("Unknown", (None, None)),
    (None, (None, None)),
])
def test_parse_rate(text, expected):
    assert infiniband.parse_rate(text) == expected


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_parse_state_never_raises(text):
    state_id, name = infiniband.parse_state(text)
    assert state_id is None or (isinstance(state_id, int) and state_id >= 0)


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=0, max_value=10**6),
       st.text(alphabet=st.characters(min_codepoint=33, max_codepoint=126), min_size=1))
def test_parse_state_round_trip(number, name):
    assert infiniband.parse_state(f"{number}: {name}") == (number, name)


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_parse_rate_never_raises(text):
    gbps, detail = infiniband.parse_rate(text)
    assert gbps is None or gbps >= 0


@settings(max_examples=200, deadline=None)
@given(st.floats(min_value=0, max_value=1e6, allow_nan=False), st.sampled_from(["4X NDR", "1X SDR", "4X"]))
def test_parse_rate_round_trip(gbps, detail):
    assert infiniband.parse_rate(f"{gbps} Gb/sec ({detail})") == (gbps, detail)


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(st.sampled_from(["state", "phys_state", "rate", "link_layer", "counters/symbol_error",
                                        "hw_counters/out_of_buffer", "counters_ext/port_xmit_data_64"]),
                       st.binary(max_size=64), min_size=1))
def test_any_file_content_gives_facts(tmp_path_factory, files):
    root = tmp_path_factory.mktemp("ib")
    port_dir = root / "sys" / "class" / "infiniband" / "mlx5_0" / "ports" / "1"
    for name, content in files.items():
        path = port_dir / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
    facts = collect(root)
    assert len(facts.ports) == 1
    infiniband.metrics(facts)
    infiniband.counters(facts)
