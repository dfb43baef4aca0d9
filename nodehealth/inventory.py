"""Who is in the mesh: each node's leaf (ToR group), pod, and probe address per rail.

An inventory comes from a static file (YAML or JSON), from Kubernetes Node objects, or from the
controller's ConfigMap (`to_data`'s form, which is the file's form). All of it is untrusted: the
text is bounded in size and nesting before it is parsed, and a bad entry (a duplicate name, a bad
address, a field of the wrong type) is skipped and recorded in `problems` instead of failing the
whole inventory. Only a document that cannot be read or parsed at all is an InventoryError.
"""
from __future__ import annotations

import ipaddress
import json
import re
from dataclasses import dataclass, field
from typing import Any

from nodehealth.host import read_bytes

MAX_BYTES = 16 << 20  # a 100,000-node, 8-rail YAML file is about 17 MB; 10,000 nodes about 1.7 MB
MAX_NODES = 100_000
MAX_RAILS = 64  # GPU nodes carry at most 8-16 rail NICs
MAX_DEPTH = 16  # the format needs 4 levels (document, nodes, node, addresses)
MAX_PROBLEMS = 100  # recorded one by one; past this only counted
NODE_KEYS = ("name", "leaf", "pod", "addresses", "address")
# Node names: Kubernetes' DNS subdomain, hostnames. Leaves and pods: Kubernetes label values; they
# become metric labels and "leafA->leafB" path names, so nothing else is allowed in them.
_NAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._-]{0,251}[A-Za-z0-9])?")
_LABEL = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?")


class InventoryError(Exception):
    pass


@dataclass(frozen=True)
class Node:
    name: str
    leaf: str  # ToR / leaf switch group; "" when unknown
    pod: str = ""  # spine block / pod; "" when unknown
    addresses: tuple[str, ...] = ()  # probe address per rail, index = rail number; "" = none on that rail


@dataclass(frozen=True)
class Inventory:
    nodes: tuple[Node, ...]  # sorted by name, unique names
    rails: int  # max number of rails
    problems: tuple[str, ...] = ()  # what was skipped and why
    _by_name: dict[str, Node] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_name", {node.name: node for node in self.nodes})

    def get(self, name: str) -> Node | None:
        return self._by_name.get(name)


def load_file(path: str) -> Inventory:
    """The static inventory: JSON when the name ends in .json, else YAML (as the config file)."""
    try:
        data = read_bytes(path, MAX_BYTES + 1)
    except OSError as e:
        raise InventoryError(f"cannot read inventory {path}: {e.strerror or e}") from None
    return parse(data, path, "json" if path.endswith(".json") else "yaml")


def parse(data: bytes | str, source: str, fmt: str = "json") -> Inventory:
    """An inventory document (`fmt` "json" or "yaml"), e.g. a file's or a ConfigMap's text."""
    if len(data) > MAX_BYTES:
        raise InventoryError(f"{source}: larger than {MAX_BYTES >> 20} MiB")
    if isinstance(data, bytes):
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise InventoryError(f"{source}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    if fmt == "json":
        try:
            obj = json.loads(data)
        except RecursionError:  # the C decoder checks its depth against the recursion limit
            raise InventoryError(f"{source}: nested too deeply") from None
        except ValueError as e:
            raise InventoryError(f"{source}: not valid JSON: {e}") from None
    else:
        obj = _load_yaml(data, source)
    return from_data(obj, source)


def _load_yaml(text: str, source: str) -> Any:
    import yaml  # only paid for when a YAML inventory is given

    # libyaml's composer recurses in C without a limit (deep nesting crashes the process), and the
    # pure-Python one is too slow for 10,000 nodes; so walk the events (iterative) for depth first.
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        depth = 0
        for event in yaml.parse(text, Loader=loader):
            if isinstance(event, yaml.CollectionStartEvent):
                depth += 1
                if depth > MAX_DEPTH:
                    raise InventoryError(f"{source}: nested deeper than {MAX_DEPTH} levels")
            elif isinstance(event, yaml.CollectionEndEvent):
                depth -= 1
        return yaml.load(text, Loader=loader)
    except yaml.YAMLError as e:
        # PyYAML 6.0.4 and later refuse deep flow nesting in their scanner, which reads ahead of the
        # events above: when the text up to where it stopped nests deeper than ours, ours is the reason.
        mark = getattr(e, "problem_mark", None)
        if mark is not None and _flow_depth(text[: mark.index + 1]) > MAX_DEPTH:
            raise InventoryError(f"{source}: nested deeper than {MAX_DEPTH} levels") from None
        raise InventoryError(f"{source}: not valid YAML: {e}") from None


def _flow_depth(text: str) -> int:
    """The deepest nesting of flow brackets ([ and {) in `text`, counting every bracket."""
    depth = deepest = 0
    for match in re.finditer(r"[][{}]", text):
        depth = depth + 1 if match.group() in "[{" else max(depth - 1, 0)
        deepest = max(deepest, depth)
    return deepest


def from_nodes(node_objects: list[Any], cfg: dict[str, Any]) -> Inventory:
    """Kubernetes Node objects (dicts as the API returns them); `cfg` is the pingmesh config.

    Leaf and pod come from the labels cfg["labels"] names; the rail addresses from the annotation
    cfg["addresses_annotation"] ("10.0.1.1,10.1.1.1", an empty item for a rail without one), else
    the node's first InternalIP as rail 0.
    """
    leaf_key, pod_key = cfg["labels"]["leaf"], cfg["labels"]["pod"]
    entries = []
    for obj in node_objects:
        if not isinstance(obj, dict):
            entries.append(obj)  # from_data records it
            continue
        meta = _mapping(obj.get("metadata"))
        labels, annotations = _mapping(meta.get("labels")), _mapping(meta.get("annotations"))
        entry = {"name": meta.get("name"), "leaf": labels.get(leaf_key, ""), "pod": labels.get(pod_key, "")}
        listed = annotations.get(cfg["addresses_annotation"])
        if isinstance(listed, str) and listed.strip():
            entry["addresses"] = [item.strip() for item in listed.split(",", MAX_RAILS)]
        elif listed is not None and not isinstance(listed, str):
            entry["addresses"] = listed  # from_data records the wrong type
        else:
            status = _mapping(obj.get("status"))
            addresses = status.get("addresses") if isinstance(status.get("addresses"), list) else []
            internal = [_mapping(a).get("address") for a in addresses if _mapping(a).get("type") == "InternalIP"]
            entry["addresses"] = internal[:1]
        entries.append(entry)
    return from_data({"nodes": entries}, "kubernetes")


def _mapping(value: Any) -> dict:
    return value if isinstance(value, dict) else {}


def from_data(obj: Any, source: str = "inventory") -> Inventory:
    """The inventory from a parsed document {"nodes": [{name, leaf, pod, addresses | address}, ...]}.

    A node entry that cannot be used is skipped (a missing or invalid name, a duplicate: the first
    one is kept). A bad leaf or pod is dropped (""). A bad or duplicate address leaves its rail
    empty (""), so the other rails keep their numbers. Each is recorded in `problems`.
    """
    if not isinstance(obj, dict):
        raise InventoryError(f"{source}: expected a mapping with a list `nodes`, got {_show(obj)}")
    if not isinstance(obj.get("nodes"), list):
        raise InventoryError(f"{source}: `nodes` must be a list, not {_show(obj.get('nodes'))}")
    problems = _Problems(source)
    for key in obj:
        if key != "nodes":
            problems.add(f"unknown key {_show(key)} ignored")
    entries = obj["nodes"]
    if len(entries) > MAX_NODES:
        problems.add(f"{len(entries) - MAX_NODES} nodes past the first {MAX_NODES} ignored")
    nodes: dict[str, Node] = {}
    owners: dict[str, str] = {}  # address -> the node that has it
    for i, entry in enumerate(entries[:MAX_NODES]):
        if not isinstance(entry, dict):
            problems.add(f"nodes[{i}]: expected a mapping, got {_show(entry)}; skipped")
            continue
        name = entry.get("name")
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            problems.add(f"nodes[{i}]: missing or invalid name {_show(name)}; skipped")
            continue
        if name in nodes:
            problems.add(f"node {name}: listed again (nodes[{i}]); the first entry is kept")
            continue
        unknown = [_show(key) for key in entry if key not in NODE_KEYS]
        if unknown:
            problems.add(f"node {name}: unknown keys {', '.join(unknown[:5])} ignored")
        leaf, pod = _label(entry, "leaf", name, problems), _label(entry, "pod", name, problems)
        nodes[name] = Node(name, leaf, pod, _addresses(entry, name, owners, problems))
    missing = [name for name, node in nodes.items() if not node.leaf]
    if missing:
        problems.add(f"{len(missing)} nodes have no leaf (e.g. {missing[0]})")
    ordered = tuple(sorted(nodes.values(), key=lambda node: node.name))
    return Inventory(ordered, max((len(node.addresses) for node in ordered), default=0), problems.done())


def _label(entry: dict, key: str, name: str, problems: _Problems) -> str:
    value = entry.get(key, "")
    if value is None or value == "":
        return ""
    if isinstance(value, str) and _LABEL.fullmatch(value):
        return value
    problems.add(f"node {name}: invalid {key} {_show(value)} (at most 63 of A-Z a-z 0-9 . _ -); left empty")
    return ""


def _addresses(entry: dict, name: str, owners: dict[str, str], problems: _Problems) -> tuple[str, ...]:
    if "addresses" in entry:
        if "address" in entry:
            problems.add(f"node {name}: both `address` and `addresses`; `address` ignored")
        listed = entry["addresses"]
    elif "address" in entry:
        listed = [entry["address"]]
    else:
        listed = []
    if not isinstance(listed, list):
        problems.add(f"node {name}: addresses must be a list, not {_show(listed)}")
        listed = []
    if len(listed) > MAX_RAILS:
        problems.add(f"node {name}: {len(listed)} addresses, only the first {MAX_RAILS} rails kept")
    addresses = []
    for rail, text in enumerate(listed[:MAX_RAILS]):
        address = _address(text)
        if address is None:
            problems.add(f"node {name}: rail {rail} address {_show(text)} is not a unicast IP address; rail left empty")
            address = ""
        elif address and owners.setdefault(address, name) != name:
            problems.add(f"node {name}: rail {rail} address {address} is node {owners[address]}'s too; rail left empty")
            address = ""
        addresses.append(address)
    while addresses and not addresses[-1]:
        addresses.pop()
    if not addresses:
        problems.add(f"node {name}: no probe address; it can neither probe nor be probed")
    return tuple(addresses)


def _address(text: Any) -> str | None:
    """The canonical form of a probe address, "" for an explicitly empty rail, None when invalid."""
    if text == "" or text is None:
        return ""
    if not isinstance(text, str) or len(text) > 64:
        return None
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        return None
    return None if ip.is_unspecified or ip.is_multicast else str(ip)


def to_data(inv: Inventory) -> dict[str, Any]:
    """The file's form, compact (empty fields left out), for the controller's ConfigMap.

    10,000 nodes x 8 rails: about 1.7 MB of JSON, 0.24 MB gzipped (0.55 MB with random addresses).
    `problems` are not carried: from_data(to_data(inv)) has inv's nodes and rails.
    """
    nodes = []
    for node in inv.nodes:
        entry: dict[str, Any] = {"name": node.name}
        if node.leaf:
            entry["leaf"] = node.leaf
        if node.pod:
            entry["pod"] = node.pod
        if node.addresses:
            entry["addresses"] = list(node.addresses)
        nodes.append(entry)
    return {"nodes": nodes}


def _show(value: Any) -> str:
    """A bounded rendering of an untrusted value for a problem line."""
    if isinstance(value, (dict, list, tuple)):
        return f"a {type(value).__name__} of {len(value)}"
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


class _Problems:
    """At most MAX_PROBLEMS lines, then a count, so a garbage inventory cannot flood logs or memory."""

    def __init__(self, source: str) -> None:
        self.source, self.lines, self.dropped = source, [], 0

    def add(self, line: str) -> None:
        if len(self.lines) < MAX_PROBLEMS:
            self.lines.append(f"{self.source}: {line}")
        else:
            self.dropped += 1

    def done(self) -> tuple[str, ...]:
        more = [f"{self.source}: {self.dropped} more problems not listed"] if self.dropped else []
        return tuple(self.lines + more)
