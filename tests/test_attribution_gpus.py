"""Which GPU a finding is about, and which containers the kubelet gave that GPU: pure, table-driven."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nodehealth.attribution.gpus import ContainerDevices, GpuRef, MigDevice, PodRef, assign, gpu_of, gpu_refs
from nodehealth.collectors.gpu_facts import Gpu, NvmlFacts
from nodehealth.model import Finding, Severity

# nvml-h100-xid79-lost (tests/fixtures/machines): UUIDs and bus ids from the real `nvidia-smi -q` dump
# tests/fixtures/nvml/thamada/H100SXMx8.nvidia-smi-a.txt.
H100 = [(0, "GPU-b42dd28e-ffdd-8720-1df0-98bd8cdc05b1", "0000:18:00.0"),
        (1, "GPU-7c3cadbd-17e5-0913-f69b-c618122ea0cd", "0000:2a:00.0"),
        (2, "GPU-2d50cdf6-dd67-9f2e-855e-0d4d6d395a2f", "0000:3a:00.0"),
        (3, "GPU-d1838e76-90e6-4408-711d-aeeaa2e1fd14", "0000:5d:00.0")]
# DataDog/datadog-agent#33120: `nvidia-smi -L` and `nvidia-smi` of an A100-SXM4-80GB at 00000000:00:05.0
# in MIG mode with seven 1g.10gb devices (driver 535.216.01).
A100_UUID = "GPU-7fdaf0a5-179b-f636-d15d-daf243e3ff16"
A100_MIGS = ("MIG-feb88891-0321-5fef-9c87-d4af3b54259e", "MIG-a25704ba-3a06-5299-a795-fd7cf4d13973",
             "MIG-50f1c4c9-1508-5e8d-bb06-d08145b22e01", "MIG-36c795f2-5cf7-55d6-af30-e535e79b7bb6",
             "MIG-3f45d38c-8cee-503e-b806-a1f1bdceedeb", "MIG-96655de9-9525-58f9-a62b-0e4c1cc1c265",
             "MIG-1aae4990-b962-574e-8375-119d6d9b9687")
# NVIDIA/nvidia-container-toolkit#203: an A100 80GB PCIe and the pre-R470 MIG id of its GI 1, CI 0.
LEGACY_GPU = "GPU-932bfb2c-849a-2a22-1e84-9eff6bc02b39"

NODE = tuple(GpuRef(i, uuid, bus) for i, uuid, bus in H100) + (
    GpuRef(4, A100_UUID, "0000:00:05.0", tuple(MigDevice(m) for m in A100_MIGS)),
    GpuRef(5, LEGACY_GPU, "0000:21:00.0"))


def one(resource: str, *ids: str, container: str = "main") -> ContainerDevices:
    return ContainerDevices("team-a", "train-0", container, resource, ids)


@pytest.mark.parametrize("case, entry, want, unresolved", [
    ("a whole GPU by UUID", one("nvidia.com/gpu", H100[3][1]), {3: [H100[3][1]]}, []),
    ("UUIDs compare without case", one("nvidia.com/gpu", H100[3][1].upper()), {3: [H100[3][1].upper()]}, []),
    ("two GPUs for one container", one("nvidia.com/gpu", H100[0][1], H100[1][1]),
     {0: [H100[0][1]], 1: [H100[1][1]]}, []),
    ("a time-sliced replica (the device plugin's ID::N)", one("nvidia.com/gpu", H100[2][1] + "::3"),
     {2: [H100[2][1] + "::3"]}, []),
    ("a MIG device (mixed strategy) whose parent NVML knows", one("nvidia.com/mig-1g.10gb", A100_MIGS[5]),
     {4: [A100_MIGS[5]]}, []),
    ("a MIG device under nvidia.com/gpu (single strategy)", one("nvidia.com/gpu", A100_MIGS[0]),
     {4: [A100_MIGS[0]]}, []),
    ("a MIG UUID no GPU here lists", one("nvidia.com/mig-1g.10gb", "MIG-a65afc88-50b5-5ccf-b0a8-f93b3247ae9e"),
     {}, ["MIG-a65afc88-50b5-5ccf-b0a8-f93b3247ae9e"]),
    ("the pre-R470 MIG id names its parent", one("nvidia.com/mig-3g.40gb", f"MIG-{LEGACY_GPU}/1/0"),
     {5: [f"MIG-{LEGACY_GPU}/1/0"]}, []),
    ("a GPU of another node", one("nvidia.com/gpu", "GPU-ad63c684-5593-111a-cbb1-c1451ebcd0aa"),
     {}, ["GPU-ad63c684-5593-111a-cbb1-c1451ebcd0aa"]),
    ("device-id-strategy=index", one("nvidia.com/gpu", "3"), {3: ["3"]}, []),
    ("a MIG device by index (gpu:mig)", one("nvidia.com/mig-1g.10gb", "4:2"), {4: ["4:2"]}, []),
    ("an index past the last GPU", one("nvidia.com/gpu", "9"), {}, ["9"]),
    ("an index of a resource that is not NVIDIA's", one("example.com/fpga", "3"), {}, []),
    ("another vendor's devices", one("rdma/hca_shared_devices_a", "mlx5_0"), {}, []),
    ("an NVIDIA id that is no GPU id at all", one("nvidia.com/gpu", "x" * 300), {}, ["x" * 64 + "..."]),
    ("no devices (most containers)", one("nvidia.com/gpu"), {}, []),
])
def test_assign(case, entry, want, unresolved):
    got = assign([entry], NODE)
    assert {i: [p.device for p in pods] for i, pods in got.by_gpu.items()} == want, case
    assert list(got.unresolved) == unresolved, case
    for pods in got.by_gpu.values():
        assert all(p == PodRef("team-a", "train-0", "main", p.device) for p in pods)


def test_assign_lists_each_container_once_per_gpu_in_a_stable_order():
    entries = [ContainerDevices("b", "p", "c", "nvidia.com/gpu", (H100[0][1] + "::1", H100[0][1] + "::0")),
               ContainerDevices("a", "q", "c", "nvidia.com/gpu", (H100[0][1] + "::2",)),
               ContainerDevices("a", "q", "c", "nvidia.com/gpu", (H100[0][1] + "::2",))]  # Get and List both
    pods = assign(entries, NODE).by_gpu[0]
    assert [(p.namespace, p.pod, p.device) for p in pods] == [("a", "q", H100[0][1] + "::2"),
                                                               ("b", "p", H100[0][1] + "::0"),
                                                               ("b", "p", H100[0][1] + "::1")]


def finding(device: str, **evidence) -> Finding:
    return Finding("xid", Severity.FATAL, "Xid79FallenOffBus", "m", device=device, evidence=evidence)


@pytest.mark.parametrize("case, f, want", [
    ("the kernel log's bus id", finding("0000:5d:00.0"), 3),
    ("NVML's spelling of it", finding("00000000:5D:00.0"), 3),
    ("a UUID as the device", finding(H100[1][1]), 1),
    ("the UUID in the evidence", finding("", uuid=H100[2][1]), 2),
    ("a GPU NVML could not name", finding("GPU 5"), 5),
    ("an NVSwitch", finding("0000:07:00.0"), None),
    ("a host finding", finding("Normal zone of node 0"), None),
    ("no device", finding(""), None),
])
def test_gpu_of(case, f, want):
    got = gpu_of(f, NODE)
    assert (got.index if got else None) == want, case


def test_gpu_refs_from_nvml_facts_and_a_mig_listing():
    facts = NvmlFacts("fake:x", "535.216.01", "12.2", 2, (
        Gpu(0, uuid=A100_UUID, pci_bus_id="0000:00:05.0", mig_enabled=True,
            mig_devices=(MigDevice(A100_MIGS[0], gpu_instance=7),)),
        Gpu(1, uuid=None, pci_bus_id=None, lost=True)))
    refs = gpu_refs(facts)
    assert refs == (GpuRef(0, A100_UUID, "0000:00:05.0", (MigDevice(A100_MIGS[0], 7),)), GpuRef(1, None, None))
    assert gpu_refs(None) == ()


def test_a_lost_gpu_without_its_uuid_gets_the_one_uuid_no_other_gpu_has():
    """NVML answers GpuIsLost to everything, UUID included, on the GPU that fell off the bus; the device
    plugin's UUIDs are this node's GPUs', so the one UUID no answering GPU has is the lost GPU's."""
    node = (GpuRef(0, H100[0][1], H100[0][2]), GpuRef(3, None, H100[3][2]))
    lost = [one("nvidia.com/gpu", H100[0][1]), one("nvidia.com/gpu", H100[3][1] + "::0", container="a"),
            one("nvidia.com/gpu", H100[3][1] + "::1", container="b")]
    got = assign(lost, node)
    assert [p.container for p in got.by_gpu[3]] == ["a", "b"] and got.inferred == (3,) and not got.unresolved
    # Two UUIDs for one unnamed GPU, or two unnamed GPUs: no guess.
    two = assign([*lost, one("nvidia.com/gpu", "GPU-ad63c684-5593-111a-cbb1-c1451ebcd0aa")], node)
    assert 3 not in two.by_gpu and len(two.unresolved) == 3 and two.inferred == ()
    both = assign(lost, (GpuRef(0, None, H100[0][2]), GpuRef(3, None, H100[3][2])))
    assert both.by_gpu == {} and both.inferred == ()


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["nvidia.com/gpu", "nvidia.com/mig-1g.10gb", "example.com/x"]),
                          st.lists(st.one_of(st.sampled_from([H100[0][1], H100[3][1] + "::2", A100_MIGS[1],
                                                              f"MIG-{LEGACY_GPU}/1/0", "3", "4:1"]),
                                             st.text(max_size=200)), max_size=4)), max_size=6))
def test_assign_takes_any_device_ids(rows):
    got = assign([ContainerDevices("n", "p", "c", resource, tuple(ids)) for resource, ids in rows], NODE)
    assert set(got.by_gpu) <= {g.index for g in NODE}
    assert all(len(u) <= 67 for u in got.unresolved)
