"""rdma-bw without a device: perftest's bandwidth maths, the timed loop over a simulated link, the
out-of-band exchange and its deadlines over real loopback sockets, the preflight over a fixture
sysfs, the memlock message, a missing pyverbs, and no import cost for `check`. The verbs themselves
run in the VM tier (tests/test_vm_tier.py)."""
from __future__ import annotations

import collections
import itertools
import json
import os
import resource
import socket
import subprocess
import sys
import threading
import time
import types

import pytest
from conftest import free_port

from nodehealth.host import HostPaths
from nodehealth.rdma import bw as rdma

GID_LO = "0000:0000:0000:0000:0000:ffff:7f00:0001"
HERE = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(HERE, "fixtures", "rdma", "vm-runs.json")) as f:
    VM = json.load(f)
# rxe0's measured rate in the VM tier: the simulated link moves data this fast, no faster
VM_LINK_GBPS = VM["client_result"]["bw_avg_gbps"]
SIGNALED = 2  # IBV_SEND_SIGNALED


class FakeLink:
    """The verbs boundary this machine lacks (a QP's post_send and its CQ's poll) as a link of
    `gbps`: each write is on the wire after the previous one, for size x 8 / rate seconds, and its
    completion (signalled WRs only, as a CQ) shows once it is off the wire. Every `run_seconds` the
    poller loses its CPU for `pause_seconds`, as on a loaded host: completions then wait in the CQ
    and come out in bursts of `num_entries`, all of them late."""

    def __init__(self, gbps: float, size: int, run_seconds: float = 0.05, pause_seconds: float = 0.12):
        self.tx = size * 8 / (gbps * 1e9)
        self.free = 0.0  # when the wire is next free
        self.done: collections.deque = collections.deque()  # (time off the wire, wr_id) of signalled WRs
        self.run_seconds, self.pause_seconds = run_seconds, pause_seconds
        self.pause_at: float | None = None
        self.posts = self.wrs = self.signalled = 0

    def post_send(self, wr) -> None:
        now = time.perf_counter()
        self.posts += 1
        while wr is not None:
            self.wrs += 1
            self.free = max(self.free, now) + self.tx
            if wr.send_flags & SIGNALED:
                self.signalled += 1
                self.done.append((self.free, wr.wr_id))
            wr = wr.next_wr

    def poll(self, num_entries: int = 1):
        now = time.perf_counter()
        if self.pause_at is None:
            self.pause_at = now + self.run_seconds
        if now >= self.pause_at:
            time.sleep(self.pause_seconds)
            now = time.perf_counter()
            self.pause_at = now + self.run_seconds
        wcs = []
        while self.done and self.done[0][0] <= now and len(wcs) < num_entries:
            wcs.append(types.SimpleNamespace(status=0, wr_id=self.done.popleft()[1]))
        return len(wcs), wcs


class FakeWR:
    """pyverbs' SendWR as far as rdma-bw uses it."""

    def __init__(self, wr_id=0, opcode=0, num_sge=0, sg=None, send_flags=SIGNALED):
        self.wr_id, self.opcode, self.send_flags, self.next_wr = wr_id, opcode, send_flags, None

    def set_wr_rdma(self, rkey, addr):
        self.rkey, self.remote_addr = rkey, addr


class FakeMR:
    def __init__(self, length: int):
        self.buf, self.lkey, self.rkey, self.data = 0x7F0000000000, 1, 2, bytearray(length)

    def write(self, data: bytes, length: int) -> None:
        self.data[:length] = data[:length]

    def read(self, length: int, offset: int) -> bytes:
        return bytes(self.data[offset:offset + length])


def fake_verbs(link_gbps: float = VM_LINK_GBPS, **link):
    """rdma-bw's verbs objects for one side (bw._Verbs) over a FakeLink: the timed loop is the real
    one; the links made are kept in the returned list."""
    links = []

    class FakeVerbs(rdma._Verbs):
        def __init__(self, stack, opts, device):
            self.opts = opts
            self.e = types.SimpleNamespace(IBV_WR_RDMA_WRITE=0, IBV_SEND_SIGNALED=SIGNALED, IBV_WC_SUCCESS=0)
            self.wr = types.SimpleNamespace(SGE=lambda addr, length, lkey: (addr, length, lkey), SendWR=FakeWR)
            self.Err = OSError
            self.mr = FakeMR(max(opts.size, rdma.PAGE))
            self.qp = self.cq = FakeLink(link_gbps, opts.size, **link)
            links.append(self.qp)
            self.local = rdma.Endpoint(0, 0x26, 0x81A18A, self.mr.rkey, self.mr.buf, GID_LO.replace(":", ""),
                                       opts.size, 5)

        def connect(self, remote):
            pass

    return FakeVerbs, links


def fake_server(endpoint: bytes | None = None, drip: float | None = None):
    """The server's side of the out-of-band exchange on a loopback port, in a thread: it reads the
    client's endpoint and answers with its own, then takes the report and says OK. With `drip` it
    sends bytes of its endpoint, one every `drip` seconds, and never the line's end. Returns (port,
    stop, lines): `stop` ends it; `lines` holds what it read."""
    endpoint = endpoint or rdma.Endpoint(0, 0x11, 0x1234, 0x99, 0x7F0000001000, GID_LO.replace(":", ""),
                                         1 << 20, 5).encode()
    lsock = socket.create_server(("127.0.0.1", 0))
    stop, lines = threading.Event(), []

    def line(conn):
        buf = b""
        while not buf.endswith(b"\n") and not stop.is_set():
            try:
                chunk = conn.recv(1)
            except socket.timeout:
                continue
            if not chunk:
                break
            buf += chunk
        lines.append(buf)
        return buf

    def serve():
        with lsock:
            lsock.settimeout(30)
            conn, _ = lsock.accept()
        with conn:
            conn.settimeout(0.05)
            line(conn)
            if drip is not None:
                for byte in itertools.cycle(endpoint[:-1]):
                    if stop.wait(drip):
                        return
                    conn.sendall(bytes([byte]))
            conn.sendall(endpoint)
            line(conn)
            conn.sendall(b"OK\n")
            stop.wait(5)

    threading.Thread(target=serve, daemon=True).start()
    return lsock.getsockname()[1], stop, lines


def test_peak_never_exceeds_what_the_link_can_move_when_completions_come_in_bursts(monkeypatch):
    """A client run over a link as fast as rxe0 in the VM, whose completions the poller, losing its
    CPU now and then, finds in bursts: the peak is the best rate the link really had, not the rate
    of two polls back to back (which gave ~600 Gb/s on a 0.6 Gb/s link)."""
    verbs, links = fake_verbs()
    monkeypatch.setattr(rdma, "preflight", lambda opts, host, need: "rxe0")
    monkeypatch.setattr(rdma, "_Verbs", verbs)
    port, stop, _ = fake_server()
    try:
        result = rdma.client("127.0.0.1", rdma.Options(gid_index=1, iterations=400, port=port), timeout=20)
    finally:
        stop.set()
    assert result.verified and result.iterations == 400
    assert links[0].wrs >= 400 + 128  # the warm-up and the timed writes went over the link
    assert 0 < result.bw_avg_gbps <= result.bw_peak_gbps <= VM_LINK_GBPS * (1 + 1e-9), result


def meter(posts, polls):
    m = rdma.Meter()
    events = sorted([(t, 0, n) for t, n in posts] + [(t, 1, n) for t, n in polls])
    for t, kind, n in events:
        (m.completed if kind else m.posted)(t, n)
    return m


def test_bandwidth_as_ib_write_bw_reports_it():
    # 1000 x 64 KiB, 100 per post, each post's messages completed 0.1 s later, the last at 1.0 s;
    # one stretch ran faster: the post at 0.4 s to the completion at 0.45 s (100 messages)
    posts = [(0.1 * i, 100 * i) for i in range(10)]
    polls = [(0.1 * (i + 1), 100 * (i + 1)) for i in range(10)]
    polls[4] = (0.45, 500)
    seconds, avg, peak, rate = meter(posts, polls).result(65536)
    assert seconds == pytest.approx(1.0)
    assert avg == pytest.approx(65536 * 1000 * 8 / 1e9)
    assert peak == pytest.approx(65536 * 100 / 0.05 * 8 / 1e9)
    assert rate == pytest.approx(1000 / 1.0 / 1e6)


def test_a_burst_of_completions_in_one_poll_is_no_peak():
    """A replayed poll burst: 128 writes posted at once, found by polls 1 us apart after a pause;
    the old peak (between two completions) was 128 x 64 KiB in 7 us, ~9,600 Gb/s."""
    posts = [(0.0, 0)] + [(0.2 + 1e-6 * i, 128 + 16 * i) for i in range(8)]
    polls = [(0.2 + 1e-6 * i, 16 * (i + 1)) for i in range(8)] + [(0.4, 256)]
    _, avg, peak, _ = meter(posts, polls).result(65536)
    assert peak == pytest.approx(65536 * 128 * 8 / 0.2 / 1e9)  # post at 0 to the completions at 0.2 s
    assert avg <= peak < 0.5


def perftest_peak(posts, polls):
    """perftest's own double loop (print_report_bw), each message stamped by its post call and by
    the poll that returned it: the least time per message from a post to a later completion."""
    n = polls[-1][1]
    posted = [max(t for t, first in posts if first <= i) for i in range(n)]
    completed = [min(t for t, count in polls if count > i) for i in range(n)]
    return max((j - i + 1) / (completed[j] - posted[i]) for i in range(n) for j in range(i, n)
               if completed[j] > posted[i])


@pytest.mark.parametrize("seed", range(20))
def test_the_peak_is_perftests(seed):
    import random

    rng = random.Random(seed)
    posts, polls, t, posted, done = [], [], 0.0, 0, 0
    while done < 60:
        t += rng.expovariate(100)
        if posted - done < 16 and rng.random() < 0.5:
            posts.append((t, posted))
            posted += rng.randint(1, 4)
        elif done < posted:
            done = rng.randint(done + 1, posted)
            polls.append((t, done))
    m = meter(posts, polls)
    assert m.best == pytest.approx(perftest_peak(posts, polls))


@pytest.mark.parametrize("polls", [[], [(1.0, 0)], [(0.0, 5)]])
def test_bandwidth_without_progress_is_an_error(polls):
    with pytest.raises(rdma.RdmaError):
        meter([(0.0, 0)], polls).result(8)


@pytest.mark.parametrize("size, iterations, cq_mod, calls", [
    (4096, 400, None, 4 + 13),  # 32 writes a call (a quarter of the tx depth): 128 to warm up, 400 = 12 x 32 + 16
    (65536, 384, None, 4 + 12),
    (65536, 100, 30, 4 + 4),  # the depth is 100 (the iterations): 100 = 3 x 30 + 10, twice
])
def test_writes_go_out_in_lists_one_call_and_one_completion_each(fake_device, size, iterations, cq_mod, calls):
    """A post call and a completion cost Python far more than the write itself at 4 KiB: the writes
    go out as linked lists of `cq_mod`, only the last signalled."""
    port, stop, _ = fake_server()
    try:
        opts = rdma.Options(gid_index=1, size=size, iterations=iterations, cq_mod=cq_mod, port=port)
        result = rdma.client("127.0.0.1", opts, timeout=20)
    finally:
        stop.set()
    link = fake_device[0]
    assert result.verified and result.iterations == iterations
    assert (link.posts, link.wrs, link.signalled) == (calls, min(128, iterations) + iterations, calls)


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


def test_writes_per_post_call():
    assert rdma.Options().moderation() == rdma.Options(size=4096).moderation() == 32  # a quarter of the depth
    assert rdma.Options(size=4096, cq_mod=8).moderation() == 8
    assert rdma.Options(iterations=50).depth() == 50 and rdma.Options(iterations=50).moderation() == 12


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

    def session(exchange, verbs, opts, device):
        starts.append(time.monotonic())
        time.sleep(0.4)  # a test in progress
        return rdma.RdmaError("done")

    monkeypatch.setattr(rdma, "preflight", lambda opts, host, length: "rxe0")
    monkeypatch.setattr(rdma, "_Verbs", lambda stack, opts, device: None)
    monkeypatch.setattr(rdma, "_session", session)
    port = free_port()
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


def run_in_thread(call):
    """Run `call` in a thread; (thread, box): box gets ("ok", value) or ("error", exception)."""
    box = []

    def target():
        try:
            box.append(("ok", call()))
        except Exception as err:  # noqa: BLE001 - the test reads it
            box.append(("error", err))

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, box


def wait_for(condition, seconds=20.0):
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.02)
    return condition()


def dripping_client(port: int, every: float, stop: threading.Event):
    """A client that connects and sends bytes of an endpoint line, one every `every` seconds,
    never the line's end (each read on the other side gets a byte well within its timeout)."""
    def drip():
        deadline = time.monotonic() + 20
        while True:  # the server listens from its thread: until it does, the port refuses
            try:
                s = socket.create_connection(("127.0.0.1", port), timeout=5)
                break
            except ConnectionRefusedError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.02)
        with s:
            while not stop.wait(every):
                try:
                    s.send(b"N")
                except OSError:
                    return
    t = threading.Thread(target=drip, daemon=True)
    t.start()
    return t


@pytest.fixture
def fake_device(monkeypatch):
    """This host as one with a device: the preflight passes, the verbs objects are FakeVerbs."""
    verbs, links = fake_verbs()
    monkeypatch.setattr(rdma, "preflight", lambda opts, host, need: "rxe0")
    monkeypatch.setattr(rdma, "_Verbs", verbs)
    return links


def start_serving(opts, timeout):
    stop, outcomes = threading.Event(), []
    thread = threading.Thread(target=rdma.serve, args=(opts, stop, outcomes.append, "127.0.0.1"),
                              kwargs={"timeout": timeout}, daemon=True)
    thread.start()
    return thread, stop, outcomes


def test_a_client_dripping_its_endpoint_frees_the_rail_at_the_exchanges_deadline(fake_device):
    """An admitted peer that sends a byte every 0.2 s (each read well within the 1 s timeout) held
    the rail's server until 512 bytes had come (over an hour at a byte every 3 s)."""
    opts = rdma.Options(gid_index=1, size=4096, duration=0.2, tx_depth=16, port=free_port())
    thread, stop, outcomes = start_serving(opts, timeout=1.0)
    drip_stop = threading.Event()
    try:
        dripping_client(opts.port, 0.2, drip_stop)
        errors = lambda: [o for o in outcomes if isinstance(o, rdma.RdmaError)]  # noqa: E731
        assert wait_for(lambda: errors(), 20), "the server still waits on the dripping client"
        limit = rdma.exchange_seconds(opts, 1.0)
        assert f"within the exchange's {limit:g} s" in str(errors()[0]) and "endpoint" in str(errors()[0])
    finally:
        drip_stop.set()
        stop.set()
        thread.join(10)


def test_a_server_dripping_its_endpoint_ends_the_client_at_the_exchanges_deadline(fake_device):
    port, stop, _ = fake_server(drip=0.2)
    opts = rdma.Options(gid_index=1, size=4096, duration=0.2, tx_depth=16, port=port)
    try:
        thread, box = run_in_thread(lambda: rdma.client("127.0.0.1", opts, timeout=1.0))
        thread.join(20)
        assert box, "the client still waits on the dripping server"
        kind, err = box[0]
        assert kind == "error" and err.stage == "peer", box
        assert f"the server's endpoint did not come within the exchange's {rdma.exchange_seconds(opts, 1.0):g} s" \
            in str(err)
    finally:
        stop.set()


def test_a_stop_ends_a_clients_exchange_at_once(fake_device):
    port, stop, lines = fake_server(drip=0.2)
    cancel = threading.Event()
    opts = rdma.Options(gid_index=1, duration=1.0, port=port)
    try:
        thread, box = run_in_thread(lambda: rdma.client("127.0.0.1", opts, timeout=60.0, cancel=cancel))
        assert wait_for(lambda: lines), "the client never sent its endpoint"
        cancel.set()
        thread.join(10)
        assert box and box[0][0] == "error" and box[0][1].stage == "cancelled", box
    finally:
        stop.set()


def test_a_stop_ends_a_servers_exchange_at_once(fake_device):
    opts = rdma.Options(gid_index=1, duration=1.0, port=free_port())
    thread, stop, outcomes = start_serving(opts, timeout=60.0)
    drip_stop = threading.Event()
    try:
        dripping_client(opts.port, 0.2, drip_stop)
        assert wait_for(lambda: fake_device), "no exchange started"
        stop.set()
        thread.join(10)
        assert not thread.is_alive(), "the server still holds the exchange after a stop"
    finally:
        drip_stop.set()
        stop.set()


def test_the_exchange_connects_from_a_process_holding_over_1024_descriptors():
    """The daemon keeps counter files open and its listeners may hold hundreds of connections: a
    descriptor number past select()'s 1,024 must not fail the RDMA test's connect."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 2048:
        pytest.skip(f"the open-file limit is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 2048), hard))
    held = []
    try:
        with socket.create_server(("127.0.0.1", 0)) as server:
            while not held or held[-1] < 1100:
                held.append(os.dup(server.fileno()))
            exchange = rdma._Exchange.connect("127.0.0.1", server.getsockname()[1], 5.0, None)
            assert exchange.sock.fileno() > 1024
            exchange.sock.close()
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
