"""TLS on the non-blocking readers of our listeners (the daemon's HTTP, netcheck's agent): one
thread steps every connection's handshake and reads its request without a thread per client, so a
client that stalls its handshake costs what one that stalls its request costs, under the same
deadline."""
from __future__ import annotations

import selectors
import socket
import ssl


def handshake_step(sock: ssl.SSLSocket) -> int | None:
    """One step of a non-blocking handshake: None when it is done, else the selector event it waits
    for. Raises OSError (ssl.SSLError among them: no certificate, a wrong CA, not TLS) when it failed."""
    try:
        sock.do_handshake()
    except ssl.SSLWantReadError:
        return selectors.EVENT_READ
    except ssl.SSLWantWriteError:
        return selectors.EVENT_WRITE
    except ValueError as e:  # a socket closed under it
        raise OSError(str(e)) from None
    return None


def receive(sock: socket.socket, limit: int) -> bytes | None:
    """What a non-blocking socket has now (b"" at its end, an error included), None when nothing yet.
    A TLS socket is read until it wants more, or past `limit`: what it decrypted sits in its buffer,
    unseen by select."""
    data = bytearray()
    while True:
        try:
            chunk = sock.recv(65536)
        except (BlockingIOError, InterruptedError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
            return bytes(data) if data else None
        except OSError:
            return bytes(data)
        if not chunk:
            return bytes(data)
        data += chunk
        if len(data) > limit or not isinstance(sock, ssl.SSLSocket):
            return bytes(data)
