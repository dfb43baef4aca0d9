"""HTTP/1.x on the wire for our listeners' few GET routes: a request head parsed (parse_head) and an
answer written whole (reply_bytes). Our requests are a GET or HEAD line and a few headers, which
http.server's handler read with the e-mail package's header parser, and it wrote an answer in two
writes. server.py bounds who may send what, and for how long."""
from __future__ import annotations

import email.utils
import socket
from http import HTTPStatus

MAX_HEADERS = 100  # as http.client allows: past it, 431

Reply = tuple[int, bytes, str, dict[str, str]]  # status, body, content type, extra headers


class Request:
    """A request head as the workers parse it: header names lower-cased, the target's path apart from its query."""

    __slots__ = ("method", "path", "query", "headers", "connection")

    def __init__(self, method: str, path: str, query: str, headers: dict[str, str], connection: socket.socket):
        self.method, self.path, self.query, self.headers, self.connection = method, path, query, headers, connection


class BadRequest(Exception):
    """A head that is not a GET or HEAD request we can read: answered with `status`, no route runs."""

    def __init__(self, status: int, why: str):
        super().__init__(why)
        self.status = status


def parse_head(head: bytes, connection: socket.socket) -> Request:
    """`METHOD TARGET HTTP/1.x` and `Name: value` lines up to the blank one (bytes as latin-1, as http.server
    reads them). Raises BadRequest: 400 for what is not such a head, 431 past MAX_HEADERS, 501 for a method
    other than GET or HEAD, 505 for HTTP/2 and later."""
    lines = head.decode("latin-1").split("\n")
    words = lines[0].rstrip("\r").split()
    if len(words) != 3:
        raise BadRequest(400, "a request line is METHOD TARGET VERSION")
    method, target, version = words
    major, dot, minor = version[5:].partition(".")
    if not (version.startswith("HTTP/") and dot and major.isdigit() and minor.isdigit()
            and major.isascii() and minor.isascii() and len(major) <= 10 and len(minor) <= 10):
        raise BadRequest(400, f"not an HTTP version: {version[:20]!r}")
    if int(major) >= 2:
        raise BadRequest(505, "HTTP/1.x only")
    if method not in ("GET", "HEAD"):
        raise BadRequest(501, f"unsupported method {method[:20]!r}")
    headers: dict[str, str] = {}
    for number, line in enumerate(lines[1:], 1):
        line = line.rstrip("\r")
        if not line:
            break
        name, colon, value = line.partition(":")
        if not colon or not name or name != name.strip():  # a folded line starts with white space
            raise BadRequest(400, "a header line is NAME: VALUE")
        if number > MAX_HEADERS:
            raise BadRequest(431, f"more than {MAX_HEADERS} headers")
        headers.setdefault(name.lower(), value.strip())  # the first of a repeated name, as http.server read it
    path, _, query = target.partition("?")
    return Request(method, path, query, headers, connection)


def reply_bytes(reply: Reply, version: str, head_only: bool) -> bytes:
    """The whole answer, status line to body, for one sendall (http.server wrote the head and the body apart)."""
    status, body, content_type, extra = reply
    lines = [f"HTTP/1.0 {status} {_PHRASES.get(status, '')}", f"Server: {version}",
             f"Date: {email.utils.formatdate(usegmt=True)}", *(f"{k}: {v}" for k, v in extra.items()),
             f"Content-Type: {content_type}", f"Content-Length: {len(body)}", "", ""]
    head = "\r\n".join(lines).encode("latin-1")
    return head if head_only else head + body


_PHRASES = {s.value: s.phrase for s in HTTPStatus}


def request_path(head: bytes) -> str:
    """The path of a request head's first line, without its query ("" when it has none)."""
    parts = head.split(b"\n", 1)[0].split(b" ")
    return parts[1].split(b"?", 1)[0].decode("latin-1") if len(parts) >= 2 else ""
