"""Build the fake libnvidia-ml.so.1 (fake_nvml.c) and derive its scenario file from an nvml.json.

The C library reads a flat file (the format is at the top of fake_nvml.c); this module writes it
from the one scenario format the Python fake reads, so both fakes answer from the same nvml.json.
`environment()` gives a subprocess what it needs to run the real pynvml backend against it.
"""
from __future__ import annotations

import glob
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
from typing import Any

from nodehealth.collectors.gpu_facts import NVML_ERRORS

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.join(HERE, "fake_nvml.c")
LIBRARY = "libnvidia-ml.so.1"
# The C symbol pynvml looks up for each call the backend names (the rest have the same name).
SYMBOLS = {
    "nvmlInit": "nvmlInitWithFlags",
    "nvmlDeviceGetCount": "nvmlDeviceGetCount_v2",
    "nvmlDeviceGetHandleByIndex": "nvmlDeviceGetHandleByIndex_v2",
    "nvmlDeviceGetPciInfo": "nvmlDeviceGetPciInfo_v3",
    "nvmlDeviceGetNvLinkRemotePciInfo": "nvmlDeviceGetNvLinkRemotePciInfo_v2",
    "nvmlEventSetWait": "nvmlEventSetWait_v2",
}
EVENT_TYPES = {"xid": 0x8, "dbe": 0x2}  # nvmlEventTypeXidCriticalError, nvmlEventTypeDoubleBitEccError


def nvml_header_dir() -> str:
    """The include folder of NVIDIA's nvml.h from the nvidia-nvml-dev wheel (the test extra)."""
    spec = importlib.util.find_spec("nvidia")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        for header in sorted(glob.glob(os.path.join(folder, "*", "include", "nvml.h"))):
            return os.path.dirname(header)
    raise FileNotFoundError("nvml.h not found: pip install nvidia-nvml-dev (the test extra)")


def compiler() -> str | None:
    return shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")


def hidden_symbols(scenario: dict[str, Any]) -> list[str]:
    """Functions an older driver lacks: FunctionNotFound for every GPU is a symbol not exported."""
    return sorted(SYMBOLS.get(r["fn"], r["fn"]) for r in scenario.get("errors", [])
                  if r.get("error") == "FunctionNotFound" and "gpu" not in r and r.get("fn", "*") != "*")


def build(out_dir: str, hidden: list[str] = ()) -> str:
    """Compile the library into a folder of its own (one per set of hidden symbols); its path."""
    tag = hashlib.sha256("\n".join(sorted(hidden)).encode()).hexdigest()[:12]
    folder = os.path.join(out_dir, f"fake-nvml-{tag}")
    target = os.path.join(folder, LIBRARY)
    if os.path.exists(target):
        return folder
    os.makedirs(folder, exist_ok=True)
    cc = compiler()
    if cc is None:
        raise FileNotFoundError("no C compiler (cc or gcc)")
    script = os.path.join(folder, "exports.map")
    with open(script, "w", encoding="utf-8") as f:  # every nvml* symbol but the hidden ones
        hide = "".join(f"    {name};\n" for name in hidden)
        f.write("{\n  global: nvml*;\n  local:\n" + hide + "    *;\n};\n" if hidden else
                "{\n  global: nvml*;\n  local: *;\n};\n")
    subprocess.run([cc, "-O2", "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC", "-I", nvml_header_dir(),
                    f"-Wl,--version-script={script}", "-Wl,-soname," + LIBRARY, "-o", target + ".tmp", SOURCE,
                    "-lpthread"], check=True, capture_output=True, text=True)
    os.replace(target + ".tmp", target)
    return folder


def _value(key: str, value: Any, out: list[str]) -> None:
    if isinstance(value, dict) and set(value) == {"error"}:
        out.append(f"v\t{key}\te\t{NVML_ERRORS[value['error']]}")
    elif isinstance(value, dict):
        sep = "" if key.endswith("|") else "/"
        for k, v in value.items():
            _value(f"{key}{sep}{k}", v, out)
    elif isinstance(value, list):
        sep = "" if key.endswith("|") else "/"
        out.append(f"v\t{key}{sep}n\ti\t{len(value)}")
        for i, v in enumerate(value):
            _value(f"{key}{sep}{i}", v, out)
    elif isinstance(value, bool):
        out.append(f"v\t{key}\ti\t{int(value)}")
    elif isinstance(value, int):
        out.append(f"v\t{key}\ti\t{value}")
    elif isinstance(value, float):
        out.append(f"v\t{key}\td\t{value!r}")
    elif isinstance(value, str):
        out.append(f"v\t{key}\ts\t{value}")


def derive(scenario: dict[str, Any]) -> str:
    """The C library's flat file for a scenario (the format is at the top of fake_nvml.c)."""
    out: list[str] = []
    for fn, value in scenario.get("system", {}).items():
        _value(f"-|{fn}|", value, out)
    for index, gpu in enumerate(scenario.get("gpus", [])):
        for fn, value in gpu.items():
            _value(f"{index}|{fn}|", value, out)
    for rule in scenario.get("errors", []):
        out.append(f"r\t{rule.get('gpu', '*')}\t{rule.get('fn', '*')}\t{NVML_ERRORS[rule['error']]}")
    for rule in scenario.get("hangs", []):
        out.append(f"h\t{rule.get('gpu', '*')}\t{rule.get('fn', '*')}\t{float(rule.get('seconds', 3600))!r}")
    for event in scenario.get("events", []):
        out.append(f"x\t{event['gpu']}\t{EVENT_TYPES[event['kind']]}\t{event['data']}")
    return "".join(line + "\n" for line in out)


def environment(scenario_file: str, work_dir: str, base: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for a process that runs the real pynvml backend on the C fake for this nvml.json."""
    with open(scenario_file, encoding="utf-8") as f:
        scenario = json.load(f)
    folder = build(work_dir, hidden_symbols(scenario))
    flat = os.path.join(work_dir, hashlib.sha256(os.path.abspath(scenario_file).encode()).hexdigest()[:12] + ".txt")
    with open(flat, "w", encoding="utf-8") as f:
        f.write(derive(scenario))
    env = dict(os.environ if base is None else base)
    env["LD_LIBRARY_PATH"] = folder + (":" + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
    env["FAKE_NVML_SCENARIO"] = flat
    env["NODEHEALTH_NVML_BACKEND"] = "driver"
    return env
