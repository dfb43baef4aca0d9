"""The daemon as a real process: HTTP faces, kernel-log streaming, SIGTERM, state across restarts."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest
from conftest import STOP_SECONDS, free_port, http_get, machine, started_agent, wait_for

from nodehealth.server import STUCK_EXIT_SECONDS

XID79 = "NVRM: Xid (PCI:0000:1b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."


@pytest.fixture
def plain(tmp_path):
    root = tmp_path / "machine"
    shutil.copytree(machine("plain-host"), root, symlinks=True)
    return root


def append_kmsg(root, message: str, seq: int, usec: int) -> None:
    with open(root / "dev" / "kmsg", "a") as f:
        f.write(f"3,{seq},{usec},-;{message}\n")


def last_seq(root) -> int:
    seqs = [int(line.split(",")[1]) for line in (root / "dev" / "kmsg").read_text().splitlines()
            if re.match(r"^\d+,\d+,\d+", line)]
    return max(seqs)


def metric_value(text: str, name: str, **labels) -> float | None:
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            if all(f'{k}="{v}"' in line for k, v in labels.items()):
                return float(line.rsplit(" ", 1)[1])
    return None


def test_faces_and_the_report_match_check(plain, tmp_path, daemon_factory):
    d = daemon_factory(str(plain), str(tmp_path / "state"))
    report = d.wait_ready()
    assert d.get("/healthz")[0] == 200
    code, body = d.get("/metrics")
    assert code == 200
    text = body.decode()
    assert metric_value(text, "nodehealth_health_status") == {"healthy": 0, "unhealthy": 1, "unknown": 2}[
        report["status"]]
    assert metric_value(text, "nodehealth_collector_success", collector="kmsg") == 1
    assert d.get("/nope")[0] == 404
    check = subprocess.run([sys.executable, "-m", "nodehealth.cli", "check", "--json", "--root", str(plain)],
                           capture_output=True, text=True)
    one_shot = json.loads(check.stdout)
    # One evaluation path: the daemon and the CLI agree on what is wrong.
    assert [(f["check"], f["reason"], f["device"]) for f in report["findings"]] == [
        (f["check"], f["reason"], f["device"]) for f in one_shot["findings"]]
    assert d.stop() < STOP_SECONDS


def test_new_xid_reaches_metrics_at_once_and_survives_restart_without_double_count(plain, tmp_path,
                                                                                  daemon_factory):
    state = tmp_path / "state"
    d = daemon_factory(str(plain), str(state), interval=60.0)  # no pass will help: the stream must
    d.wait_ready()
    # the stream's first read of the existing log may follow the first report: wait for it
    records_before = wait_for(lambda: metric_value(d.get("/metrics")[1].decode(),
                                                   "nodehealth_kernel_log_records_total") or None)
    assert records_before, "the kernel log's existing records were never read"
    seq = last_seq(plain) + 1
    t0 = time.monotonic()
    append_kmsg(plain, XID79, seq, 348_000_000)

    def seen():
        text = d.get("/metrics")[1].decode()
        return text if 'reason="Xid79FallenOffBus"' in text else None
    text = wait_for(seen)
    latency = time.monotonic() - t0
    assert text is not None, "the Xid never reached /metrics"
    assert latency < 1.0
    assert metric_value(text, "nodehealth_health_status") == 1
    assert metric_value(text, "nodehealth_kernel_log_records_total") == records_before + 1
    assert metric_value(text, "nodehealth_gpu_xid_events_total", pci_bus_id="0000:1b:00.0", xid="79") == 1
    assert d.stop() < STOP_SECONDS
    assert (state / "state.json").exists()
    # The health change is in the log, with its reason, at WARNING.
    assert re.search(r"WARNING nodehealth.daemon: node \S+: healthy -> unhealthy; new: fatal Xid79FallenOffBus "
                     r"on 0000:1b:00.0 \(xid\)", d.output())

    again = daemon_factory(str(plain), str(state), interval=60.0)
    again.wait_ready()
    text = again.get("/metrics")[1].decode()
    assert 'reason="Xid79FallenOffBus"' in text
    assert metric_value(text, "nodehealth_kernel_log_records_total") == records_before + 1
    assert metric_value(text, "nodehealth_gpu_xid_events_total", pci_bus_id="0000:1b:00.0", xid="79") == 1
    again.stop()


def test_reboot_forgets_the_old_boot(plain, tmp_path, daemon_factory):
    state = tmp_path / "state"
    append_kmsg(plain, XID79, last_seq(plain) + 1, 348_000_000)
    d = daemon_factory(str(plain), str(state))
    assert any(f["reason"] == "Xid79FallenOffBus" for f in d.wait_ready()["findings"])
    d.stop()
    # The node reboots: a new boot id and a fresh ring buffer without the Xid.
    (plain / "proc" / "sys" / "kernel" / "random" / "boot_id").write_text("00000000-0000-0000-0000-00000000beef\n")
    lines = (plain / "dev" / "kmsg").read_text().splitlines()
    (plain / "dev" / "kmsg").write_text("\n".join(line for line in lines if "Xid" not in line) + "\n")
    again = daemon_factory(str(plain), str(state))
    assert not any(f["reason"] == "Xid79FallenOffBus" for f in again.wait_ready()["findings"])
    again.stop()


def test_a_stalled_client_does_not_block_others(plain, tmp_path, daemon_factory):
    d = daemon_factory(str(plain), str(tmp_path / "state"))
    d.wait_ready()
    stalled = [socket.create_connection(("127.0.0.1", d.port)) for _ in range(4)]
    for s in stalled:
        s.sendall(b"GET /metrics HTTP/1.1\r\n")  # never finishes its headers
    t0 = time.monotonic()
    assert d.get("/healthz")[0] == 200
    assert time.monotonic() - t0 < 1.0
    for s in stalled:
        s.close()
    d.stop()


def test_a_stop_that_cannot_finish_exits_anyway_with_every_stack(plain, tmp_path):
    """A thread nobody ends (here a stray non-daemon one) would hold the process past its grace
    period; the state is written first, then the daemon exits 1 and says where it was stuck."""
    state = tmp_path / "state"
    port = free_port()
    stray = ("import threading, time\n"
             "def stray_thread_that_never_ends():\n    time.sleep(3600)\n"
             "threading.Thread(target=stray_thread_that_never_ends).start()\n"
             "from nodehealth.cli import main\n"
             f"main(['daemon', '--root', {str(plain)!r}, '--state-dir', {str(state)!r}, "
             f"'--listen', '127.0.0.1:{port}', '--interval', '1.0'])\n")
    proc = subprocess.Popen([sys.executable, "-c", stray], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        def served():
            try:
                return http_get(f"http://127.0.0.1:{port}/v1/report", timeout=1.0)[0] == 200
            except OSError:
                return proc.poll() is not None

        assert wait_for(served, timeout=15.0) and proc.poll() is None
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(STUCK_EXIT_SECONDS + STOP_SECONDS)
        assert time.monotonic() - t0 < STUCK_EXIT_SECONDS + STOP_SECONDS
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    out = proc.stdout.read()
    assert code == 1, out
    assert (state / "state.json").exists()
    assert "most recent call first" in out and "stray_thread_that_never_ends" in out


def test_unwritable_state_dir_does_not_stop_the_daemon(plain, tmp_path, daemon_factory):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    d = daemon_factory(str(plain), str(blocker / "state"))
    d.wait_ready()
    code, body = d.get("/metrics")
    assert code == 200 and metric_value(body.decode(), "nodehealth_state_save_errors_total") >= 1
    code, body = d.get("/healthz")
    assert code == 200 and body.decode().startswith("degraded: cannot save state to")  # documented in README
    assert d.stop() < STOP_SECONDS
    assert d.output().count("cannot write state") == 1  # once per outage, not once per save


def test_a_state_file_with_wrong_types_is_set_aside_and_the_daemon_starts_afresh(plain, tmp_path, daemon_factory):
    state = tmp_path / "state"
    state.mkdir()
    boot = (plain / "proc" / "sys" / "kernel" / "random" / "boot_id").read_text().strip()
    (state / "state.json").write_text(json.dumps({"version": 1, "boot_id": boot, "sticky": [], "debounce": {},
                                                  "kmsg": {"boot_id": boot, "last_seq": "zz", "events": []}}))
    d = daemon_factory(str(plain), str(state))
    d.wait_ready()
    assert d.stop() < STOP_SECONDS
    assert "starting afresh" in d.output() and (state / "state.json.corrupt").exists()
    assert json.loads((state / "state.json").read_text())["kmsg"]["last_seq"] is not None


def test_slow_clients_never_hold_metrics_and_are_dropped_at_their_deadline(plain, tmp_path, daemon_factory):
    """Slowloris: as many clients as there are workers, each sending a byte a second."""
    from nodehealth.server import MAX_CONCURRENT_REQUESTS, REQUEST_TIMEOUT_SECONDS
    d = daemon_factory(str(plain), str(tmp_path / "state"))
    d.wait_ready()
    slow = [socket.create_connection(("127.0.0.1", d.port)) for _ in range(MAX_CONCURRENT_REQUESTS)]
    request = b"GET /metrics HTTP/1.1\r\nHost: x\r\n" + b"X: y\r\n" * 20
    dropped = set()
    t0 = time.monotonic()
    for i in range(int(REQUEST_TIMEOUT_SECONDS) + 3):
        for n, s in enumerate(slow):
            try:
                s.sendall(request[i:i + 1])
            except OSError:
                dropped.add(n)
        started = time.monotonic()
        assert d.get("/metrics")[0] == 200
        assert time.monotonic() - started < 1.0
        time.sleep(max(0.0, t0 + i + 1 - time.monotonic()))
    for n, s in enumerate(slow):
        s.settimeout(2.0)
        try:
            if s.recv(100) == b"":
                dropped.add(n)
        except OSError:
            dropped.add(n)
        s.close()
    assert len(dropped) == len(slow)  # each had 5 s in all, not 5 s per byte
    d.stop()


def test_two_thousand_idle_connections_do_not_stop_metrics(plain, tmp_path, daemon_factory):
    d = daemon_factory(str(plain), str(tmp_path / "state"))
    d.wait_ready()
    idle = []
    try:
        for _ in range(2000):
            idle.append(socket.create_connection(("127.0.0.1", d.port), timeout=5))
        t0 = time.monotonic()
        assert d.get("/metrics")[0] == 200
        assert time.monotonic() - t0 < 2.0
    finally:
        for s in idle:
            s.close()
    assert d.stop() < STOP_SECONDS


def test_sigterm_with_a_slow_client_open_exits_at_once(plain, tmp_path, daemon_factory):
    d = daemon_factory(str(plain), str(tmp_path / "state"))
    d.wait_ready()
    slow = socket.create_connection(("127.0.0.1", d.port))
    slow.sendall(b"GET /metrics HTTP/1.1\r\n")
    assert d.stop() < STOP_SECONDS
    slow.close()


def test_sighup_exits_cleanly_with_the_state_saved(plain, tmp_path, daemon_factory):
    import signal
    state = tmp_path / "state"
    d = daemon_factory(str(plain), str(state))
    d.wait_ready()
    # The report can be served before the pass's state is written: wait for the file, not a guess.
    assert wait_for((state / "state.json").exists, timeout=15)
    (state / "state.json").unlink()
    d.proc.send_signal(signal.SIGHUP)
    assert d.proc.wait(STOP_SECONDS) == 0
    assert json.loads((state / "state.json").read_text())["kmsg"]["last_seq"] is not None


@pytest.mark.parametrize("listen", ["nonsense", "127.0.0.1:99999", "no-such-host.invalid:9456", "IN USE"])
def test_a_listen_address_it_cannot_use_is_one_line_and_exit_2(plain, tmp_path, listen, capsys):
    from nodehealth import cli
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        if listen == "IN USE":
            listen = f"127.0.0.1:{busy.getsockname()[1]}"
        assert cli.main(["daemon", "--root", str(plain), "--state-dir", str(tmp_path), "--listen", listen]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"nodehealth: cannot listen on {listen}: ") and err.count("\n") == 1


@pytest.mark.parametrize("interval", ["0", "-1", "nan", "x"])
def test_an_interval_that_is_no_positive_number_is_a_usage_error(interval, capsys):
    from nodehealth import cli
    with pytest.raises(SystemExit) as e:
        cli.main(["daemon", "--interval", interval])
    assert e.value.code == 2 and "--interval" in capsys.readouterr().err


def _xid(source, device="0000:5d:00.0", code=79, t=1000.0):
    from nodehealth.collectors.kernel_events import XID, KernelEvent
    detail = {"source": "nvml"} if source == "nvml" else {}
    return KernelEvent(XID, device, code, f"from {source}", wall_time=t, detail=detail)


@pytest.mark.parametrize("first, second, kept", [
    (_xid("nvml"), _xid("kmsg", t=1000.5), ["from kmsg"]),  # the kernel line replaces the bare event
    (_xid("kmsg"), _xid("nvml", t=1001.9), ["from kmsg"]),  # the event after its line adds nothing
    (_xid("nvml", device=""), _xid("kmsg", t=1001.0), ["from kmsg"]),  # a lost GPU's event has no bus id
    (_xid("nvml"), _xid("kmsg", t=1003.0), ["from nvml", "from kmsg"]),  # too far apart: two Xids
    (_xid("nvml"), _xid("kmsg", device="0000:3b:00.0"), ["from nvml", "from kmsg"]),  # other GPU
    (_xid("nvml"), _xid("kmsg", code=48), ["from nvml", "from kmsg"]),  # other Xid
    (_xid("kmsg"), _xid("kmsg", t=1000.1), ["from kmsg", "from kmsg"]),  # the log repeats itself: two
])
def test_an_xid_from_nvml_and_the_kernel_log_counts_once(first, second, kept):
    from nodehealth.kernel_stream import Batch, KernelEvents
    store = KernelEvents("boot", "/dev/kmsg")
    store.add(Batch(0, 0, None, [first]))
    store.add(Batch(0, 0, None, [second]))
    assert [e.text for e in store.events] == kept


def test_an_operator_clear_forgets_sticky_faults_until_they_happen_again(plain, tmp_path, daemon_factory):
    state = tmp_path / "state"
    append_kmsg(plain, XID79, last_seq(plain) + 1, 348_000_000)
    d = daemon_factory(str(plain), str(state), interval=0.3)

    def lost(daemon) -> bool:
        report = json.loads(daemon.get("/v1/report")[1])
        return any(f["reason"] == "Xid79FallenOffBus" for f in report["findings"])
    d.wait_ready()
    assert wait_for(lambda: lost(d), timeout=10.0)  # the kernel stream's news may follow the first report
    done = subprocess.run([sys.executable, "-m", "nodehealth.cli", "clear", "--state-dir", str(state),
                           "--reason", "GPU replaced"], capture_output=True, text=True)
    assert done.returncode == 0 and "clear requested" in done.stdout
    assert wait_for(lambda: not lost(d), timeout=5.0, step=0.05)
    d.stop()
    assert "GPU replaced" in d.output()
    again = daemon_factory(str(plain), str(state), interval=0.3)  # the clear survives a restart
    again.wait_ready()
    assert not lost(again)
    append_kmsg(plain, XID79, last_seq(plain) + 1, 348_500_000)  # and a new Xid is seen again
    assert wait_for(lambda: lost(again), timeout=5.0, step=0.02)
    again.stop()


def test_the_daemon_watches_hang_records_when_asked(plain, tmp_path, daemon_factory):
    records = tmp_path / "hang"
    records.mkdir()
    (records / "job1.0.rank.json").write_text("{torn")  # a record cut short must not stop anything
    d = daemon_factory(str(plain), str(tmp_path / "state"), "--hang-dir", str(records))
    d.wait_ready()
    text = d.get("/metrics")[1].decode()
    assert metric_value(text, "nodehealth_hang_bundles_total") == 0
    assert d.get("/healthz")[0] == 200
    assert d.stop() < STOP_SECONDS


def test_health_changes_are_logged_worse_at_warning_better_at_info(caplog):
    import logging

    from nodehealth.daemon import log_change
    from nodehealth.model import Finding, Report, Severity, Status
    lost = Finding("xid", Severity.FATAL, "Xid79FallenOffBus", "m", "0000:1b:00.0")
    healthy, sick = Report("n", Status.HEALTHY, [], []), Report("n", Status.UNHEALTHY, [lost], [])
    caplog.set_level(logging.INFO, "nodehealth.daemon")
    log_change(None, healthy)
    log_change(healthy, healthy)  # nothing changed: nothing logged
    log_change(healthy, sick)
    log_change(sick, healthy)
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("INFO", "node n: starting -> healthy"),
        ("WARNING", "node n: healthy -> unhealthy; new: fatal Xid79FallenOffBus on 0000:1b:00.0 (xid)"),
        ("WARNING", "raised: fatal Xid79FallenOffBus on 0000:1b:00.0 (xid): m"),
        ("INFO", "node n: unhealthy -> healthy; gone: Xid79FallenOffBus on 0000:1b:00.0"),
        ("INFO", "cleared: Xid79FallenOffBus on 0000:1b:00.0 (xid)")]
    assert [(r.check, r.reason, r.device) for r in caplog.records if hasattr(r, "check")] == [
        ("xid", "Xid79FallenOffBus", "0000:1b:00.0")] * 2


# -- the listeners under a flood of connections ----------------------------------------------------

HTTP2_HELLO = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"  # preface, SETTINGS


def probes_answered(d, peer_group: str = "same-leaf", probe: str = "ping") -> float:
    text = d.get("/metrics")[1].decode()
    sent = metric_value(text, "nodehealth_pingmesh_probes_total", peer_group=peer_group, probe=probe) or 0
    return sent - (metric_value(text, "nodehealth_pingmesh_lost_total", peer_group=peer_group, probe=probe) or 0)


def connect_all(address, count: int, hello: bytes = b"") -> list[socket.socket]:
    out = []
    for _ in range(count):
        s = socket.create_connection(address, timeout=2)
        if hello:
            s.sendall(hello)
        out.append(s)
    return out


def wait_all_heard(socks: list[socket.socket], timeout: float) -> int:
    """Wait until the server said something (HTTP/2 settings) or closed each socket; how many it did."""
    import selectors
    sel = selectors.DefaultSelector()
    for s in socks:
        sel.register(s, selectors.EVENT_READ)
    heard = 0
    deadline = time.monotonic() + timeout
    while sel.get_map() and time.monotonic() < deadline:
        for key, _ in sel.select(0.2):
            sel.unregister(key.fileobj)
            heard += 1
    sel.close()
    return heard


def test_a_flood_of_idle_connections_leaves_the_daemon_its_descriptors_and_its_prober(plain, tmp_path,
                                                                                   daemon_factory):
    """A daemon with the pingmesh agent and 1,024 descriptors; 1,200 idle HTTP/2 connections to its Ping
    port, 300 to its TCP probe port and 300 to its HTTP port. It keeps descriptors for its own work: the
    connections past each listener's cap are closed, a new Xid is judged, reported and saved, /healthz
    and /metrics answer, and the prober goes on probing its peer after the flood."""
    import resource

    from nodehealth.server import RESERVED_DESCRIPTORS
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 4096:
        pytest.skip(f"this test opens 1,800 connections; the open-file limit is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 4096), hard))
    port, tcp_port = free_port(), free_port()
    inventory = tmp_path / "inventory.json"
    inventory.write_text(json.dumps({"nodes": [{"name": "a", "leaf": "l0", "address": "127.0.0.2"},
                                               {"name": "b", "leaf": "l0", "address": "127.0.0.3"}]}))
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"pingmesh": {"port": port, "tcp_port": tcp_port, "probe_interval_seconds": 0.2,
                                               "ping_interval_seconds": 0.2, "timeout_seconds": 1.0}}))
    state = tmp_path / "state"
    d = daemon_factory(str(plain), str(state), "--config", str(config), "--node-name", "a",
                       "--probe-listen", f"127.0.0.2:{port}", "--probe-inventory", str(inventory),
                       interval=2.0, max_files=1024)
    peer = started_agent(f"127.0.0.3:{port}", "b")
    flood: list[socket.socket] = []
    try:
        d.wait_ready()
        assert wait_for(lambda: probes_answered(d) > 0, timeout=10), "the prober never reached its peer"
        flood += connect_all(("127.0.0.1", d.port), 300)
        flood += connect_all(("127.0.0.2", tcp_port), 300)
        pings = connect_all(("127.0.0.2", port), 1200, HTTP2_HELLO)
        flood += pings
        assert wait_all_heard(pings, timeout=10) == len(pings)  # answered with settings, or closed past the cap
        held = len(os.listdir(f"/proc/{d.proc.pid}/fd"))
        assert held <= 1024 - RESERVED_DESCRIPTORS, held

        seq = last_seq(plain) + 1
        append_kmsg(plain, XID79, seq, 348_000_000)

        def reported():
            code, body = d.get("/v1/report")
            return code == 200 and any(f["reason"] == "Xid79FallenOffBus" for f in json.loads(body)["findings"])
        assert wait_for(reported, timeout=10), "the Xid never reached /v1/report"
        passes = metric_value(d.get("/metrics")[1].decode(), "nodehealth_daemon_passes_total")
        assert wait_for(lambda: metric_value(d.get("/metrics")[1].decode(), "nodehealth_daemon_passes_total") > passes,
                        timeout=10), "no pass ran under the flood"
        findings = json.loads(d.get("/v1/report")[1])["findings"]
        assert [f["reason"] for f in findings if f["severity"] == "unknown"] == []  # every collector read its source
        assert wait_for(lambda: json.loads((state / "state.json").read_text())["kmsg"]["last_seq"] == seq,
                        timeout=10), "the state was not saved"
        assert d.get("/healthz") == (200, b"ok\n")
        code, body = d.get("/metrics")
        assert code == 200 and metric_value(body.decode(), "nodehealth_gpu_xid_events_total", xid="79") == 1
        # b"\xb2" is "²" to http.server (Latin-1): a digit to str.isdigit(), not to int().
        with socket.create_connection(("127.0.0.1", d.port), timeout=5) as s:
            s.sendall(b"GET /v1/pingmesh?windows=\xb2 HTTP/1.0\r\n\r\n")
            assert s.makefile("rb").readline().startswith(b"HTTP/1.0 200")

        while flood:
            flood.pop().close()
        answered = probes_answered(d)
        assert wait_for(lambda: probes_answered(d) >= answered + 3, timeout=10), "the prober stopped"
        text = d.get("/metrics")[1].decode()
        assert metric_value(text, "nodehealth_worker_up", worker="pingmesh-prober") == 1
        assert metric_value(text, "nodehealth_worker_restarts_total", worker="pingmesh-prober") == 0
        assert d.stop() < STOP_SECONDS
    finally:
        for s in flood:
            s.close()
        peer.stop(0)
    assert "Traceback" not in d.output()


ARENAS_SCRIPT = """
import ctypes, os, sys, threading
from nodehealth.daemon import share_malloc_arenas
took = share_malloc_arenas() if sys.argv[1] == "share" else None
gate = threading.Barrier(8)
def allocate():  # eight threads allocating at once, as the daemon's do
    gate.wait()
    kept = [bytearray(64 * 1024) for _ in range(50)]
    gate.wait()
threads = [threading.Thread(target=allocate) for _ in range(8)]
for t in threads: t.start()
for t in threads: t.join()
print(took, flush=True)
ctypes.CDLL(None).malloc_stats()  # one "Arena N:" paragraph per arena, to stderr
"""


@pytest.mark.parametrize("how, env, took, most", [("share", {}, True, 2),  # the daemon's own setting
                                                   ("share", {"MALLOC_ARENA_MAX": "4"}, False, 4),  # the operator's
                                                   ("leave", {}, None, 9)])  # glibc's own: an arena per thread
def test_the_daemons_threads_share_two_malloc_arenas(how, env, took, most):
    done = subprocess.run([sys.executable, "-c", ARENAS_SCRIPT, how], capture_output=True, text=True, timeout=60,
                          env={**os.environ, **env})
    arenas = len(re.findall(r"^Arena \d+:", done.stderr, re.M))
    assert done.stdout.strip() == str(took), done.stderr
    assert 1 <= arenas <= most and (how == "share" or arenas > 2), done.stderr
