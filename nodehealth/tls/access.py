"""Who may read which path of the daemon's and the controller's HTTP (9456, 9458).

- `/healthz`: anyone (the kubelet's probe presents nothing).
- `/v1/pingmesh` with TLS on: only the controller's certificate (`tls.controller_name`); its summaries
  feed verdicts about other nodes.
- every other path (`/metrics`, `/v1/report`): when `daemon.token_file` names a file, a request
  carrying its token (`Authorization: Bearer`, Prometheus's `authorization.credentials_file`), or,
  with TLS on, any client certificate the cluster CA issued; else anyone.

The token file is read again when it changes (a rotated Secret); its token is compared in constant
time. A token file that cannot be read, or holds more than MAX_TOKEN_BYTES, admits nobody to the
guarded paths: never open by mistake.
"""
from __future__ import annotations

import hmac
import logging
import os
from typing import Any

from nodehealth.host import read_bytes
from nodehealth.logs import RateLimitedLog
from nodehealth.tls.identity import Identity, peer_names

log = logging.getLogger("nodehealth.server")

OPEN_PATHS = ("/healthz",)
MAX_TOKEN_BYTES = 64 << 10  # a bearer token, a JWT included, is a few KiB: more is the wrong file
CONTROLLER_PATHS = ("/v1/pingmesh",)


class Access:
    def __init__(self, token_file: str = "", controller_name: str | None = None):
        """`controller_name`: the controller's certificate name when TLS is on, else None."""
        self.token_file = token_file
        self.controller_name = controller_name
        self._stamp: tuple | None = None
        self._token: bytes | None = None
        self._trouble = RateLimitedLog(log)

    def refuse(self, path: str, authorization: str | None, peer_names: list[str]) -> int | None:
        """The status to refuse the request with (401: no credentials, 403: not these), or None."""
        if path in OPEN_PATHS:
            return None
        if path in CONTROLLER_PATHS and self.controller_name is not None:
            if self.controller_name in peer_names:
                return None
            return 403 if peer_names else 401
        if not self.token_file or (peer_names and self.controller_name is not None):
            return None
        token = self.token()
        given = (authorization or "").encode("latin-1", "replace")
        scheme, _, credentials = given.partition(b" ")
        if token and scheme.lower() == b"bearer" and hmac.compare_digest(credentials.strip(), token):
            return None
        return 401

    def token(self) -> bytes | None:
        """The token as the file holds it now (None: no file, or an empty one)."""
        try:
            s = os.stat(self.token_file)
            stamp = (s.st_ino, s.st_mtime_ns, s.st_size)
            if stamp != self._stamp:
                token = read_bytes(self.token_file, MAX_TOKEN_BYTES + 1)
                if len(token) > MAX_TOKEN_BYTES:
                    self._stamp, self._token = stamp, None
                    self._trouble.warning("token", f"HTTP: the token file {self.token_file} holds more than "
                                                   f"{MAX_TOKEN_BYTES} bytes, no token: the guarded paths admit nobody")
                    return None
                token = token.strip()
                self._stamp, self._token = stamp, token or None
                if not token:
                    self._trouble.warning("token", f"HTTP: the token file {self.token_file} is empty: "
                                                   "the guarded paths admit nobody")
        except OSError as e:
            self._stamp, self._token = None, None
            self._trouble.warning("token", f"HTTP: cannot read the token file {self.token_file}: {e.strerror}; "
                                           "the guarded paths admit nobody")
        return self._token


def http_options(cfg: dict[str, Any], identity: Identity | None) -> dict[str, Any]:
    """server.make_server's `tls` and `guard` for the whole configuration `cfg` and its identity."""
    access = Access(cfg["daemon"]["token_file"], identity.controller_name if identity is not None else None)

    def guard(path: str, headers: dict[str, str], connection: Any) -> int | None:  # header names lower-cased
        return access.refuse(path, headers.get("authorization"), peer_names(connection))

    return {"tls": identity.server_context if identity is not None else None, "guard": guard}
