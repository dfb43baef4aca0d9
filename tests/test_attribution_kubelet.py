"""The kubelet PodResources client against a real gRPC server speaking the v1 proto on a unix socket."""
from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest
from fake_kubelet import FakeKubelet

from nodehealth.attribution.gpus import ContainerDevices
from nodehealth.attribution.kubelet import KubeletError, PodResourcesClient

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROTO = "nodehealth/attribution/podresources.proto"


def test_generated_stubs_are_current(tmp_path):
    """The committed podresources_pb2*.py come from the .proto with the command in its header."""
    pytest.importorskip("grpc_tools")
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", "-I.", f"--python_out={tmp_path}",
                    f"--grpc_python_out={tmp_path}", PROTO], cwd=REPO, check=True)
    for name in ("podresources_pb2.py", "podresources_pb2_grpc.py"):
        with open(os.path.join(REPO, "nodehealth", "attribution", name)) as committed, \
                open(tmp_path / "nodehealth" / "attribution" / name) as fresh:
            assert committed.read() == fresh.read(), f"{name} is stale: regenerate it (see {PROTO})"


# -- the client against a real gRPC server (tests/fake_kubelet.py) -----------------------------------

H100_GPU3 = "GPU-d1838e76-90e6-4408-711d-aeeaa2e1fd14"


@pytest.fixture
def sock(tmp_path):
    return str(tmp_path / "kubelet.sock")


def serve(sock: str, scenario: str) -> FakeKubelet:
    """The fake kubelet on `sock`, started by `with`."""
    return FakeKubelet(sock, scenario)


def test_list_gives_every_container_with_devices(sock):
    with serve(sock, "h100-xid79-lost.json") as kubelet:
        entries = PodResourcesClient(sock).list()
    assert kubelet.calls == ["List"]
    assert ContainerDevices("research", "llm-pretrain-worker-3", "trainer", "nvidia.com/gpu",
                            ("GPU-2d50cdf6-dd67-9f2e-855e-0d4d6d395a2f", H100_GPU3)) in entries
    assert ContainerDevices("inference", "triton-0", "triton", "rdma/rdma_shared_device_a", ("1",)) in entries
    assert {e.pod for e in entries} == {"llm-pretrain-worker-3", "notebook-5c9d8", "triton-0"}  # only holders


def test_list_of_a_mig_node(sock):
    with serve(sock, "a100-mig-1g10gb.json"):
        entries = PodResourcesClient(sock).list()
    assert [(e.pod, e.container, e.resource, e.device_ids) for e in entries if e.namespace == "ci"] == [
        ("ci-runner-42", "build", "nvidia.com/mig-1g.10gb", ("MIG-3f45d38c-8cee-503e-b806-a1f1bdceedeb",)),
        ("ci-runner-42", "test", "nvidia.com/mig-1g.10gb", ("MIG-96655de9-9525-58f9-a62b-0e4c1cc1c265",))]


def test_get_asks_for_one_pod(sock):
    with serve(sock, "h100-xid79-lost.json") as kubelet:
        entries = PodResourcesClient(sock).get("alice", "notebook-5c9d8")
        with pytest.raises(KubeletError, match="NOT_FOUND: pod gone-0 not found in alice"):
            PodResourcesClient(sock).get("alice", "gone-0")
    assert entries == (ContainerDevices("alice", "notebook-5c9d8", "notebook", "nvidia.com/gpu",
                                        ("GPU-b42dd28e-ffdd-8720-1df0-98bd8cdc05b1",)),)
    assert kubelet.calls == ["Get", "Get"]


def test_get_falls_back_to_list_on_a_kubelet_without_get(sock):
    with serve(sock, "no-get.json") as kubelet:
        entries = PodResourcesClient(sock).get("alice", "notebook-5c9d8")
    assert [e.pod for e in entries] == ["notebook-5c9d8"]
    assert kubelet.calls == ["List"]  # Get never reached the handler: the server answered UNIMPLEMENTED


@pytest.mark.parametrize("scenario, client, message", [
    ("slow.json", {"timeout_seconds": 0.5},
     "the kubelet did not answer PodResources List within 0.5 s \\(attribution.kubelet_timeout_seconds\\)"),
    ("oversized.json", {}, "the kubelet's PodResources List answer is larger than 4194304 bytes"),
    ("garbage.json", {}, "what answered PodResources List on .* sent no PodResources message"),
])
def test_a_bad_answer_is_one_clear_error(sock, scenario, client, message):
    with serve(sock, scenario):
        with pytest.raises(KubeletError, match=message):
            PodResourcesClient(sock, **client).list()


def test_a_missing_socket_a_file_and_a_dead_kubelet_are_clear_errors(tmp_path, sock):
    with pytest.raises(KubeletError, match=r"kubelet.sock does not exist: mount the host's /var/lib/kubelet/pod-"):
        PodResourcesClient(sock).list()
    (tmp_path / "file.sock").write_text("")
    with pytest.raises(KubeletError, match="is not a socket"):
        PodResourcesClient(str(tmp_path / "file.sock")).list()
    dead = socket.socket(socket.AF_UNIX)  # the socket file a kubelet that died leaves behind
    dead.bind(sock)
    dead.close()
    with pytest.raises(KubeletError, match="PodResources List on .* failed: UNAVAILABLE"):
        PodResourcesClient(sock, timeout_seconds=2).list()


def test_grpc_is_imported_only_when_the_kubelet_is_asked():
    code = ("import sys, nodehealth.attribution.attributor, nodehealth.attribution.notices; "
            "print(sorted(m for m in ('grpc', 'google.protobuf') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_without_the_attribution_extra_it_is_one_clear_error(sock, monkeypatch):
    """No protobuf (an install with `probes` alone, whose Ping needs none): a KubeletError that names the
    extra, which `check` and the daemon show as AttributionUnavailable, not a traceback."""
    import nodehealth.attribution
    monkeypatch.delattr(nodehealth.attribution, "podresources_pb2", raising=False)
    monkeypatch.setitem(sys.modules, "nodehealth.attribution.podresources_pb2", None)  # as if not installed
    with pytest.raises(KubeletError, match=r"needs grpcio and protobuf: pip install 'nodehealth\[attribution\]'"):
        PodResourcesClient(sock).list()
    with pytest.raises(KubeletError, match=r"nodehealth\[attribution\]"):
        PodResourcesClient(sock).get("ns", "pod")
