"""The bounded HTTP server on its own: deadlines, waiting connections, the worker bound, closing."""
from __future__ import annotations

import os
import re
import socket
import threading
import time

import pytest
from conftest import STOP_SECONDS, free_port, http_get, wait_for

from nodehealth import server as httpbound


class Slow:
    """A respond function whose /slow holds its worker until `pause` is set."""

    pause = threading.Event()

    @classmethod
    def respond(cls, request: httpbound.Request) -> httpbound.Reply:
        if request.path == "/slow":
            cls.pause.wait(5)
        return 200, b"ok\n", "text/plain", {}


@pytest.fixture
def server():
    Slow.pause = threading.Event()
    srv = httpbound.BoundedHTTPServer(("127.0.0.1", 0), Slow.respond, "test", workers=1, request_seconds=1.0)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    Slow.pause.set()
    srv.shutdown()
    srv.server_close()


def get(srv, path: str, timeout: float = 3.0) -> bytes:
    with socket.create_connection(srv.server_address[:2], timeout=timeout) as s:
        s.sendall(f"GET {path} HTTP/1.0\r\n\r\n".encode())
        chunks = []
        while True:
            data = s.recv(4096)
            if not data:
                return b"".join(chunks)
            chunks.append(data)


def test_a_request_head_sent_in_pieces_is_answered(server):
    with socket.create_connection(server.server_address[:2], timeout=3) as s:
        for byte in b"GET / HTTP/1.0\r\n\r\n":
            s.sendall(bytes([byte]))
        assert s.recv(100).startswith(b"HTTP/1.0 200")


def test_a_client_is_dropped_at_its_total_deadline(server):
    with socket.create_connection(server.server_address[:2], timeout=5) as s:
        t0 = time.monotonic()
        s.sendall(b"GET / HTTP/1.0\r\n")  # and never the blank line
        assert s.recv(100) == b""
        assert 0.8 < time.monotonic() - t0 < 3.0


def test_past_the_worker_bound_a_complete_request_is_refused_at_once(server):
    held = threading.Thread(target=get, args=(server, "/slow"))
    held.start()
    time.sleep(0.3)  # the one worker is now busy
    t0 = time.monotonic()
    assert get(server, "/") == b""
    assert time.monotonic() - t0 < 0.5
    Slow.pause.set()
    held.join()
    assert get(server, "/").startswith(b"HTTP/1.0 200")


def test_waiting_connections_are_bounded_oldest_dropped_first():
    server = httpbound.BoundedHTTPServer(("127.0.0.1", 0), Slow.respond, "test", workers=1, request_seconds=30.0,
                                         max_pending=4)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    idle = [socket.create_connection(server.server_address[:2], timeout=3) for _ in range(6)]
    try:
        assert idle[0].recv(10) == b"" and idle[1].recv(10) == b""  # the two oldest were dropped, long before 30 s
        assert get(server, "/").startswith(b"HTTP/1.0 200")
        assert server.dropped["waiting"] == 3  # and, for the request, the next oldest
    finally:
        for s in idle:
            s.close()
        server.shutdown()
        server.server_close()


def test_connections_dropped_while_their_data_is_ready_leave_the_reader_alive():
    """A batch of ready sockets may hold one that the same batch's wake-up just dropped (past
    max_pending): the reader skips it instead of dying, so the server keeps answering."""
    server = httpbound.BoundedHTTPServer(("127.0.0.1", 0), Slow.respond, "test", workers=1, request_seconds=30.0,
                                         max_pending=1)
    serving = threading.Thread(target=server.serve_forever, daemon=True)
    serving.start()
    try:
        for _ in range(300):  # each sends its request at once: its data is ready as it is dropped
            with socket.create_connection(server.server_address[:2], timeout=3) as s:
                s.sendall(b"GET / HTTP/1.0\r\n")
        assert get(server, "/").startswith(b"HTTP/1.0 200")
        assert serving.is_alive()
    finally:
        server.shutdown()
        server.server_close()


def status(address, path: bytes, timeout: float = 5.0) -> bytes:
    """The status line's code, or b"" when the server closed the connection without one."""
    with socket.create_connection(address, timeout=timeout) as s:
        s.sendall(b"GET " + path + b" HTTP/1.0\r\n\r\n")
        return s.makefile("rb").readline()[9:12]


@pytest.fixture
def routed():
    """make_server with a heavy path that holds its worker until released, and a path that raises."""
    release = threading.Event()
    held = []

    def heavy(query: str) -> httpbound.Answer:
        held.append(query)
        release.wait(10)
        return 200, b"{}\n", "application/json"

    def broken(query: str) -> httpbound.Answer:
        return 200, str(int(query.partition("=")[2])).encode(), "text/plain"  # "²" passes isdigit(), not int()
    routes = {"/v1/pingmesh": heavy, "/v1/broken": broken, "/metrics": lambda _: (200, b"m 1\n", "text/plain"),
              "/healthz": lambda _: (200, b"ok\n", "text/plain")}
    srv = httpbound.make_server("127.0.0.1:0", lambda: routes, "test")
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv, release, held
    release.set()
    srv.shutdown()
    srv.server_close()


def test_clients_hammering_a_heavy_path_leave_workers_for_the_scrape_and_the_kubelet(routed):
    srv, release, held = routed
    address = srv.server_address[:2]
    hammer = [threading.Thread(target=status, args=(address, b"/v1/pingmesh?n=%d" % n)) for n in
              range(httpbound.MAX_CONCURRENT_REQUESTS)]
    for t in hammer:
        t.start()
    shared = httpbound.MAX_CONCURRENT_REQUESTS - httpbound.PRIORITY_WORKERS
    assert wait_for(lambda: len(held) == shared and srv.dropped["busy"] == httpbound.PRIORITY_WORKERS)
    assert [status(address, p) for p in (b"/metrics", b"/healthz", b"/metrics")] == [b"200"] * 3
    release.set()
    for t in hammer:
        t.join(10)
    assert status(address, b"/v1/pingmesh") == b"200"


def test_a_route_that_fails_answers_500_and_logs_one_counted_line_not_a_traceback(routed, caplog):
    import logging
    caplog.set_level(logging.DEBUG, "nodehealth.server")
    srv, _, _ = routed
    for _ in range(10):
        assert status(srv.server_address[:2], b"/v1/broken?x=\xb2") == b"500"
    assert srv.errors == 10
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(lines) == 1 and "ValueError" in lines[0] and "Traceback" not in caplog.text, lines
    from nodehealth.exporter import render
    assert "nodehealth_http_errors_total 10\n" in render(srv.metrics()).decode()


@pytest.mark.parametrize("limit, wants, caps", [
    (1024, {"http": 256, "pingmesh": 256}, {"http": 256, "pingmesh": 256}),  # room for both and the reserve
    (512, {"http": 256, "pingmesh": 256}, {"http": 128, "pingmesh": 128}),  # shared by what each wants
    (300, {"http": 256}, {"http": 44}),
    (100, {"http": 256, "pingmesh": 256}, {"http": 8, "pingmesh": 8}),  # a floor: the listener still answers
])
def test_listeners_leave_descriptors_for_the_process_own_work(limit, wants, caps):
    assert httpbound.RESERVED_DESCRIPTORS == 256
    assert httpbound.share_descriptors(limit, wants) == caps


def test_the_controller_answers_healthz_past_a_slow_client_and_stops_at_once(tmp_path):
    """`nodehealth controller` serves through this server: a client that drips its request holds
    neither /healthz (the kubelet would kill the pod) nor the stop."""
    import json
    import signal
    import subprocess
    import sys
    port = free_port()
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"pingmesh": {"enabled": False}}))
    proc = subprocess.Popen([sys.executable, "-m", "nodehealth.cli", "controller", "--config", str(config),
                             "--listen", f"127.0.0.1:{port}"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    slow = None
    try:
        def answers() -> bool:
            try:
                return http_get(f"http://127.0.0.1:{port}/healthz", timeout=1)[0] == 200
            except OSError:
                return proc.poll() is not None
        assert wait_for(answers, 15) and proc.poll() is None
        slow = socket.create_connection(("127.0.0.1", port), timeout=5)
        slow.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # and the rest never
        assert http_get(f"http://127.0.0.1:{port}/healthz", timeout=2) == (200, b"idle: pingmesh.enabled is false\n")
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(STOP_SECONDS + 5) == 0
        assert time.monotonic() - t0 < STOP_SECONDS
    finally:
        if slow is not None:
            slow.close()
        proc.kill()
        proc.wait()


def answer(address, request: bytes, timeout: float = 5.0) -> bytes:
    """Everything the server sent back to one request before it closed the connection."""
    with socket.create_connection(address, timeout=timeout) as s:
        s.sendall(request)
        chunks = []
        while data := s.recv(65536):
            chunks.append(data)
        return b"".join(chunks)


@pytest.mark.parametrize("request_head, code", [
    (b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n", b"200"),
    (b"GET /metrics HTTP/1.0\n\n", b"200"),  # bare newlines, as http.server took them
    (b"POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n", b"501"),
    (b"GET /metrics HTTP/2.0\r\n\r\n", b"505"),
    (b"GET /metrics\r\n\r\n", b"400"),  # HTTP/0.9
    (b"GET /metrics HTTQ/1.1\r\n\r\n", b"400"),
    (b"GET /metrics HTTP/1.\xb2\r\n\r\n", b"400"),  # a digit to isdigit(), not to int()
    (b"GET /metrics HTTP/" + b"1" * 5000 + b".0\r\n\r\n", b"400"),  # past int()'s 4,300 digits: no 500
    (b"GET /metrics HTTP/1.1\r\nNo colon here\r\n\r\n", b"400"),
    (b"GET /metrics HTTP/1.1\r\nHost : x\r\n\r\n", b"400"),  # space before the colon (RFC 9112)
    (b"GET /metrics HTTP/1.1\r\nHost: x\r\n folded\r\n\r\n", b"400"),  # obsolete line folding
    (b"GET /metrics HTTP/1.1\r\n" + b"X: y\r\n" * 101 + b"\r\n", b"431"),
])
def test_a_request_head_is_parsed_or_refused_with_its_status(routed, request_head, code):
    srv, _, _ = routed
    status_line = answer(srv.server_address[:2], request_head).split(b"\r\n", 1)[0]
    assert status_line[:12] == b"HTTP/1.0 " + code, status_line


def test_an_answer_has_its_length_type_and_server_and_head_has_no_body(routed):
    srv, _, _ = routed
    got = answer(srv.server_address[:2], b"GET /metrics HTTP/1.1\r\n\r\n")
    head, _, body = got.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    assert lines[0] == "HTTP/1.0 200 OK" and body == b"m 1\n"
    fields = dict(line.split(": ", 1) for line in lines[1:])
    assert fields["Content-Length"] == "4" and fields["Content-Type"] == "text/plain" and fields["Server"] == "test"
    assert fields["Date"].endswith(" GMT")
    head_only = answer(srv.server_address[:2], b"HEAD /metrics HTTP/1.1\r\n\r\n")
    assert head_only.endswith(b"\r\n\r\n") and b"Content-Length: 4\r\n" in head_only
    refused = answer(srv.server_address[:2], b"HEAD /metrics HTTP/1.1\r\n" + b"X: y\r\n" * 101 + b"\r\n")
    assert refused.startswith(b"HTTP/1.0 431") and refused.endswith(b"\r\n\r\n")  # no body to a HEAD either
    assert srv.errors == 0


def test_the_guard_reads_header_names_in_any_case(tmp_path):
    seen = []

    def guard(path, headers, connection):
        seen.append(headers.get("authorization"))
        return None if headers.get("authorization") == "Bearer t" else 401
    srv = httpbound.make_server("127.0.0.1:0", lambda: {"/metrics": lambda _: (200, b"m 1\n", "text/plain")}, "test",
                                guard=guard)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        address = srv.server_address[:2]
        assert status(address, b"/metrics") == b"401"
        got = answer(address, b"GET /metrics HTTP/1.1\r\nauthORIZATION: Bearer t\r\n\r\n")
        assert got.startswith(b"HTTP/1.0 200") and seen == [None, "Bearer t"]
        assert b"WWW-Authenticate: Bearer\r\n" in answer(address, b"GET /metrics HTTP/1.1\r\n\r\n")
    finally:
        srv.shutdown()
        srv.server_close()


OUT_OF_DESCRIPTORS = """
import logging, os, resource, sys
from nodehealth import exporter, server
logging.basicConfig(stream=sys.stderr)
srv = None
routes = {"/healthz": lambda q: (200, b"ok\\n", "text/plain"),
          "/metrics": lambda q: (200, exporter.render(srv.metrics()), exporter.CONTENT_TYPE)}
srv = server.make_server("127.0.0.1:0", lambda: routes, "test", request_seconds=60)
hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 6, hard))
print(srv.server_address[1], flush=True)
srv.serve_forever()
"""


def test_out_of_descriptors_the_server_pauses_accepting_without_spinning_and_then_serves_again():
    """Accept fails with EMFILE while the connection waits in the listener, which stays readable: the
    serving thread leaves the listener alone a while (ACCEPT_PAUSE_SECONDS) instead of spinning on it,
    and serves again once descriptors are free."""
    import subprocess
    import sys
    proc = subprocess.Popen([sys.executable, "-c", OUT_OF_DESCRIPTORS], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    idle = []
    try:
        port = int(proc.stdout.readline())
        idle = [socket.create_connection(("127.0.0.1", port), timeout=3) for _ in range(12)]  # more than it may hold
        assert "cannot accept a connection: Too many open files" in proc.stderr.readline()
        with open(f"/proc/{proc.pid}/stat") as f:
            before = sum(map(int, f.read().rsplit(")", 1)[1].split()[11:13]))
        t0 = time.monotonic()
        with pytest.raises(OSError):  # a request meanwhile is not answered (it waits in the backlog)
            socket.create_connection(("127.0.0.1", port), timeout=1).recv(1)
        with open(f"/proc/{proc.pid}/stat") as f:
            spent = (sum(map(int, f.read().rsplit(")", 1)[1].split()[11:13])) - before) / os.sysconf("SC_CLK_TCK")
        assert spent < 0.3 * (time.monotonic() - t0), spent  # a spinning thread would take the whole second
        for s in idle:
            s.close()
        assert wait_for(lambda: status(("127.0.0.1", port), b"/healthz", timeout=2) == b"200", 10)
        _, body = http_get(f"http://127.0.0.1:{port}/metrics")
        assert re.search(rb'nodehealth_http_connections_dropped_total\{reason="descriptors"\} [1-9]', body), body
    finally:
        for s in idle:
            s.close()
        proc.kill()
        proc.wait()


def test_one_request_at_a_time_is_answered_by_the_thread_idle_last_even_after_a_burst(caplog):
    workers = httpbound.Workers("t")
    release = threading.Event()
    names = []
    done = threading.Semaphore(0)

    def job(wait: bool) -> None:
        names.append(threading.current_thread().name)
        if wait:
            release.wait(5)
        done.release()
    try:
        for _ in range(4):  # a burst: four at once need four threads
            workers.submit(job, True)
        assert wait_for(lambda: len(names) == 4) and len(set(names)) == 4
        release.set()
        for _ in range(4):
            assert done.acquire(timeout=5)
        names.clear()
        for _ in range(10):  # then one at a time, as a scrape comes
            workers.submit(job, False)
            assert done.acquire(timeout=5)
            assert wait_for(lambda: len(workers._idle) == 4)  # back among the idle before the next
        assert len(set(names)) == 1, names

        def broken() -> None:
            raise ValueError("a bug")
        workers.submit(broken)
        assert wait_for(lambda: len(workers._idle) == 4)  # the thread logged it and is idle again
        assert "an HTTP worker's job failed" in caplog.text
    finally:
        release.set()
        workers.close()
    with pytest.raises(RuntimeError):
        workers.submit(job, False)


def test_a_slot_comes_back_only_once_its_thread_is_idle_so_threads_stay_within_the_slots():
    workers = httpbound.Workers("t")
    idle_then = []
    try:
        for _ in range(20):
            done = threading.Event()
            workers.submit(lambda: None, then=lambda done=done: (idle_then.append(len(workers._idle)), done.set()))
            assert done.wait(5)
        assert idle_then == [1] * 20 and workers._started == 1  # idle again before `then`: one thread did all
    finally:
        workers.close()


def test_serve_forever_after_server_close_returns_and_after_shutdown_serves_again():
    srv = httpbound.BoundedHTTPServer(("127.0.0.1", 0), Slow.respond, "test", workers=1, request_seconds=1.0)
    for _ in range(2):  # served, shut down, served again, as socketserver allows
        thread = threading.Thread(target=srv.serve_forever, daemon=True)
        thread.start()
        assert get(srv, "/").startswith(b"HTTP/1.0 200")
        srv.shutdown()
        thread.join(5)
        assert not thread.is_alive()
    srv.server_close()
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    thread.join(5)
    assert not thread.is_alive()
