"""The in-process timer on a real one-rank gloo group: what it records, and what it costs to import."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from conftest import IN_CI, free_port

from nodehealth.hang import record, timer


@pytest.fixture
def world_of_one(tmp_path):
    try:
        import torch
        import torch.distributed as dist
    except ImportError:
        if IN_CI:
            pytest.fail("torch is not installed; .ci/run must install the CPU wheel")
        pytest.skip("torch is not installed")
    t = timer.enable(str(tmp_path), interval=0.05)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    yield t, torch, dist
    t.uninstall()
    dist.destroy_process_group()


def read(t: timer.Timer) -> dict:
    t.publish()
    return record.read_record(t.path)


def test_collectives_are_counted_and_timed(world_of_one):
    t, torch, dist = world_of_one
    with timer.region("step"):
        dist.all_reduce(torch.ones(3, 5))
        dist.broadcast(torch.zeros(2, dtype=torch.int64), src=0)
        dist.barrier()
        work = dist.all_reduce(torch.ones(4), async_op=True)
        work.wait()
        inside = read(t)
    group = read(t)["groups"]["0"]
    assert (group["enqueued"], group["completed"], group["pending"]) == (4, 4, [])
    assert [(op["op"], op["sizes"], op["dtype"]) for op in group["recent"]] == [
        ("all_reduce", [[3, 5]], "float32"), ("broadcast", [[2]], "int64"), ("barrier", [], None),
        ("all_reduce", [[4]], "float32")]
    assert group["p99"]["all_reduce"]["samples"] == 2 and group["ranks"] == [0]
    assert inside["regions"][0]["name"] == "step" and inside["step"] == 0
    assert read(t)["step"] == 1 and read(t)["regions"] == []


def test_failed_call_is_not_left_pending(world_of_one):
    t, torch, dist = world_of_one
    with pytest.raises(RuntimeError, match="invalid root rank"):
        dist.broadcast(torch.ones(2), src=5)
    rec = read(t)
    assert rec["groups"]["0"]["pending"] == [] and rec["last_error"]


def test_watchdog_publishes_heartbeats_and_exit(world_of_one):
    t, torch, dist = world_of_one
    first = read(t)["heartbeat"]
    time.sleep(0.3)
    assert read(t)["heartbeat"] > first
    t.uninstall()
    assert record.read_record(t.path)["exited"] is True
    assert dist.all_reduce is t.originals["all_reduce"]


class FakeEvent:
    def __init__(self, ready: list):
        self.ready = ready

    def query(self) -> bool:
        return self.ready[0]


def test_gpu_events_complete_in_order_without_torch_cuda(tmp_path):
    """The GPU path on a machine without libcuda: the fallback query, oldest event first."""
    t = timer.Timer(str(tmp_path), 1.0)
    t.cuda.method = "torch.cuda.Event.query (holds the GIL)"  # the fallback, even where libcuda exists
    stream = timer._Stream([0])
    ready_a, ready_b = [False], [True]
    for seq, ready in ((1, ready_a), (2, ready_b)):
        stream.enqueued = seq
        op = {"seq": seq, "op": "all_reduce", "enqueued_at": time.time()}
        stream.pending[seq] = op
        t.events.append((FakeEvent(ready), op, stream))
    t.poll_completions()
    assert sorted(stream.pending) == [1, 2], "a later event must not complete before an earlier one"
    ready_a[0] = True
    t.poll_completions()
    assert stream.pending == {} and stream.snapshot()["completed"] == 2


def test_enable_needs_a_directory(monkeypatch):
    monkeypatch.delenv(timer.ENV_DIR, raising=False)
    monkeypatch.setattr(timer, "_timer", None)
    with pytest.raises(ValueError, match="NODEHEALTH_HANG_DIR"):
        timer.enable()
    assert timer.enable_from_env() is None


def test_import_is_light():
    code = "import sys, nodehealth.hang; print(sorted(m for m in ('torch', 'numpy') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30,
                         env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert out.stdout.strip() == "[]", out.stderr
