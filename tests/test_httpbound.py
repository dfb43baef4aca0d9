"""The bounded HTTP server on its own: deadlines, waiting connections, the worker bound, closing."""
from __future__ import annotations

import socket
import threading
import time

import pytest

from nodehealth import server as httpbound


class Slow(httpbound.BoundedHandler):
    pause = threading.Event()

    def do_GET(self) -> None:  # noqa: N802
        if self.path == "/slow":
            self.pause.wait(5)
        body = b"ok\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def server():
    Slow.pause = threading.Event()
    srv = httpbound.BoundedHTTPServer(("127.0.0.1", 0), Slow, workers=1, request_seconds=1.0)
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
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


def test_waiting_connections_are_bounded_oldest_dropped_first(server, monkeypatch):
    monkeypatch.setattr(httpbound, "MAX_PENDING", 4)
    idle = [socket.create_connection(server.server_address[:2], timeout=3) for _ in range(6)]
    time.sleep(0.3)
    assert idle[0].recv(10) == b"" and idle[1].recv(10) == b""  # the two oldest were dropped
    assert get(server, "/").startswith(b"HTTP/1.0 200")
    for s in idle:
        s.close()
