"""rdma-bw without a device: perftest's bandwidth maths, the out-of-band message, the preflight
over a fixture sysfs, the memlock message, a missing pyverbs, and no import cost for `check`.
The verbs themselves run in the VM tier (tests/test_vm_tier.py)."""
from __future__ import annotations

import os
import resource
import subprocess
import sys

import pytest

from nodehealth.host import HostPaths
from nodehealth.rdma import bw as rdma

GID_LO = "0000:0000:0000:0000:0000:ffff:7f00:0001"


def test_bandwidth_as_ib_write_bw_reports_it():
    # 1000 x 64 KiB in 1 s: 0.524288 Gb/s average; the best 100-message stretch took 0.05 s
    completions = [(0.1 * i, 100 * i) for i in range(1, 11)]
    completions[4] = (0.45, 500)
    avg, peak, rate = rdma.bandwidth(65536, 1000, 0.0, completions, window=100)
    assert avg == pytest.approx(65536 * 1000 * 8 / 1e9)
    assert peak == pytest.approx(65536 * 100 / 0.05 * 8 / 1e9)
    assert rate == pytest.approx(1000 / 1.0 / 1e6)


def test_peak_needs_a_whole_window_not_two_polls_back_to_back():
    completions = [(1.0, 1), (1.000001, 2), (2.0, 3), (3.0, 4)]
    _, peak, _ = rdma.bandwidth(8, 4, 0.0, completions, window=2)
    assert peak == pytest.approx(2 * 8 * 8 / 1e9 / 1.0)  # (1.0 -> 2.0) or (2.0 -> 3.0): two per second


@pytest.mark.parametrize("completions", [[], [(0.0, 5)]])
def test_bandwidth_without_progress_is_an_error(completions):
    with pytest.raises(rdma.RdmaError):
        rdma.bandwidth(8, 5, 0.0, completions)


def test_endpoint_round_trip_and_bogus_messages():
    e = rdma.Endpoint(0, 0x26, 0x81A18A, 0x177D, 0x7F195CB6D000, GID_LO.replace(":", ""), 65536, 5)
    assert rdma.Endpoint.decode(e.encode()) == e
    assert len(e.encode()) < rdma.OOB_MAX
    for bogus, fragment in [(b"GET / HTTP/1.0\r\n", "not an rdma-bw endpoint"),
                            (e.encode().replace(b"000026", b"zzzzzz"), "bad number"),
                            (e.encode().replace(b" 10000 ", b" 0 "), "out of range")]:
        with pytest.raises(rdma.RdmaError, match=fragment):
            rdma.Endpoint.decode(bogus)


def _device(root, state="4: ACTIVE", link="Ethernet", gids=None, uverbs=True):
    port = root / "sys/class/infiniband/rxe0/ports/1"
    (port / "gids").mkdir(parents=True)
    (port / "state").write_text(state + "\n")
    (port / "link_layer").write_text(link + "\n")
    for i, g in (gids or {0: "fe80:0000:0000:0000:0200:00ff:fe00:0000", 1: GID_LO}).items():
        (port / "gids" / str(i)).write_text(g + "\n")
    (root / "proc/self").mkdir(parents=True)
    (root / "proc/self/status").write_text("Name:\tx\nCapEff:\t0000000000000000\n")
    (root / "dev/infiniband").mkdir(parents=True)
    if uverbs:
        (root / "dev/infiniband/uverbs0").write_text("")
    return HostPaths(str(root))


@pytest.mark.parametrize("kwargs, opts, fragment", [
    ({}, {"device": "mlx5_0", "gid_index": 1}, "no RDMA device 'mlx5_0' (found: rxe0)"),
    ({}, {"ib_port": 2, "gid_index": 1}, "rxe0 has no port 2"),
    ({"state": "1: DOWN"}, {"gid_index": 1}, "not ACTIVE (1: DOWN)"),
    ({}, {}, "RoCE (Ethernet): give a GID index"),
    ({}, {"gid_index": 7}, "no GID at index 7"),
    ({"gids": {3: "0000:0000:0000:0000:0000:0000:0000:0000"}}, {"gid_index": 3}, "no GID at index 3"),
    ({"uverbs": False}, {"gid_index": 1}, "uverbs* device node"),
])
def test_preflight_names_the_problem(tmp_path, kwargs, opts, fragment):
    host = _device(tmp_path, **kwargs)
    with pytest.raises(rdma.RdmaError) as err:
        rdma.preflight(rdma.Options(**opts), host, 4096)
    assert fragment in str(err.value)


def test_preflight_passes_and_checks_memlock(tmp_path, monkeypatch):
    host = _device(tmp_path)
    assert rdma.preflight(rdma.Options(gid_index=1), host, 4096) == "rxe0"
    monkeypatch.setattr(resource, "getrlimit", lambda _: (64 * 1024, 64 * 1024))
    with pytest.raises(rdma.RdmaError, match=r"memlock limit \(ulimit -l\) is 64 KiB and CAP_IPC_LOCK is not held"):
        rdma.preflight(rdma.Options(gid_index=1), host, 1 << 20)
    (tmp_path / "proc/self/status").write_text("CapEff:\t0000000000004000\n")  # CAP_IPC_LOCK: the limit is moot
    assert rdma.preflight(rdma.Options(gid_index=1), host, 1 << 20) == "rxe0"


def test_no_device_at_all(tmp_path):
    with pytest.raises(rdma.RdmaError, match="no RDMA device"):
        rdma.preflight(rdma.Options(), HostPaths(str(tmp_path)), 4096)


def test_missing_pyverbs_is_one_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "pyverbs", None)
    with pytest.raises(rdma.RdmaError) as err:
        rdma._pyverbs()
    text = str(err.value)
    assert "pyverbs is not importable" in text and "python3-pyverbs" in text and "\n" not in text


def test_cq_moderation_as_perftest():
    assert rdma.Options().moderation() == 1  # 64 KiB > 8 KiB: every write signalled
    assert rdma.Options(size=4096).moderation() == 100
    assert rdma.Options(size=4096, cq_mod=8).moderation() == 8
    assert rdma.Options(iterations=50).depth() == 50


def test_cli_without_device_says_so_and_check_does_not_pay_for_it(tmp_path):
    heavy = ('pyverbs', 'nodehealth.rdma.bw', 'nodehealth.netcheck.agent', 'nodehealth.netcheck.rounds')
    code = (f"import sys, nodehealth.cli as c; c.parser(); "
            f"print(sorted(m for m in sys.modules if m.startswith({heavy})))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
    if os.path.isdir("/sys/class/infiniband") and os.listdir("/sys/class/infiniband"):
        pytest.skip("this host has an RDMA device")
    p = subprocess.run([sys.executable, "-m", "nodehealth.cli", "rdma-bw", "127.0.0.1"], capture_output=True,
                       text=True)
    assert p.returncode == 1 and p.stderr.strip() == \
        "nodehealth rdma-bw: no RDMA device (/sys/class/infiniband is empty or absent)"


def test_the_daemons_server_rests_as_long_as_each_session_took(monkeypatch):
    """Whoever reaches the port may ask for a test: back-to-back clients hold the rail at most half
    the time. Below the sessions (verbs objects, the exchange) is the hardware this machine lacks."""
    import socket
    import threading
    import time

    starts: list[float] = []

    def session(conn, verbs, opts, device, timeout):
        starts.append(time.monotonic())
        time.sleep(0.4)  # a test in progress
        return rdma.RdmaError("done")

    monkeypatch.setattr(rdma, "preflight", lambda opts, host, length: "rxe0")
    monkeypatch.setattr(rdma, "_Verbs", lambda stack, opts, device: None)
    monkeypatch.setattr(rdma, "_session", session)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    stop, outcomes = threading.Event(), []
    server = threading.Thread(target=rdma.serve, args=(rdma.Options(port=port), stop, outcomes.append, "127.0.0.1"))
    server.start()
    try:
        deadline = time.monotonic() + 10
        clients = []
        while len(clients) < 3 and time.monotonic() < deadline:  # three clients at once, queued in the backlog
            try:
                clients.append(socket.create_connection(("127.0.0.1", port), timeout=1))
            except ConnectionRefusedError:
                time.sleep(0.05)
        while len(starts) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        stop.set()
        server.join(5)
        for c in clients:
            c.close()
    assert len(starts) == 3 and len(outcomes) >= 3, (starts, outcomes)
    assert all(b - a >= 0.75 for a, b in zip(starts, starts[1:])), starts  # 0.4 s of test, 0.4 s of rest
