"""netcheck's RDMA test between two agents: `rdma-bw` (nodehealth/rdma/bw.py) run on request.

The receiving agent checks its device (bw.preflight) and starts one rdma-bw server on its data
address; the sending agent runs the client against it and reports the average Gb/s. Each agent
finds its own device and RoCE GID index from its data address (the GID table lists the IPv4
addresses of the device's netdev), so that a node with several NICs tests the one its data address
is on. pyverbs is imported only when a test runs (by bw.py).
"""
from __future__ import annotations

import ipaddress
import os
import threading
import time
from dataclasses import dataclass

from nodehealth.host import HostPaths, list_dir, read_attr
from nodehealth.rdma import bw

IPV4_MAPPED = "0000:0000:0000:0000:0000:ffff:"
CONNECT_RETRY_SECONDS = 5.0  # the peer's server starts listening in a thread: retry refused connects this long
# A server waits this long for its client (which retries for CONNECT_RETRY_SECONDS); the next
# test's server waits as long for it to end, so a client that never came costs one test's delay,
# never a false failure of this node.
ACCEPT_SECONDS = CONNECT_RETRY_SECONDS + 2.0


@dataclass(frozen=True)
class Setup:
    """The verbs device one agent tests with."""

    device: str
    gid_index: int | None  # None: InfiniBand (LID)
    ib_port: int = bw.DEFAULT_IB_PORT
    port: int = bw.DEFAULT_PORT  # the rdma-bw out-of-band port on the data address
    size: int = bw.DEFAULT_SIZE

    def describe(self) -> str:
        return f"{self.device} port {self.ib_port}" + (f" GID {self.gid_index}" if self.gid_index is not None else "")


def _roce_gid(address: str) -> str:
    """The RoCE v2 GID of an IPv4 address as sysfs shows it."""
    packed = ipaddress.IPv4Address(address).packed
    return IPV4_MAPPED + f"{packed[0]:02x}{packed[1]:02x}:{packed[2]:02x}{packed[3]:02x}"


def find_setup(host: HostPaths, address: str, device: str | None = None, gid_index: int | None = None,
               ib_port: int = bw.DEFAULT_IB_PORT, port: int = bw.DEFAULT_PORT, size: int = bw.DEFAULT_SIZE
               ) -> Setup:
    """The device and GID index for the data `address`: given ones win; otherwise the device whose
    RoCE v2 GID table holds the address, or the first InfiniBand one. RdmaError when there is none."""
    found = bw.devices(host)
    if not found:
        raise bw.RdmaError("no RDMA device (/sys/class/infiniband is empty or absent)")
    if device is not None and device not in found:
        raise bw.RdmaError(f"no RDMA device {device!r} (found: {', '.join(found)})")
    candidates = [device] if device else found
    if gid_index is not None:
        return Setup(candidates[0], gid_index, ib_port, port, size)
    try:
        wanted = _roce_gid(address)
    except ValueError:
        wanted = None  # a name or IPv6: only an InfiniBand port, or a GID index given, can do
    for dev in candidates:
        port_dir = host.sys("class", "infiniband", dev, "ports", str(ib_port))
        if read_attr(os.path.join(port_dir, "link_layer")) == "InfiniBand":
            return Setup(dev, None, ib_port, port, size)
        for name in sorted(list_dir(os.path.join(port_dir, "gids")), key=lambda n: int(n) if n.isdigit() else -1):
            if (wanted and read_attr(os.path.join(port_dir, "gids", name)) == wanted
                    and read_attr(os.path.join(port_dir, "gid_attrs", "types", name)) == "RoCE v2"):
                return Setup(dev, int(name), ib_port, port, size)
    raise bw.RdmaError(f"no RoCE v2 GID for {address} on {', '.join(candidates)}: give the device and GID index")


def _options(setup: Setup, seconds: float) -> bw.Options:
    return bw.Options(setup.device, setup.ib_port, setup.gid_index, setup.size, duration=seconds, port=setup.port)


def preflight(setup: Setup, host: HostPaths | None = None) -> None:
    """rdma-bw's checks of this node's device (port ACTIVE, GID, uverbs, memlock); RdmaError."""
    opts = _options(setup, 1.0)
    bw.preflight(opts, host or HostPaths("/"), max(opts.size, bw.PAGE))


class Server:
    """At most one rdma-bw server per agent at a time (rounds put a node in one test at a time)."""

    def __init__(self, setup: Setup, listen: str, host: HostPaths | None = None):
        self.setup = setup
        self.listen = listen
        self.host = host or HostPaths("/")
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def start(self, seconds: float) -> dict:
        """Preflight, then serve one client in a thread; the answer names the port (or the error)."""
        opts = _options(self.setup, seconds)
        with self._lock:
            if self._thread is not None:
                self._thread.join(ACCEPT_SECONDS)
                if self._thread.is_alive():
                    return {"error": "busy: an rdma-bw server is still running"}
            try:
                preflight(self.setup, self.host)
            except bw.RdmaError as e:
                return {"error": str(e)}
            self._thread = threading.Thread(target=self._serve, args=(opts,), daemon=True)
            self._thread.start()
        return {"port": opts.port, "device": self.setup.describe()}

    def _serve(self, opts: bw.Options) -> None:
        try:
            bw.server(opts, listen=self.listen, host=self.host, timeout=ACCEPT_SECONDS)
        except (bw.RdmaError, OSError):
            pass  # the client sees the same failure and reports it


def client(setup: Setup, server_host: str, server_port: int, seconds: float, timeout: float,
           host: HostPaths | None = None) -> float:
    """Write to the peer's server for `seconds`; its average Gb/s (RdmaError otherwise)."""
    opts = bw.Options(setup.device, setup.ib_port, setup.gid_index, setup.size, duration=seconds, port=server_port)
    give_up = time.monotonic() + CONNECT_RETRY_SECONDS
    while True:
        try:
            return bw.client(server_host, opts, host=host, timeout=timeout).bw_avg_gbps
        except bw.RdmaError as e:
            if not str(e).startswith("cannot reach the rdma-bw server") or time.monotonic() > give_up:
                raise
            time.sleep(0.2)
