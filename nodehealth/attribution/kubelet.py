"""The kubelet's PodResources API (v1) on its unix socket: which container holds which device.

The only module that talks to the kubelet, and it imports grpc and the generated stubs only when it
does, so a `nodehealth check` with attribution off never pays for them. Every call has one deadline
for the whole exchange (connect included), and the answer is refused past a size bound. Whatever goes
wrong (no socket, no answer in time, an answer too big or not a PodResources message, a kubelet
without Get) is one KubeletError with a sentence for the operator, never another exception.
"""
from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from typing import Any

from nodehealth.attribution.gpus import ContainerDevices

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
MAX_NAME_CHARS = 253  # a DNS subdomain, the longest namespace, pod or resource name Kubernetes takes
MAX_IDS_PER_ENTRY = 1024  # more devices of one resource in one container is not a real node


class KubeletError(Exception):
    """No usable PodResources answer; the message says why, for the operator."""


def _messages() -> Any:
    """The PodResources messages (protoc's), and gRPC: both from the `attribution` extra."""
    try:
        import grpc  # noqa: F401

        from nodehealth.attribution import podresources_pb2
    except ImportError as e:
        raise KubeletError(f"the kubelet's PodResources client needs grpcio and protobuf: pip install "
                           f"'nodehealth[attribution]' ({e})") from None
    return podresources_pb2


@dataclass(frozen=True)
class PodResourcesClient:
    socket_path: str = DEFAULT_SOCKET
    timeout_seconds: float = 5.0
    max_answer_bytes: int = 4 << 20

    def list(self) -> tuple[ContainerDevices, ...]:
        """Every container on the node with the devices it was given (List, GA since 1.28)."""
        answer = self._call("List", _messages().ListPodResourcesRequest())
        return tuple(entry for pod in answer.pod_resources for entry in _entries(pod))

    def get(self, namespace: str, pod: str) -> tuple[ContainerDevices, ...]:
        """One pod's containers and devices: Get where the kubelet serves it (1.27+ behind
        KubeletPodResourcesGet, on by default from 1.34), else List filtered to that pod."""
        try:
            answer = self._call("Get", _messages().GetPodResourcesRequest(pod_name=pod, pod_namespace=namespace))
        except _Unimplemented:
            return tuple(e for e in self.list() if (e.namespace, e.pod) == (namespace, pod))
        return _entries(answer.pod_resources)

    def _call(self, method: str, request: Any) -> Any:
        try:
            mode = os.stat(self.socket_path).st_mode
        except FileNotFoundError:
            raise KubeletError(f"the kubelet's PodResources socket {self.socket_path} does not exist: mount the "
                               "host's /var/lib/kubelet/pod-resources (deploy/components/attribution) or set "
                               "attribution.kubelet_socket") from None
        except OSError as e:
            raise KubeletError(f"cannot reach {self.socket_path}: {e.strerror}") from None
        if not stat.S_ISSOCK(mode):
            raise KubeletError(f"{self.socket_path} is not a socket, so not the kubelet's PodResources socket")
        import grpc  # _messages() found it

        from nodehealth.attribution import podresources_pb2_grpc as rpc

        options = [("grpc.max_receive_message_length", self.max_answer_bytes),
                   ("grpc.max_send_message_length", 64 << 10),
                   ("grpc.enable_retries", 0), ("grpc.enable_http_proxy", 0)]
        with grpc.insecure_channel("unix:" + os.path.abspath(self.socket_path), options=options) as channel:
            try:
                return getattr(rpc.PodResourcesListerStub(channel), method)(request, timeout=self.timeout_seconds)
            except grpc.RpcError as e:
                raise self._error(method, e) from None

    def _error(self, method: str, e: Any) -> Exception:
        import grpc

        code, details = e.code(), " ".join(str(e.details() or "").split())[:200]
        if code == grpc.StatusCode.UNIMPLEMENTED and method == "Get":
            return _Unimplemented(details)
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            return KubeletError(f"the kubelet did not answer PodResources {method} within "
                                f"{self.timeout_seconds:g} s (attribution.kubelet_timeout_seconds)")
        if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
            return KubeletError(f"the kubelet's PodResources {method} answer is larger than "
                                f"{self.max_answer_bytes} bytes (attribution.kubelet_max_answer_bytes)")
        if code == grpc.StatusCode.INTERNAL and "deserializ" in details.lower():
            return KubeletError(f"what answered PodResources {method} on {self.socket_path} sent no PodResources "
                                "message")
        if code == grpc.StatusCode.UNIMPLEMENTED:
            return KubeletError(f"the kubelet on {self.socket_path} does not serve PodResources v1 {method}")
        return KubeletError(f"PodResources {method} on {self.socket_path} failed: {code.name}: {details}")


class _Unimplemented(KubeletError):
    """This kubelet has no Get."""


def _entries(pod: Any) -> tuple[ContainerDevices, ...]:
    """A PodResources message as rows; rows whose names no Kubernetes object could have are dropped."""
    out = []
    for container in pod.containers:
        for devices in container.devices:
            names = (pod.namespace, pod.name, container.name, devices.resource_name)
            if not all(0 < len(n) <= MAX_NAME_CHARS for n in names) or len(devices.device_ids) > MAX_IDS_PER_ENTRY:
                continue
            out.append(ContainerDevices(*names, tuple(devices.device_ids)))
    return tuple(out)
