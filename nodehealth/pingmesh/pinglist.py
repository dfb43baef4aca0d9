"""Who probes whom: a node's pinglist, computed alike on every node from the same inventory.

Rail r probes rail r; a node without an address on a rail neither probes nor is probed on it.

- Inside a leaf: a full mesh on each rail (Pingmesh's ToR mesh).
- Between two leaves: cfg["inter_leaf_pairs"] (k) representative pairs per leaf pair and rail. Both
  ends of a pair probe each other, so both directions of the path are measured.
- Representatives: per leaf, rail and cycle, the leaf's members (sorted by name) are shuffled by an
  affine permutation (offset + stride x position, mod members) hashed (blake2b) from (leaf, rail,
  cycle). Leaf L's j-th partner leaf (in sorted order, L left out) takes the k consecutive positions
  from (t + j) * k in it, where t is the epoch within the cycle. So in one epoch L's partners take
  one run of consecutive positions: every member represents L towards about the same number of
  leaves (partners x k / members, +-1); and over the ceil(members / k) epochs of a cycle every
  member represents L towards every partner at least once. A new cycle draws a new permutation, so
  who pairs with whom changes too. The i-th representatives of the two leaves form pair i; both
  ends compute the same pairs from the inventory alone.
- Nodes without a leaf are grouped, in name order, into groups of cfg["unknown_leaf_group_size"]
  that are meshed like leaves (hostnames usually count along racks). Without this a cluster with no
  leaf labels would be one leaf (a full mesh of every node) or a leaf per node (one pair per leaf
  pair: a full mesh again). In the targets their leaf stays "", and their group is never same-leaf,
  so nothing is blamed on a leaf that is a guess.

Cost: indexing an inventory (Pinglister) is linear; one node's list costs O(leaves x rails) small
integer steps plus its intra-leaf peers, and each (leaf, rail) permutation is hashed once per epoch.
"""
from __future__ import annotations

import hashlib
import math
from bisect import bisect_left
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from nodehealth.inventory import Inventory, Node


@dataclass(frozen=True)
class Target:
    node: str
    address: str  # the peer's address on this rail
    rail: int
    leaf: str  # the peer's leaf, "" when unknown
    group: str  # metric peer group: same-leaf, leaf:<name>, pod:<name> or other-leaf


class _Shuffle:
    """One epoch's permutation of a leaf's members on one rail: position p -> (offset + stride * p) mod n."""

    __slots__ = ("nodes", "names", "start", "offset", "stride", "inverse")

    def __init__(self, nodes: list[Node], names: list[str], key: str, rail: int, epoch: int, pairs: int) -> None:
        n = len(nodes)
        epochs = -(-n // pairs)  # per cycle: enough for every member to take each position once
        cycle, t = divmod(epoch, epochs)
        digest = hashlib.blake2b(f"{key}\0{rail}\0{cycle}".encode(), digest_size=16).digest()
        strides = _strides(n)
        self.nodes, self.names, self.start = nodes, names, t * pairs
        self.offset = int.from_bytes(digest[:8], "big") % n
        self.stride = strides[int.from_bytes(digest[8:], "big") % len(strides)]
        self.inverse = pow(self.stride, -1, n) if n > 1 else 0

    def at(self, position: int) -> Node:
        return self.nodes[(self.offset + self.stride * position) % len(self.nodes)]

    def position(self, name: str) -> int:
        return (bisect_left(self.names, name) - self.offset) * self.inverse % len(self.nodes)


@lru_cache(maxsize=256)
def _strides(n: int) -> tuple[int, ...]:
    """Strides s with gcd(s, n) = 1, for which p -> (offset + s * p) mod n is a permutation."""
    return tuple(s for s in range(1, max(n, 2)) if math.gcd(s, n) == 1)


class Pinglister:
    """An inventory indexed once (groups and their members per rail) to compute any node's list."""

    def __init__(self, inv: Inventory, cfg: dict[str, Any]) -> None:
        self.inv, self.settings = inv, _settings(cfg)
        self.pairs = max(0, int(cfg["inter_leaf_pairs"]))
        size = max(1, int(cfg["unknown_leaf_group_size"]))
        groups: dict[str, list[Node]] = {}
        unknown = []
        for node in inv.nodes:  # sorted by name
            if node.leaf:
                groups.setdefault(node.leaf, []).append(node)
            else:
                unknown.append(node)
        for start in range(0, len(unknown), size):  # "~" is not allowed in a leaf name
            groups[f"~{start // size}"] = unknown[start:start + size]
        self.keys = sorted(groups)
        self.group = {node.name: g for g, key in enumerate(self.keys) for node in groups[key]}
        # members[g][rail]: group g's nodes with an address on the rail, sorted by name
        self.members = [[[node for node in groups[key] if _address(node, rail)] for rail in range(inv.rails)]
                        for key in self.keys]
        max_groups = int(cfg["max_peer_groups"])
        self.by_leaf = len({node.leaf for node in inv.nodes if node.leaf}) <= max_groups
        self.by_pod = len({node.pod for node in inv.nodes if node.pod}) <= max_groups
        self.shuffled: tuple[int | None, list] = (None, [])  # replaced whole: safe to share between threads

    def _shuffles(self, epoch: int) -> list[list[_Shuffle | None]]:
        last, table = self.shuffled
        if last != epoch:
            table = [[_Shuffle(nodes, [node.name for node in nodes], key, rail, epoch, self.pairs) if nodes else None
                      for rail, nodes in enumerate(rails)] for key, rails in zip(self.keys, self.members)]
            self.shuffled = (epoch, table)
        return table

    def pinglist(self, me: str, epoch: int) -> list[Target]:
        node = self.inv.get(me)
        if node is None:
            return []
        g, k = self.group[me], self.pairs
        table = self._shuffles(epoch) if k else []
        peers: dict[tuple[int, str], Node] = {}
        for rail in range(len(node.addresses)):
            if not node.addresses[rail]:
                continue
            for peer in self.members[g][rail]:
                if peer is not node:
                    peers[rail, peer.name] = peer
            if not k:
                continue
            mine = table[g][rail]
            n, q = len(mine.nodes), mine.position(me)
            for h, rails in enumerate(table):
                theirs = rails[rail]
                if h == g or theirs is None:
                    continue
                # My leaf's representatives towards leaf h take the k positions from `first`; h's
                # towards mine from `their_first`; representative i of each side make pair i.
                first, their_first = mine.start + (h - (h > g)) * k, theirs.start + (g - (g > h)) * k
                i = (q - first) % n
                while i < k:  # I am representative i (and i + n, ... when k exceeds the leaf)
                    peer = theirs.at(their_first + i)
                    peers[rail, peer.name] = peer
                    i += n
        return [Target(peer.name, peer.addresses[rail], rail, peer.leaf, self.peer_group(node, peer))
                for (rail, _), peer in sorted(peers.items())]

    def peer_group(self, me: Node, peer: Node) -> str:
        """The bounded metric label for peers like `peer`, seen from `me`."""
        if me.leaf and peer.leaf == me.leaf:
            return "same-leaf"
        if peer.leaf and self.by_leaf:
            return f"leaf:{peer.leaf}"
        if peer.pod and self.by_pod:
            return f"pod:{peer.pod}"
        return "other-leaf"


def _address(node: Node, rail: int) -> str:
    return node.addresses[rail] if rail < len(node.addresses) else ""


_last: Pinglister | None = None


def pinglister(inv: Inventory, cfg: dict[str, Any]) -> Pinglister:
    """The Pinglister of the latest inventory asked about (an agent has one at a time)."""
    global _last
    lister = _last
    if lister is None or lister.inv is not inv or lister.settings != _settings(cfg):
        lister = _last = Pinglister(inv, cfg)
    return lister


def _settings(cfg: dict[str, Any]) -> tuple:
    return cfg["inter_leaf_pairs"], cfg["unknown_leaf_group_size"], cfg["max_peer_groups"]


def pinglist(inv: Inventory, me: str, epoch: int, cfg: dict[str, Any]) -> list[Target]:
    """Node `me`'s targets in `epoch` (int(time / cfg["epoch_seconds"])), sorted by rail and name.

    Empty when `me` is not in the inventory. `cfg` is the pingmesh config.
    """
    return pinglister(inv, cfg).pinglist(me, epoch)


def peer_group(inv: Inventory, me: str, peer: str, cfg: dict[str, Any]) -> str:
    """The metric peer group of node `peer` seen from node `me`; other-leaf when either is unknown."""
    a, b = inv.get(me), inv.get(peer)
    return pinglister(inv, cfg).peer_group(a, b) if a is not None and b is not None else "other-leaf"
