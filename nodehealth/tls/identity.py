"""This process's mesh identity and what it makes: TLS contexts and gRPC credentials for mutual
TLS from the cluster CA, and the names a verified peer carries.

A name is a certificate's DNS subjectAltName: a node's certificate names the node (as the
inventory and `--node` know it), the controller's carries `tls.controller_name`. A client checks
that the server it reached carries the name of the node it meant to reach (it connects to an
address, and asks for the name); a server admits the names its caller allows.

The files are stat'ed at each use and read again when one changed, so cert-manager's rotation
reaches new connections without a restart; a rotation caught half-written keeps the last good
files (and says so once a minute) until the next change.
"""
from __future__ import annotations

import logging
import os
import ssl
import threading
from typing import Any

from nodehealth.host import read_bytes
from nodehealth.logs import RateLimitedLog

log = logging.getLogger("nodehealth.tls")
MAX_PEM_BYTES = 1 << 20  # a CA bundle of a few hundred certificates; more is the wrong file


class TLSError(Exception):
    pass


class Identity:
    def __init__(self, cfg: dict[str, Any]):
        """`cfg`: the `tls` section. TLSError when its files cannot be read or do not make a context."""
        self.ca_file, self.cert_file, self.key_file = cfg["ca_file"], cfg["cert_file"], cfg["key_file"]
        self.controller_name = str(cfg["controller_name"])
        self.generation = 0  # counts the loads: long-lived channels made before a change are made again
        self._lock = threading.Lock()
        self._stamp: tuple | None = None
        self._contexts: dict[str, ssl.SSLContext] = {}
        self._pem: tuple[bytes, bytes, bytes] = (b"", b"", b"")
        self._channel_credentials: tuple[int, Any] | None = None  # made once per generation: a probe asks each time
        self._trouble = RateLimitedLog(log)
        if not self._refresh():
            raise TLSError(self._why)

    # -- the files -----------------------------------------------------------------------------
    def _refresh(self) -> bool:
        """Load the files when they changed; False when the last try failed (the old ones stay)."""
        try:
            stamp = tuple((s.st_ino, s.st_mtime_ns, s.st_size) for s in map(os.stat, self._files()))
        except OSError as e:
            return self._failed(f"cannot read the TLS files: {e.strerror}: {e.filename}")
        with self._lock:
            if stamp == self._stamp:
                return True
            try:
                pem = tuple(_read(f) for f in (self.ca_file, self.cert_file, self.key_file))
                contexts = {kind: _context(kind, *self._files()) for kind in _KINDS}
            except (OSError, ssl.SSLError, ValueError) as e:
                return self._failed(f"the TLS files do not make a context: {e}")
            self._stamp, self._contexts, self._pem = stamp, contexts, pem  # type: ignore[assignment]
            self.generation += 1
        return True

    def _failed(self, why: str) -> bool:
        self._why = why
        if self._stamp is not None:
            self._trouble.warning("files", f"{why}; using the certificate loaded before")
        return False

    def _files(self) -> tuple[str, str, str]:
        return self.ca_file, self.cert_file, self.key_file

    # -- what it makes -------------------------------------------------------------------------
    def server_context(self, require_client: bool = False) -> ssl.SSLContext:
        """For a listener: its certificate, and a client's verified. By default the client may present
        none (a kubelet's probe): what a path needs is the route's to decide, by peer_names()."""
        self._refresh()
        return self._contexts["server-required" if require_client else "server"]

    def client_context(self, check_name: bool = True) -> ssl.SSLContext:
        """For a connection: its certificate presented, the server's verified against the CA and, by
        default, the name given as server_hostname; without, the caller checks peer_names()."""
        self._refresh()
        return self._contexts["client" if check_name else "client-any-name"]

    def names(self) -> list[str]:
        """The names this process's own certificate carries, as a peer would verify them: a handshake
        with itself in memory (the ssl module reads no certificate file otherwise)."""
        client_side, server_side = ssl.MemoryBIO(), ssl.MemoryBIO()
        client = self.client_context(check_name=False).wrap_bio(server_side, client_side)
        server = self.server_context().wrap_bio(client_side, server_side, server_side=True)
        for _ in range(8):  # a TLS 1.3 handshake takes two flights each way
            for end in (client, server):
                try:
                    end.do_handshake()
                except ssl.SSLWantReadError:
                    pass
        return peer_names(client)

    def check_name(self, name: str) -> None:
        """TLSError unless this process's certificate carries `name`: peers would refuse it, silently."""
        try:
            names = self.names()
        except ssl.SSLError as e:
            raise TLSError(f"the certificate does not verify against the CA: {e.reason or e}") from None
        if name not in names:
            raise TLSError(f"{self.cert_file} names {', '.join(names) or 'nobody'}, not {name}")

    def grpc_server_credentials(self) -> Any:
        """gRPC server credentials that require a client certificate from the CA, re-read per handshake."""
        import grpc

        seen = [self.generation]

        def config(pem: tuple[bytes, bytes, bytes]) -> Any:
            return grpc.ssl_server_certificate_configuration([(pem[2], pem[1])], root_certificates=pem[0])

        def fetch() -> Any:  # gRPC asks before each handshake; None keeps the current one
            self._refresh()
            if self.generation == seen[0]:
                return None
            seen[0] = self.generation
            return config(self._pem)

        return grpc.dynamic_ssl_server_credentials(config(self._pem), fetch, require_client_authentication=True)

    def grpc_channel_credentials(self) -> tuple[int, Any]:
        """(generation, credentials) for a channel: a channel made at an older generation is made again."""
        import grpc

        self._refresh()
        with self._lock:
            if self._channel_credentials is None or self._channel_credentials[0] != self.generation:
                ca, cert, key = self._pem
                self._channel_credentials = (self.generation, grpc.ssl_channel_credentials(ca, key, cert))
            return self._channel_credentials


def _read(path: str) -> bytes:
    data = read_bytes(path, MAX_PEM_BYTES + 1)
    if len(data) > MAX_PEM_BYTES:
        raise ValueError(f"{path} holds more than {MAX_PEM_BYTES} bytes: not a certificate or key file")
    return data


_KINDS = ("server", "server-required", "client", "client-any-name")


def _context(kind: str, ca_file: str, cert_file: str, key_file: str) -> ssl.SSLContext:
    client = kind.startswith("client")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT if client else ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(cert_file, key_file)
    ctx.load_verify_locations(cafile=ca_file)
    ctx.check_hostname = kind == "client"
    ctx.verify_mode = ssl.CERT_OPTIONAL if kind == "server" else ssl.CERT_REQUIRED
    return ctx


def peer_names(sock: Any) -> list[str]:
    """The DNS names of the verified certificate a TLS socket's peer presented ([] for none, or no TLS)."""
    getpeercert = getattr(sock, "getpeercert", None)
    cert = getpeercert() if getpeercert is not None else None
    return [value for kind, value in (cert or {}).get("subjectAltName", ()) if kind == "DNS"]


def grpc_peer_names(context: Any) -> list[str]:
    """The DNS names of a gRPC call's verified client certificate ([] without one)."""
    names = context.auth_context().get("x509_subject_alternative_name", [])
    return [n.decode("utf-8", "replace") if isinstance(n, bytes) else str(n) for n in names]


def load_identity(cfg: dict[str, Any], name: str | None = None) -> Identity | None:
    """The identity of the whole configuration's `tls` section: None when TLS is off; ConfigError
    naming what is wrong with its files, or, with `name`, when the certificate does not carry it."""
    from nodehealth.config import ConfigError

    if not cfg["tls"]["enabled"]:
        return None
    try:
        identity = Identity(cfg["tls"])
        if name is not None:
            identity.check_name(name)
    except TLSError as e:
        raise ConfigError(f"tls: {e}") from None
    return identity
