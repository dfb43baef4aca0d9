"""A stand-in for the kubelet's PodResources service: a real gRPC server speaking the v1 proto on a unix
socket, answering from a scenario file under tests/fixtures/podresources/ (its SOURCES.md says where each
part comes from and which keys make trouble: a slow answer, an oversized one, garbage, no Get).
"""
from __future__ import annotations

import json
import os
import threading
from concurrent import futures
from typing import Any

import grpc
from google.protobuf import json_format

from nodehealth.attribution import podresources_pb2 as pb

SCENARIOS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "podresources")
SERVICE = "v1.PodResourcesLister"


def load(name: str) -> dict[str, Any]:
    with open(os.path.join(SCENARIOS, name), encoding="utf-8") as f:
        scenario = json.load(f)
    if "answer_from" in scenario:
        scenario = dict(load(scenario["answer_from"]), **scenario)
    return scenario


class FakeKubelet:
    """Serves one scenario on `socket_path` until stopped; `calls` records the methods asked for."""

    def __init__(self, socket_path: str, scenario: str | dict[str, Any]):
        self.socket_path = socket_path
        self.scenario = load(scenario) if isinstance(scenario, str) else scenario
        self.calls: list[str] = []
        self._stopping = threading.Event()
        answer = json_format.ParseDict(self.scenario["list"], pb.ListPodResourcesResponse())
        if self.scenario.get("repeat_pods"):
            pods = list(answer.pod_resources)
            for _ in range(self.scenario["repeat_pods"] - 1):
                answer.pod_resources.extend(pods)
        self.answer = answer
        handlers = {"List": self._unary(self._list, pb.ListPodResourcesRequest)}
        if self.scenario.get("get", True):
            handlers["Get"] = self._unary(self._get, pb.GetPodResourcesRequest)
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        self.server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
        self.server.add_insecure_port("unix:" + socket_path)

    @staticmethod
    def _unary(behaviour, request_type):
        # Raw bytes go out as they are: that is how the garbage scenario answers.
        return grpc.unary_unary_rpc_method_handler(
            behaviour, request_deserializer=request_type.FromString,
            response_serializer=lambda m: m if isinstance(m, bytes) else m.SerializeToString())

    def _answer(self, method: str, message: Any) -> Any:
        self.calls.append(method)
        delay = self.scenario.get("delay_seconds")
        if delay:
            self._stopping.wait(delay)  # a kubelet that hangs; stop() lets it go
        raw = self.scenario.get("raw_answer")
        return raw.encode() if raw is not None else message

    def _list(self, request: pb.ListPodResourcesRequest, context: grpc.ServicerContext) -> Any:
        return self._answer("List", self.answer)

    def _get(self, request: pb.GetPodResourcesRequest, context: grpc.ServicerContext) -> Any:
        for pod in self.answer.pod_resources:
            if pod.name == request.pod_name and pod.namespace == request.pod_namespace:
                return self._answer("Get", pb.GetPodResourcesResponse(pod_resources=pod))
        self.calls.append("Get")
        # What the kubelet answers for a pod it does not have.
        context.abort(grpc.StatusCode.NOT_FOUND, f"pod {request.pod_name} not found in {request.pod_namespace}")

    def start(self) -> FakeKubelet:
        self.server.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        self.server.stop(grace=None).wait(5)

    def __enter__(self) -> FakeKubelet:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
