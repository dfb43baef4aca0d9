"""The pingmesh inventory: static files, Kubernetes Node objects, the ConfigMap form, and bad input."""
from __future__ import annotations

import copy
import gzip
import json
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nodehealth import inventory
from nodehealth.inventory import Inventory, InventoryError, Node, from_data, from_nodes, load_file, parse, to_data
from nodehealth.pingmesh.defaults import DEFAULTS as PINGMESH_DEFAULTS

YAML = """\
nodes:
  - name: gpu-002
    leaf: leaf-a
    pod: pod-1
    addresses: [10.0.1.2, 10.1.1.2]
  - name: gpu-001
    leaf: leaf-a
    addresses: [10.0.1.1, 10.1.1.1]
  - name: gpu-101
    leaf: leaf-b
    address: 10.0.2.1
"""
EXPECTED = Inventory((Node("gpu-001", "leaf-a", "", ("10.0.1.1", "10.1.1.1")),
                      Node("gpu-002", "leaf-a", "pod-1", ("10.0.1.2", "10.1.1.2")),
                      Node("gpu-101", "leaf-b", "", ("10.0.2.1",))), rails=2, problems=())


def write(tmp_path, name, data):
    path = tmp_path / name
    path.write_bytes(data if isinstance(data, bytes) else data.encode())
    return str(path)


def test_yaml_and_json_files_give_the_same_sorted_inventory(tmp_path):
    import yaml

    assert load_file(write(tmp_path, "inv.yaml", YAML)) == EXPECTED
    assert load_file(write(tmp_path, "inv.json", json.dumps(yaml.safe_load(YAML)))) == EXPECTED
    inv = load_file(write(tmp_path, "inv.yml", YAML))
    assert inv.get("gpu-101") == Node("gpu-101", "leaf-b", "", ("10.0.2.1",)) and inv.get("gpu-999") is None


def entry(name="gpu-1", **fields):
    return {"name": name, "leaf": "leaf-a", "addresses": ["10.0.0.1"], **fields}


# (entries, the nodes that result, fragments of the problems in order)
BAD_ENTRIES = [
    ([entry(), entry(addresses=["10.0.0.9"])],
     [Node("gpu-1", "leaf-a", "", ("10.0.0.1",))], ["node gpu-1: listed again (nodes[1]); the first entry is kept"]),
    ([entry(name=""), entry(name=None), entry(name=7), entry(name="a b"), entry(name="-x"), entry(name="x" * 254)],
     [], ["nodes[0]: missing or invalid name ''", "nodes[1]: missing or invalid name None",
          "nodes[2]: missing or invalid name 7", "nodes[3]", "nodes[4]", "nodes[5]: missing or invalid name 'xxx"]),
    ([entry(name="x" * 253)], [Node("x" * 253, "leaf-a", "", ("10.0.0.1",))], []),
    (["gpu-1", 5, None, [1, 2]], [], ["nodes[0]: expected a mapping, got 'gpu-1'", "nodes[1]", "nodes[2]",
                                      "nodes[3]: expected a mapping, got a list of 2"]),
    ([entry(addresses=["10.0.0.1", "300.1.1.1", "10.2.0.1"])],
     [Node("gpu-1", "leaf-a", "", ("10.0.0.1", "", "10.2.0.1"))],
     ["rail 1 address '300.1.1.1' is not a unicast IP address; rail left empty"]),
    ([entry(addresses=["0.0.0.0", "224.0.0.1", "::", 10, None, ["10.0.0.1"], "10.0.0.1/24", "x" * 100])],
     [Node("gpu-1", "leaf-a")],
     ["rail 0 address '0.0.0.0'", "rail 1 address '224.0.0.1'", "rail 2 address '::'", "rail 3 address 10",
      "rail 5 address a list of 1", "rail 6 address '10.0.0.1/24'", "rail 7 address 'xxx", "no probe address"]),
    ([entry(addresses=["2001:DB8::0001", "", "10.2.0.1", ""])],
     [Node("gpu-1", "leaf-a", "", ("2001:db8::1", "", "10.2.0.1"))], []),
    ([entry(addresses="10.0.0.1")], [Node("gpu-1", "leaf-a")],
     ["addresses must be a list, not '10.0.0.1'", "no probe address"]),
    ([entry(address="10.9.9.9")], [Node("gpu-1", "leaf-a", "", ("10.0.0.1",))],
     ["both `address` and `addresses`; `address` ignored"]),
    ([entry(), entry(name="gpu-2", addresses=["10.0.0.2", "10.0.0.1"])],
     [Node("gpu-1", "leaf-a", "", ("10.0.0.1",)), Node("gpu-2", "leaf-a", "", ("10.0.0.2",))],
     ["node gpu-2: rail 1 address 10.0.0.1 is node gpu-1's too; rail left empty"]),
    ([entry(leaf=3, pod={"a": 1}), entry(name="gpu-2", leaf="leaf a", pod="p" * 64), entry(name="gpu-3", leaf="a->b")],
     [Node("gpu-1", "", "", ("10.0.0.1",)), Node("gpu-2", ""), Node("gpu-3", "")],
     ["node gpu-1: invalid leaf 3", "node gpu-1: invalid pod a dict of 1", "node gpu-2: invalid leaf 'leaf a'",
      "invalid pod 'ppp", "address 10.0.0.1 is node gpu-1's too", "no probe address", "invalid leaf 'a->b'",
      "address 10.0.0.1 is node gpu-1's too", "no probe address", "3 nodes have no leaf (e.g. gpu-1)"]),
    ([entry(adresses=["10.0.0.2"], rack=1)], [Node("gpu-1", "leaf-a", "", ("10.0.0.1",))],
     ["node gpu-1: unknown keys 'adresses', 'rack' ignored"]),
    ([entry(addresses=[f"10.0.0.{i}" for i in range(1, 71)])],
     [Node("gpu-1", "leaf-a", "", tuple(f"10.0.0.{i}" for i in range(1, 65)))],
     ["70 addresses, only the first 64 rails kept"]),
]


@pytest.mark.parametrize("entries, nodes, fragments", BAD_ENTRIES)
def test_bad_entries_are_skipped_and_recorded(entries, nodes, fragments):
    inv = from_data({"nodes": entries}, "inv.yaml")
    assert list(inv.nodes) == nodes
    assert inv.rails == max((len(n.addresses) for n in nodes), default=0)
    assert len(inv.problems) == len(fragments), inv.problems
    for problem, fragment in zip(inv.problems, fragments):
        assert problem.startswith("inv.yaml: ") and fragment in problem, (problem, fragment)


@pytest.mark.parametrize("obj, fragment", [
    (None, "expected a mapping with a list `nodes`, got None"),
    ([{"name": "gpu-1"}], "expected a mapping with a list `nodes`, got a list of 1"),
    ({}, "`nodes` must be a list, not None"),
    ({"nodes": {"gpu-1": {}}}, "`nodes` must be a list, not a dict of 1"),
    ({"nodes": "gpu-1"}, "`nodes` must be a list, not 'gpu-1'"),
])
def test_documents_without_a_node_list_are_errors(obj, fragment):
    with pytest.raises(InventoryError, match="^inv: ") as e:
        from_data(obj, "inv")
    assert fragment in str(e.value)


def test_unknown_top_level_keys_are_recorded():
    inv = from_data({"nodes": [], "leaves": 3, 7: 1})
    assert inv == Inventory((), 0, ("inventory: unknown key 'leaves' ignored", "inventory: unknown key 7 ignored"))


@pytest.mark.parametrize("name, data, fragment", [
    ("inv.json", b'{"nodes": [', "inv.json: not valid JSON"),
    ("inv.json", b"", "not valid JSON"),
    ("inv.json", b"[" * 200_000, "nested too deeply"),
    ("inv.json", b'{"nodes": [{"name": "\xff\xfe"}]}', "not UTF-8 text (invalid start byte at byte 21)"),
    ("inv.json", b'{"nodes": [], "x": ' + b"9" * 5000 + b"}", "not valid JSON"),
    ("inv.yaml", b"nodes: [a, b\n", "inv.yaml: not valid YAML"),
    ("inv.yaml", b"", "expected a mapping with a list `nodes`, got None"),
    ("inv.yaml", b"nodes: []\n---\nnodes: []\n", "not valid YAML"),
    ("inv.yaml", b"nodes: !!python/object:os.system {}\n", "not valid YAML"),
    ("inv.yaml", b"nodes:\n" + b"- " * 17 + b"x\n", "nested deeper than 16 levels"),
])
def test_malformed_files_are_clear_errors(tmp_path, name, data, fragment):
    path = write(tmp_path, name, data)
    with pytest.raises(InventoryError) as e:
        load_file(path)
    assert fragment in str(e.value) and str(e.value).startswith(path)


def test_deep_yaml_is_refused_before_libyaml_composes_it():
    """libyaml's composer recurses in C with no limit: this document used to kill the process."""
    code = ("from nodehealth.inventory import parse, InventoryError\n"
            "try:\n    parse('[' * 200000, 'deep.yaml', 'yaml')\n"
            "except InventoryError as e:\n    print(e)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "deep.yaml: nested deeper than 16 levels\n"


def test_yaml_aliases_do_not_multiply_nodes(tmp_path):
    text = "a: &n {name: gpu-1, leaf: leaf-a, address: 10.0.0.1}\nnodes: [*n, *n, *n, &l [*l]]\n"
    inv = load_file(write(tmp_path, "inv.yaml", text))
    assert [n.name for n in inv.nodes] == ["gpu-1"]
    source = f"{tmp_path}/inv.yaml"
    assert inv.problems == (f"{source}: unknown key 'a' ignored",
                            f"{source}: node gpu-1: listed again (nodes[1]); the first entry is kept",
                            f"{source}: node gpu-1: listed again (nodes[2]); the first entry is kept",
                            f"{source}: nodes[3]: expected a mapping, got a list of 1; skipped")


def test_unreadable_and_oversized_files_are_errors(tmp_path):
    with pytest.raises(InventoryError, match="cannot read inventory .*missing.yaml: No such file"):
        load_file(str(tmp_path / "missing.yaml"))
    with pytest.raises(InventoryError, match="cannot read inventory .*: Is a directory"):
        load_file(str(tmp_path))
    big = write(tmp_path, "big.json", b" " * (16 << 20) + b"{}")
    with pytest.raises(InventoryError, match="big.json: larger than 16 MiB"):
        load_file(big)


def test_node_count_is_capped():
    inv = from_data({"nodes": [{"name": f"n{i}", "leaf": "l"} for i in range(inventory.MAX_NODES + 5)]}, "big")
    assert len(inv.nodes) == 100_000 and inv.get("n99999") is not None and inv.get("n100000") is None
    assert inv.problems[0] == "big: 5 nodes past the first 100000 ignored"
    # then one "no probe address" line per node: 100 listed, the rest counted
    assert len(inv.problems) == 101 and inv.problems[-1] == "big: 99901 more problems not listed"


# What `kubectl get node gpu-001 -o json` returns, trimmed to what matters (and some that does not).
K8S_NODE = {
    "apiVersion": "v1",
    "kind": "Node",
    "metadata": {
        "name": "gpu-001",
        "uid": "5f3b0c9e-8d0a-4d2e-9a51-2c4e1b7d9f10",
        "resourceVersion": "81234567",
        "creationTimestamp": "2026-10-02T08:14:55Z",
        "labels": {
            "beta.kubernetes.io/arch": "amd64",
            "kubernetes.io/hostname": "gpu-001",
            "kubernetes.io/os": "linux",
            "node.kubernetes.io/instance-type": "p5.48xlarge",
            "nvidia.com/gpu.present": "true",
            "topology.kubernetes.io/zone": "us-east-1a",
            "nodehealth.io/leaf": "leaf-a",
            "nodehealth.io/pod": "pod-1",
        },
        "annotations": {
            "node.alpha.kubernetes.io/ttl": "0",
            "volumes.kubernetes.io/controller-managed-attach-detach": "true",
            "nodehealth.io/probe-addresses": "10.0.1.1, 10.1.1.1,,10.3.1.1",
        },
    },
    "spec": {"podCIDR": "10.244.3.0/24", "providerID": "aws:///us-east-1a/i-0a1b2c3d4e5f60718"},
    "status": {
        "addresses": [{"type": "InternalIP", "address": "172.31.4.17"},
                      {"type": "Hostname", "address": "gpu-001"},
                      {"type": "InternalDNS", "address": "ip-172-31-4-17.ec2.internal"}],
        "capacity": {"cpu": "192", "memory": "2097152000Ki", "nvidia.com/gpu": "8", "pods": "110"},
        "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
        "nodeInfo": {"kubeletVersion": "v1.31.2", "kernelVersion": "6.8.0-1015-aws"},
    },
}


def k8s_node(name, leaf=None, pod=None, annotation=None, internal=None):
    node = copy.deepcopy(K8S_NODE)
    meta = node["metadata"]
    meta["name"] = name
    for key, value in (("nodehealth.io/leaf", leaf), ("nodehealth.io/pod", pod)):
        if value is None:
            del meta["labels"][key]
        else:
            meta["labels"][key] = value
    if annotation is None:
        del meta["annotations"]["nodehealth.io/probe-addresses"]
    else:
        meta["annotations"]["nodehealth.io/probe-addresses"] = annotation
    node["status"]["addresses"][0]["address"] = internal or "172.31.4.17"
    return node


def test_kubernetes_nodes_labels_annotation_or_internal_ip():
    nodes = [
        K8S_NODE,
        k8s_node("gpu-002", leaf="leaf-a", annotation="10.0.1.2,10.1.1.2", internal="172.31.4.18"),
        k8s_node("gpu-003", leaf="leaf-b", internal="172.31.4.19"),  # no annotation: InternalIP on rail 0
        k8s_node("gpu-004", leaf="leaf-b", annotation="", internal="172.31.4.20"),  # empty: the same
        k8s_node("gpu-005", internal="172.31.4.21"),  # no labels
        {"metadata": {"name": "gpu-006", "labels": None}, "status": {"addresses": [{"type": "ExternalIP",
                                                                                    "address": "3.3.3.3"}]}},
        {"metadata": {"labels": {"nodehealth.io/leaf": "leaf-a"}}},  # no name
        "gpu-007",
        k8s_node("gpu-008", leaf="leaf-b", annotation="10.0.1.8,not-an-ip", internal="172.31.4.22"),
        k8s_node("gpu-001", leaf="leaf-z", internal="172.31.4.23"),  # a second object with the same name
    ]
    inv = from_nodes(nodes, PINGMESH_DEFAULTS)
    assert list(inv.nodes) == [
        Node("gpu-001", "leaf-a", "pod-1", ("10.0.1.1", "10.1.1.1", "", "10.3.1.1")),
        Node("gpu-002", "leaf-a", "", ("10.0.1.2", "10.1.1.2")),
        Node("gpu-003", "leaf-b", "", ("172.31.4.19",)),
        Node("gpu-004", "leaf-b", "", ("172.31.4.20",)),
        Node("gpu-005", "", "", ("172.31.4.21",)),
        Node("gpu-006", "", "", ()),
        Node("gpu-008", "leaf-b", "", ("10.0.1.8",)),
    ]
    assert inv.rails == 4
    assert inv.problems == (
        "kubernetes: node gpu-006: no probe address; it can neither probe nor be probed",
        "kubernetes: nodes[6]: missing or invalid name None; skipped",
        "kubernetes: nodes[7]: expected a mapping, got 'gpu-007'; skipped",
        "kubernetes: node gpu-008: rail 1 address 'not-an-ip' is not a unicast IP address; rail left empty",
        "kubernetes: node gpu-001: listed again (nodes[9]); the first entry is kept",
        "kubernetes: 2 nodes have no leaf (e.g. gpu-005)",
    )


def test_kubernetes_label_keys_and_annotation_come_from_config():
    cfg = {**PINGMESH_DEFAULTS, "labels": {"leaf": "example.com/tor", "pod": "example.com/spine-block"},
           "addresses_annotation": "example.com/rails"}
    node = copy.deepcopy(K8S_NODE)
    node["metadata"]["labels"].update({"example.com/tor": "tor-7", "example.com/spine-block": "sb-2"})
    node["metadata"]["annotations"]["example.com/rails"] = "fd00::7,fd00:1::7"
    assert from_nodes([node], cfg).nodes == (Node("gpu-001", "tor-7", "sb-2", ("fd00::7", "fd00:1::7")),)
    node["metadata"]["annotations"]["example.com/rails"] = {"rail0": "10.0.0.1"}
    inv = from_nodes([node], cfg)
    assert inv.nodes == (Node("gpu-001", "tor-7", "sb-2", ()),)
    assert "addresses must be a list, not a dict of 1" in inv.problems[0]


def big_inventory(count=10_000, rails=8, leaf_size=32):
    """Addresses as a fabric plan would number them: rail r, leaf, slot."""
    return from_data({"nodes": [{"name": f"gpu-{i:05d}", "leaf": f"leaf-{i // leaf_size:03d}",
                                 "pod": f"pod-{i // 1024}",
                                 "addresses": [f"10.{r}.{i // 256}.{i % 256}" for r in range(rails)]}
                                for i in range(count)]})


def test_round_trip_through_the_configmap_form_is_exact_and_small():
    inv = from_data({"nodes": [entry(name="b", pod="p", addresses=["10.0.0.1", "", "10.2.0.1"]),
                               {"name": "a"}, {"name": "c", "leaf": "l", "addresses": ["fd00::1"]}]})
    assert to_data(inv) == {"nodes": [{"name": "a"},
                                      {"name": "b", "leaf": "leaf-a", "pod": "p", "addresses": ["10.0.0.1", "",
                                                                                                "10.2.0.1"]},
                                      {"name": "c", "leaf": "l", "addresses": ["fd00::1"]}]}
    again = parse(json.dumps(to_data(inv)), "configmap")
    assert again.nodes == inv.nodes and again.rails == inv.rails == 3
    big = big_inventory()
    text = json.dumps(to_data(big), separators=(",", ":")).encode()
    assert parse(text, "configmap").nodes == big.nodes
    assert len(text) < 2 << 20 and len(gzip.compress(text)) < 512 << 10, (len(text), len(gzip.compress(text)))


JSONISH = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
                       lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=10), inner,
                                                                                    max_size=5), max_leaves=30)
NODEISH = st.fixed_dictionaries({}, optional={"name": st.sampled_from(["gpu-1", "gpu-2", ""]) | JSONISH,
                                              "leaf": st.sampled_from(["leaf-a", ""]) | JSONISH,
                                              "pod": JSONISH,
                                              "addresses": st.lists(st.sampled_from(["10.0.0.1", "::1", "", "x"])
                                                                    | JSONISH, max_size=4) | JSONISH,
                                              "address": st.sampled_from(["10.0.0.2"]) | JSONISH})


@settings(max_examples=300, deadline=None)
@given(st.lists(NODEISH | JSONISH, max_size=6))
def test_any_node_list_gives_an_inventory(entries):
    inv = from_data({"nodes": entries})
    names = [n.name for n in inv.nodes]
    assert names == sorted(set(names))
    assert all(isinstance(a, str) for n in inv.nodes for a in n.addresses)
    assert inv.rails == max((len(n.addresses) for n in inv.nodes), default=0)
    assert from_data(to_data(inv)).nodes == inv.nodes


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200) | st.text(alphabet="[]{}:,- \n\"'ab1.&*!", max_size=200))
def test_any_text_gives_an_inventory_or_a_clear_error(data):
    for fmt in ("json", "yaml"):
        try:
            parse(data, "fuzz", fmt)
        except InventoryError as e:
            assert str(e).startswith("fuzz: ")
