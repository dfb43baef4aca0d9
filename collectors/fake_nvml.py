"""A fake NVML backend that answers from a scenario file (`nvml.json` in a fixture machine).

It stands in for the driver at the one narrow interface the NVML collector uses, so everything
above it is the same code on a laptop and on a GPU node. A scenario is what NVML would answer,
call by call, plus scripted trouble (errors, hangs, events).

Scenario (JSON):

    {
      "source": "where the values came from (nvidia-smi -q dump, or a real NVML capture)",
      "system": {"nvmlSystemGetDriverVersion": "535.154.05",
                 "nvmlSystemGetCudaDriverVersion": 12020, "nvmlDeviceGetCount": 8},
      "gpus": [                                   # index = position
        {"nvmlDeviceGetName": "NVIDIA H100 80GB HBM3",
         "nvmlDeviceGetTotalEccErrors": {"0,0": 0, "1,0": 0, "0,1": 0, "1,1": 0},
         "nvmlDeviceGetNvLinkState": {"0": 1, "1": 1},
         ...}
      ],
      "errors": [{"gpu": 3, "fn": "*", "error": "GpuIsLost"},                # gpu omitted: every GPU
                 {"fn": "nvmlDeviceGetCurrentClocksEventReasons", "error": "FunctionNotFound"}],
      "hangs": [{"gpu": 2, "fn": "*", "seconds": 30}],                         # a wedged GPU
      "events": [{"gpu": 3, "kind": "xid", "data": 79}]                      # delivered once
    }

A device call's value is stored under the function name; for calls with arguments after the
device, under a key of those arguments joined by commas ("1,0" for error type 1, counter type 0).
A function or key absent from the scenario answers NotSupported, as NVML does for a fact the GPU
lacks; a value {"error": "Name"} answers that NVML error. The calls the collector makes:

    system                                           value
    nvmlSystemGetDriverVersion                       "535.154.05"
    nvmlSystemGetCudaDriverVersion                   12020 (12.2)
    nvmlDeviceGetCount                               8
    per GPU (key of the arguments after the device)
    nvmlDeviceGetName / GetUUID / GetSerial          str
    nvmlDeviceGetVbiosVersion                        str
    nvmlDeviceGetPciInfo                             {"busId": "00000000:19:00.0", "pciDeviceId": 591401182}
    nvmlDeviceGetArchitecture                        int (7 ampere, 9 hopper, 10 blackwell)
    nvmlDeviceGetMigMode                             [current, pending] (1 enabled)
    nvmlDeviceGetMaxMigDeviceCount                   int: MIG device slots (asked only in MIG mode)
    nvmlDeviceGetMigDeviceHandleByIndex  "I"         {"uuid": "MIG-...", "gpuInstanceId": 7}: the MIG device in
                                                     slot I (the id where NVML gives it); an empty slot
                                                     {"error": "NotFound"}
    nvmlDeviceGetPersistenceMode                     0 / 1
    nvmlDeviceGetEccMode                             [current, pending] (1 enabled)
    nvmlDeviceGetTotalEccErrors  "E,C"               int; E 0 corrected / 1 uncorrected, C 0 volatile / 1 aggregate
    nvmlDeviceGetRetiredPages  "C"                   [page addresses]; C 0 multiple single-bit / 1 double-bit
    nvmlDeviceGetRetiredPagesPendingStatus           0 / 1
    nvmlDeviceGetRemappedRows                        [correctable, uncorrectable, pending 0/1, failure 0/1]
    nvmlDeviceGetFieldValues  "F,S"                  number; field id F, scope S (link number, or 0):
                                                     91 link count, 164 link speed (MB/s), 138/139 link
                                                     TX/RX data (KiB), 269/270/271 SW thermal / HW thermal /
                                                     HW power brake slowdown time (ns), 165/166 link state
                                                     (NVML_NVLINK_STATE_*) / version, per-link error counters
                                                     of links 0-11 (scope 0): CRC flit 32-37/96-101, CRC
                                                     data 39-44/102-107, replay 46-51/108-113, recovery
                                                     53-58/114-119; fields(gpu, pairs) answers many at once
    nvmlDeviceGetNvLinkState  "L"                    0 down / 1 up
    nvmlDeviceGetNvLinkVersion  "L"                  int (enum: 4 = 3.0, 6 = 4.0, 7 = 5.0)
    nvmlDeviceGetNvLinkRemotePciInfo  "L"            {"busId": "00000000:05:00.0"}
    nvmlDeviceGetNvLinkErrorCounter  "L,K"           int; K 0 replay, 1 recovery, 2 CRC flit, 3 CRC data
    nvmlDeviceGetCurrPcieLinkGeneration / Width      int
    nvmlDeviceGetMaxPcieLinkGeneration / Width       int
    nvmlDeviceGetPcieReplayCounter                   int
    nvmlDeviceGetPcieThroughput  "K"                 KB/s; K 0 TX / 1 RX
    nvmlDeviceGetCurrentClocksEventReasons           bitmask (gpu_facts.CLOCKS_*); older drivers:
    nvmlDeviceGetCurrentClocksThrottleReasons        the same bitmask
    nvmlDeviceGetTemperature  "0"                    degrees C (sensor 0 = GPU)
    nvmlDeviceGetPowerUsage                          mW
    nvmlDeviceGetEnforcedPowerLimit                  mW
    nvmlDeviceGetUtilizationRates                    {"gpu": percent, "memory": percent}
    nvmlDeviceGetGpuFabricInfo                       {"state": 0 not supported / 1 not started /
                                                      2 in progress / 3 completed, "status": NVML return code}
"""
from __future__ import annotations

import json
import os
import threading
from typing import Any

from nodehealth.collectors.gpu_facts import NvmlError

SCENARIO_FILE = "nvml.json"
MAX_SCENARIO_BYTES = 16 << 20


def scenario_path(root: str) -> str:
    return os.path.join(root, SCENARIO_FILE)


class FakeNvmlBackend:
    def __init__(self, path: str):
        self.path = path
        with open(path, "rb") as f:
            raw = f.read(MAX_SCENARIO_BYTES + 1)
        if len(raw) > MAX_SCENARIO_BYTES:
            raise ValueError(f"{path}: scenario larger than {MAX_SCENARIO_BYTES} bytes")
        self.scenario: dict[str, Any] = json.loads(raw)
        self.name = f"fake:{os.path.basename(os.path.dirname(os.path.abspath(path)))}"
        self._events_sent = False
        self._stop = threading.Event()

    def init(self) -> None:
        self._raise_if(None, "nvmlInit")

    def shutdown(self) -> None:
        self._stop.set()

    def call(self, fn: str, *args: Any) -> Any:
        gpu = args[0] if fn.startswith("nvmlDevice") and fn != "nvmlDeviceGetCount" and args else None
        self._hang_if(gpu, fn)
        self._raise_if(gpu, fn)
        return self._answer(fn, args)

    def _answer(self, fn: str, args: tuple) -> Any:
        gpu = args[0] if fn.startswith("nvmlDevice") and fn != "nvmlDeviceGetCount" and args else None
        if gpu is None:
            table = self.scenario.get("system", {})
            rest = args
        else:
            gpus = self.scenario.get("gpus", [])
            if not isinstance(gpu, int) or not 0 <= gpu < len(gpus):
                raise NvmlError.named("InvalidArgument")
            table = gpus[gpu]
            rest = args[1:]
        if fn not in table:
            raise NvmlError.named("NotSupported")
        value = table[fn]
        if rest:
            if not isinstance(value, dict):
                raise NvmlError.named("InvalidArgument")
            key = ",".join(str(a) for a in rest)
            if key not in value:
                raise NvmlError.named("NotSupported")
            value = value[key]
        if isinstance(value, dict) and set(value) == {"error"}:
            raise NvmlError.named(value["error"])
        return value

    def fields(self, index: int, wanted: list[tuple[int, int]]) -> list[Any]:
        """nvmlDeviceGetFieldValues for many fields in one call: the call's scripted trouble once, then
        each field's own answer (its value, or its NvmlError)."""
        fn = "nvmlDeviceGetFieldValues"
        self._hang_if(index, fn)
        self._raise_if(index, fn)
        answers: list[Any] = []
        for field, scope in wanted:
            try:
                answers.append(self._answer(fn, (index, field, scope)))
            except NvmlError as e:
                answers.append(e)
        return answers

    def wait_events(self, timeout: float) -> list[dict[str, Any]]:
        """The scenario's events, once; afterwards nothing, after waiting like nvmlEventSetWait."""
        if not self._events_sent:
            self._events_sent = True
            events = self.scenario.get("events", [])
            if events:
                return [dict(e) for e in events]
        self._stop.wait(timeout)
        return []

    def _raise_if(self, gpu: int | None, fn: str) -> None:
        """A scripted error: the rule's function ("*" = any) and, if it names one, its GPU match."""
        for rule in self.scenario.get("errors", []):
            if rule.get("fn", "*") in ("*", fn) and rule.get("gpu", gpu) == gpu:
                raise NvmlError.named(rule["error"])

    def _hang_if(self, gpu: int | None, fn: str) -> None:
        for rule in self.scenario.get("hangs", []):
            if rule.get("fn", "*") in ("*", fn) and rule.get("gpu", gpu) == gpu:
                self._stop.wait(float(rule.get("seconds", 3600)))
                return
