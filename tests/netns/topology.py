"""A real leaf-spine network on one machine: network namespaces as nodes, bridges as leaves.

    node ns (eth0 10.77.L.N/24) --veth-- leaf bridge br<L> --+
    node ns ...                                              +-- spine: the fabric namespace routes
    node ns (eth0 10.77.M.N/24) --veth-- leaf bridge br<M> --+   between the leaf subnets

Every node also has a management interface (mgmt0, 10.78.M.N/24, M from the process id, so that
topologies of concurrent test runs never share a route) on a bridge in the test's own
namespace: the test reads each daemon's HTTP port through it, so faults on the data network
never hide what the agents report, as in a cluster with a separate management network.

Faults use the kernel's own tools, as the issue asks: nftables `numgen random` drops where
packets are received (inside the node for what reaches it, on the fabric's ingress of its veth
for what it sends: a drop on the sending side would come back to the sender as ENOBUFS and be
sent again), `ip link set down`, tbf in both directions, and forward-chain drops in the fabric
for a leaf's uplink, a whole leaf, or one leaf-to-leaf path. Everything is torn down in
`close()`, also when a test fails; names carry the creating process's id so runs never collide.
"""
from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass


class Unavailable(Exception):
    """Namespaces, bridges or nftables cannot be made here (not root, no CAP_NET_ADMIN, no tools)."""


def sh(*args: str, ns: str | None = None, check: bool = True, stdin: str | None = None) -> str:
    cmd = (["ip", "netns", "exec", ns] if ns else []) + list(args)
    p = subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=30)
    if check and p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {p.stderr.strip() or p.stdout.strip()}")
    return p.stdout


@dataclass(frozen=True)
class Node:
    name: str  # also the namespace's suffix
    leaf: int
    ns: str
    address: str  # data network (rail 0)
    mgmt: str  # management network
    port: str  # the veth end in the fabric namespace


class Topology:
    def __init__(self, leaves: int, per_leaf: int):
        self.tag = f"nh{os.getpid() % 100000}"
        self.mgmt_net = f"10.78.{os.getpid() % 250}"  # this run's management subnet in the test's namespace
        self.fabric = f"{self.tag}fab"
        self.mgmt_bridge = f"{self.tag}mg"
        self.leaves = leaves
        self.nodes: list[Node] = []
        self.namespaces: list[str] = []
        self.links: list[str] = []  # in this namespace, to delete
        for leaf in range(leaves):
            for i in range(per_leaf):
                index = leaf * per_leaf + i
                name = f"n{leaf}{i:02d}"
                self.nodes.append(Node(name, leaf, f"{self.tag}{name}", f"10.77.{leaf}.{i + 1}",
                                       f"{self.mgmt_net}.{index + 1}", f"v{self.tag}{name}"[:15]))

    def leaf_name(self, leaf: int) -> str:
        return f"leaf{leaf}"

    def bridge(self, leaf: int) -> str:
        return f"br{leaf}"

    # -- building ------------------------------------------------------------------------------
    def build(self) -> Topology:
        try:
            self._netns(self.fabric)
        except (RuntimeError, OSError) as e:
            raise Unavailable(f"cannot create a network namespace: {e}") from None
        try:
            for cmd in ("nft", "tc"):
                sh(cmd, "--version" if cmd == "nft" else "-V")
        except (RuntimeError, OSError) as e:
            raise Unavailable(f"a kernel tool is missing: {e}") from None
        f = self.fabric
        sh("sysctl", "-qw", "net.ipv4.ip_forward=1", ns=f)
        # Bridged frames must not pass the IP hooks (br_netfilter), or a leaf's uplink rules would
        # also drop traffic inside the leaf.
        sh("sysctl", "-qw", "net.bridge.bridge-nf-call-iptables=0", ns=f, check=False)
        sh("ip", "link", "set", "lo", "up", ns=f)
        for leaf in range(self.leaves):
            br = self.bridge(leaf)
            sh("ip", "link", "add", br, "type", "bridge", ns=f)
            sh("ip", "addr", "add", f"10.77.{leaf}.254/24", "dev", br, ns=f)
            sh("ip", "link", "set", br, "up", ns=f)
        sh("ip", "link", "add", self.mgmt_bridge, "type", "bridge")
        self.links.append(self.mgmt_bridge)
        sh("ip", "addr", "add", f"{self.mgmt_net}.254/24", "dev", self.mgmt_bridge)
        sh("ip", "link", "set", self.mgmt_bridge, "up")
        for n in self.nodes:
            self._netns(n.ns)
            sh("ip", "link", "set", "lo", "up", ns=n.ns)
            sh("ip", "link", "add", "eth0", "netns", n.ns, "type", "veth", "peer", "name", n.port, "netns", f)
            sh("ip", "link", "set", n.port, "master", self.bridge(n.leaf), "up", ns=f)
            sh("ip", "addr", "add", f"{n.address}/24", "dev", "eth0", ns=n.ns)
            sh("ip", "link", "set", "eth0", "up", ns=n.ns)
            sh("ip", "route", "add", "default", "via", f"10.77.{n.leaf}.254", ns=n.ns)
            mg = f"m{n.ns}"[:15]
            sh("ip", "link", "add", mg, "type", "veth", "peer", "name", "mgmt0", "netns", n.ns)
            self.links.append(mg)
            sh("ip", "link", "set", mg, "master", self.mgmt_bridge, "up")
            sh("ip", "addr", "add", f"{n.mgmt}/24", "dev", "mgmt0", ns=n.ns)
            sh("ip", "link", "set", "mgmt0", "up", ns=n.ns)
        return self

    def _netns(self, name: str) -> None:
        sh("ip", "netns", "add", name)
        self.namespaces.append(name)

    def close(self) -> None:
        """Remove everything this topology made; never raises."""
        for link in self.links:
            sh("ip", "link", "del", link, check=False)
        for ns in reversed(self.namespaces):
            sh("ip", "netns", "del", ns, check=False)
        self.links, self.namespaces = [], []

    def inventory(self) -> dict:
        return {"nodes": [{"name": n.name, "leaf": self.leaf_name(n.leaf), "pod": "pod0", "address": n.address}
                          for n in self.nodes]}

    def node(self, name: str) -> Node:
        return next(n for n in self.nodes if n.name == name)

    # -- faults --------------------------------------------------------------------------------
    def node_loss(self, name: str, percent: int) -> None:
        """Random loss of what the node receives and of what it sends on its data port (eth0), dropped at the
        receivers; its management port stays sound, as a lossy NIC leaves the control network alone."""
        n = self.node(name)
        sh("nft", "-f", "-", ns=n.ns, stdin=_chain("inet nhfault", "input", "type filter hook input priority -10",
                                                   f'iifname "eth0" {_drop(percent)}'))
        sh("nft", "-f", "-", ns=self.fabric,
           stdin=_chain(f"netdev nhfault_{n.name}", "ingress",
                        f'type filter hook ingress device "{n.port}" priority -10',
                        _drop(percent)))

    def link_down(self, name: str) -> None:
        sh("ip", "link", "set", self.node(name).port, "down", ns=self.fabric)

    def rate_limit(self, name: str, rate: str = "16kbit", burst: str = "2kb") -> None:
        """A tbf on both ends of the node's cable (in place of one there): what exceeds the rate
        waits, then drops. A fast rate needs a burst of a few timer ticks' worth."""
        n = self.node(name)
        for dev, ns in (("eth0", n.ns), (n.port, self.fabric)):
            sh("tc", "qdisc", "replace", "dev", dev, "root", "tbf", "rate", rate, "burst", burst, "latency", "50ms",
               ns=ns)

    def forward_loss(self, rule: str, percent: int) -> None:
        """Drop forwarded packets matching `rule` (e.g. `iifname "br1"`) in the spine."""
        sh("nft", "-f", "-", ns=self.fabric, stdin=_chain("inet nhspine", "forward",
                                                          "type filter hook forward priority -10",
                                                          f"{rule} {_drop(percent)}"))

    def leaf_uplink_loss(self, leaf: int, percent: int) -> None:
        br = self.bridge(leaf)
        self.forward_loss(f'iifname "{br}"', percent)
        self.forward_loss(f'oifname "{br}"', percent)

    def path_loss(self, src: int, dst: int, percent: int) -> None:
        self.forward_loss(f'iifname "{self.bridge(src)}" oifname "{self.bridge(dst)}"', percent)

    def clear_faults(self) -> None:
        """Back to a clean network: no nftables rules, links up, no qdiscs."""
        sh("nft", "flush", "ruleset", ns=self.fabric)
        for n in self.nodes:
            sh("nft", "flush", "ruleset", ns=n.ns)
            sh("ip", "link", "set", n.port, "up", ns=self.fabric)
            sh("tc", "qdisc", "del", "dev", "eth0", "root", ns=n.ns, check=False)
            sh("tc", "qdisc", "del", "dev", n.port, "root", ns=self.fabric, check=False)


def _chain(table: str, chain: str, hook: str, rule: str) -> str:
    """An nft script adding one base chain with one rule (re-adding a table or chain is a no-op)."""
    return f"table {table} {{\n  chain {chain} {{\n    {hook}\n    {rule}\n  }}\n}}\n"


def _drop(percent: int) -> str:
    return "drop" if percent >= 100 else f"numgen random mod 100 < {percent} drop"
