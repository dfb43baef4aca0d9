"""The kubelet PodResources client against a real gRPC server speaking the v1 proto on a unix socket."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

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
