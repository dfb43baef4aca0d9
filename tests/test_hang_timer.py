"""The in-process timer on a real one-rank gloo group: what it records, and what it costs to import."""
from __future__ import annotations

import os
import subprocess
import sys
import threading
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


def test_blocks_of_op_durations_are_the_same_ops_on_every_rank(world_of_one):
    """Durations by sequence number, summed over aligned blocks of 8 ops (seq 1-8, 9-16, ...), only
    blocks whose ops all completed, and only while their slots were not written over."""
    t, torch, dist = world_of_one
    for _ in range(20):
        dist.all_reduce(torch.ones(2))
    blocks = read(t)["groups"]["0"]["blocks"]
    assert (blocks["ops"], blocks["first"], len(blocks["seconds"])) == (8, 0, 2), "ops 17-20 make no block yet"
    assert all(0 <= longest <= total for total, longest in zip(blocks["seconds"], blocks["longest"]))
    for _ in range(timer.BY_SEQ_KEPT):
        dist.all_reduce(torch.ones(2))
    blocks = read(t)["groups"]["0"]["blocks"]  # 532 ops: the slots of ops 1-20 were written over
    assert (blocks["first"], blocks["first"] + len(blocks["seconds"])) == (3, 532 // 8)


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
        op = {"seq": seq, "op": "all_reduce", "enqueued_at": time.time(), "_device": 0}
        stream.pending[seq] = op
        t.events.append((FakeEvent(ready), op, stream, None))
    t.poll_completions()
    assert sorted(stream.pending) == [1, 2], "a later event must not complete before an earlier one"
    ready_a[0] = True
    t.poll_completions()
    assert stream.pending == {} and stream.snapshot()["completed"] == 2


def test_enable_without_the_variable_uses_the_daemons_directory(monkeypatch):
    monkeypatch.delenv(timer.ENV_DIR, raising=False)
    monkeypatch.setattr(timer, "_timer", None)
    monkeypatch.setattr(timer.Timer, "install", lambda self: None)
    assert timer.enable_from_env() is None
    assert timer.enable().directory == "/run/nodehealth/hang" == timer.DEFAULT_DIR
    monkeypatch.setattr(timer, "_timer", None)


@pytest.mark.parametrize("env,expected", [
    ({"NODEHEALTH_HANG_JOB": "mine", "TORCHELASTIC_RUN_ID": "r1"}, "mine"),
    ({"TORCHELASTIC_RUN_ID": "r1"}, "r1"),
    # torchrun --nproc-per-node N with no --rdzv-id: run id "none", all ranks here
    ({"TORCHELASTIC_RUN_ID": "none", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29511", "WORLD_SIZE": "4",
      "LOCAL_WORLD_SIZE": "4"}, "127.0.0.1:29511-PARENT"),
    ({"TORCHELASTIC_RUN_ID": "none", "MASTER_ADDR": "n1", "MASTER_PORT": "29511", "WORLD_SIZE": "16",
      "LOCAL_WORLD_SIZE": "8", "TORCHELASTIC_RESTART_COUNT": "2"}, "n1:29511-2"),
    # a Kubernetes pod's owner, from the downward API: before torchrun's run id, which users copy
    ({"NODEHEALTH_HANG_POD_OWNER": "llama-7b", "NODEHEALTH_HANG_POD_NAMESPACE": "team-a",
      "NODEHEALTH_HANG_POD_OWNER_UID": "1f2e3d4c-aaaa-bbbb-cccc-0123456789ab", "TORCHELASTIC_RUN_ID": "train"},
     "k8s/team-a/llama-7b/1f2e3d4c"),
    ({"NODEHEALTH_HANG_POD_OWNER": "llama-7b", "NODEHEALTH_HANG_POD_OWNER_UID": ""}, "k8s/llama-7b"),
    ({"NODEHEALTH_HANG_JOB": "mine", "NODEHEALTH_HANG_POD_OWNER": "llama-7b"}, "mine"),
    # the pod has no such label: the downward API gives an empty string, and the next source decides
    ({"NODEHEALTH_HANG_POD_OWNER": "", "NODEHEALTH_HANG_POD_NAMESPACE": "team-a", "TORCHELASTIC_RUN_ID": "r1"}, "r1"),
    ({"SLURM_JOB_ID": "4242", "TORCHELASTIC_RUN_ID": "none"}, "4242"),
])
def test_job_identity_without_a_job_id(monkeypatch, env, expected):
    for key in ("NODEHEALTH_HANG_JOB", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "MASTER_ADDR", "MASTER_PORT",
                "WORLD_SIZE", "LOCAL_WORLD_SIZE", "TORCHELASTIC_RESTART_COUNT", timer.ENV_POD_OWNER,
                timer.ENV_POD_NAMESPACE, timer.ENV_POD_OWNER_UID):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    parent = f"{os.getppid()}-{timer._process_start_ticks(os.getppid())}"
    assert timer._job_id() == expected.replace("PARENT", parent)


def test_destroy_process_group_marks_a_clean_finish(tmp_path):
    """After destroy_process_group() the record stays, says finished, and the heartbeat goes on."""
    try:
        import torch.distributed as dist
    except ImportError:
        pytest.skip("torch is not installed")
    t = timer.enable(str(tmp_path), interval=0.05)
    try:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
        t.publish()
        assert record.read_record(t.path)["finished"] is False
        dist.destroy_process_group()
        first = record.read_record(t.path)
        assert first["finished"] is True and first["rank"] == 0 and first["world_size"] == 1
        time.sleep(0.3)
        assert record.read_record(t.path)["heartbeat"] > first["heartbeat"]
    finally:
        t.uninstall()
    assert record.read_record(t.path)["exited"] is True


def test_import_is_light():
    code = "import sys, nodehealth.hang; print(sorted(m for m in ('torch', 'numpy') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30,
                         env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert out.stdout.strip() == "[]", out.stderr


@pytest.mark.filterwarnings("ignore:Running all_reduce on global rank")
def test_calls_this_rank_takes_no_part_in_are_not_timed(world_of_one):
    t, torch, dist = world_of_one
    outsider = dist.GroupMember.NON_GROUP_MEMBER
    assert dist.all_reduce(torch.ones(2), group=outsider) is None
    assert dist.all_reduce(torch.ones(2), dist.ReduceOp.SUM, outsider) is None  # positional: not WORLD either
    sub = dist.new_group([0])
    dist.all_reduce(torch.ones(2), dist.ReduceOp.SUM, sub)  # a positional subgroup is its own stream
    dist.barrier(sub)
    groups = read(t)["groups"]
    assert "0" not in groups, "a call outside the group must not count in WORLD"
    assert [(g["enqueued"], g["pending"]) for g in groups.values()] == [(2, [])]
    assert [op["op"] for op in groups[sub.group_name]["recent"]] == ["all_reduce", "barrier"]


class FakeGroup:
    pass


def test_group_cache_does_not_keep_groups_alive(tmp_path):
    import gc
    import types

    t = timer.Timer(str(tmp_path), 1.0)
    t.group_class = FakeGroup
    t.dist = types.SimpleNamespace(get_process_group_ranks=lambda g: g.ranks, get_rank=lambda: 0,
                                   group=types.SimpleNamespace(WORLD=None))
    mine, other = FakeGroup(), FakeGroup()
    mine.ranks, mine.group_name, other.ranks = [0, 1], "7", [2, 3]
    assert t.group(mine) == ("7", [0, 1]) and t.group(other) is None and t.group(-100) is None
    assert t.group(None) is None, "no WORLD yet: nothing to time"
    del mine, other
    gc.collect()
    assert len(t.groups) == 0


class BrokenEvent:
    def query(self) -> bool:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")


def pending_op(stream: timer._Stream, seq: int) -> dict:
    stream.enqueued = seq
    op = stream.pending[seq] = {"seq": seq, "op": "all_reduce", "enqueued_at": time.time(), "_device": 0}
    return op


def test_event_that_raises_completes_with_an_error_and_unblocks_the_rest(tmp_path):
    t = timer.Timer(str(tmp_path), 1.0)
    t.cuda.method = "torch.cuda.Event.query (holds the GIL)"
    stream = timer._Stream([0])
    t.events.extend([(BrokenEvent(), pending_op(stream, 1), stream, None),
                     (FakeEvent([True]), pending_op(stream, 2), stream, None)])
    t.poll_completions()
    assert stream.pending == {} and not t.events
    assert "querying its CUDA event failed: RuntimeError: CUDA error" in stream.recent[0]["error"]


class CountedEvent:
    """An event on a CUDA stream that completes its events in order: done once the stream reached it."""

    def __init__(self, position: int, reached: list, asked: list):
        self.position, self.reached, self.asked = position, reached, asked

    def query(self) -> bool:
        self.asked.append(self.position)
        if self.reached[0] is None:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return self.position < self.reached[0]


def test_events_of_one_stream_are_asked_by_bisection_and_complete_in_order(tmp_path):
    """1,000 events on one stream, 600 done: about ten queries, not a thousand, and only the done ones
    complete, oldest first; the next poll takes the rest once the stream reached them."""
    t = timer.Timer(str(tmp_path), 1.0)
    t.cuda.method = "torch.cuda.Event.query (holds the GIL)"
    stream, reached, asked = timer._Stream([0]), [600], []
    t.events.extend((CountedEvent(i, reached, asked), pending_op(stream, i + 1), stream, (7, 0, 1))
                    for i in range(1000))
    t.poll_completions()
    assert len(asked) <= 11 and sorted(stream.pending) == list(range(601, 1001))
    assert [op["seq"] for op in stream.recent] == list(range(1, 601))[-len(stream.recent):]
    reached[0], asked[:] = 1000, []
    t.poll_completions()
    assert stream.pending == {} and not t.events and len(asked) <= 11


def test_a_running_event_of_one_stream_holds_back_the_done_events_of_another_behind_it(tmp_path):
    t = timer.Timer(str(tmp_path), 1.0)
    t.cuda.method = "torch.cuda.Event.query (holds the GIL)"
    stream, asked = timer._Stream([0]), []
    fast, slow = [10], [0]  # stream A done with all its events, stream B with none
    for i in range(6):
        key, reached = ((1, 0, 1), fast) if i != 3 else ((2, 0, 1), slow)
        t.events.append((CountedEvent(i, reached, asked), pending_op(stream, i + 1), stream, key))
    t.poll_completions()
    assert sorted(stream.pending) == [4, 5, 6], "op 4 (stream B) still runs: 5 and 6 wait behind it"
    slow[0] = 10
    t.poll_completions()
    assert stream.pending == {}


def test_a_stream_whose_query_fails_is_asked_one_by_one_and_the_error_told(tmp_path):
    t = timer.Timer(str(tmp_path), 1.0)
    t.cuda.method = "torch.cuda.Event.query (holds the GIL)"
    stream, reached, asked = timer._Stream([0]), [None], []
    t.events.extend((CountedEvent(i, reached, asked), pending_op(stream, i + 1), stream, (7, 0, 1))
                    for i in range(3))
    t.poll_completions()
    assert stream.pending == {} and not t.events
    assert all("illegal memory access" in op["error"] for op in stream.recent)


def test_the_current_stream_is_made_once_per_stream(tmp_path):
    """torch.cuda.current_stream builds a Stream object at every call; the timer asks torch for the stream's
    ids and makes each Stream once, and the ids tell the events' streams apart."""
    t = timer.Timer(str(tmp_path), 1.0)
    made = []

    class FakeCuda:
        @staticmethod
        def Stream(stream_id, device_index, device_type):
            made.append((stream_id, device_index, device_type))
            return ("stream", stream_id, device_index)
    current = {0: (11, 0, 1), 1: (21, 1, 1)}
    t.torch_cuda, t.current_stream_ids = FakeCuda, current.__getitem__
    first = [t.current_stream(0) for _ in range(3)] + [t.current_stream(1)]
    assert first[0] == first[1] == first[2] == (("stream", 11, 0), (11, 0, 1))
    assert first[3] == (("stream", 21, 1), (21, 1, 1)) and made == [(11, 0, 1), (21, 1, 1)]
    current[0] = (12, 0, 1)  # another stream made current on device 0
    assert t.current_stream(0) == (("stream", 12, 0), (12, 0, 1)) and len(made) == 3
    t.current_stream_ids = None  # a torch without the ids: its own current_stream, streams not told apart
    FakeCuda.current_stream = staticmethod(lambda device: ("torch's", device))
    assert t.current_stream(1) == (("torch's", 1), None)


def test_a_record_taken_earlier_is_never_written_over_a_later_one(world_of_one, monkeypatch):
    """The watchdog's publish took its snapshot before an op began and is slow to write; the training
    thread publishes with the op pending meanwhile (as the test worker does before stopping itself): the
    file ends with the later record, not the watchdog's older one."""
    t, torch, dist = world_of_one
    write, first_taken, release = timer.record.write_json, threading.Event(), threading.Event()

    def slow_first(path, snap):
        if not first_taken.is_set():
            first_taken.set()
            release.wait(5)
        write(path, snap)
    monkeypatch.setattr(timer.record, "write_json", slow_first)
    early = threading.Thread(target=t.publish)
    early.start()
    assert first_taken.wait(5)
    later = threading.Thread(target=lambda: (t.step_mark(), t.publish()))
    t.step_mark = lambda: setattr(t, "step", 4242)
    later.start()
    later.join(0.3)
    release.set()
    early.join(5)
    later.join(5)
    assert record.read_record(t.path)["step"] == 4242  # the file as left, not published again


def test_watchdog_keeps_heartbeating_when_polling_raises(tmp_path, caplog):
    t = timer.Timer(str(tmp_path), 0.01)
    published = []
    t.publish = lambda: published.append(time.time())
    t.answer_flight_recorder_request = lambda: None

    def broken() -> None:
        raise RuntimeError("driver gone")
    t.poll_completions = broken
    t.thread.start()
    time.sleep(0.4)
    t.stop.set()
    alive = t.thread.is_alive()
    t.thread.join(1)
    assert alive and len(published) >= 3
    assert t.last_error == "polling completions failed: RuntimeError: driver gone"
    assert caplog.text.count("driver gone") == 1, "said once in the rank's log, not every 50 ms"


class FakeTensor:
    shape, dtype, is_cuda = (4,), "torch.float32", True

    def __init__(self, index: int):
        import types

        self.device = types.SimpleNamespace(index=index)


def test_cuda_device_is_the_tensors_and_the_watchdog_binds_it(tmp_path, monkeypatch):
    """The op's device is read on the calling thread; the query binds that device, not the
    watchdog thread's own current device (0 on a fresh thread)."""
    torch = pytest.importorskip("torch")
    t = timer.Timer(str(tmp_path), 1.0)
    t.groups[group := FakeGroup()] = ("0", [0])
    t.group_class = FakeGroup
    work = type("W", (), {"is_completed": lambda self: False})()  # async: the op stays pending
    timer._wrap(t, "all_reduce", lambda tensor, group=None: work, False)(FakeTensor(3), group)
    (op,) = t.streams["0"].pending.values()
    assert op["_device"] == 3 and "_device" not in timer._public(op)
    bound = []
    monkeypatch.setattr(torch.cuda, "set_device", bound.append)
    t.cuda.fn, t.cuda.method = (lambda handle: 0), "cuEventQuery (GIL released)"
    event = type("E", (), {"cuda_event": 1234})()
    assert t.cuda.done(event, 3) and t.cuda.done(event, 3) and t.cuda.done(event, 5)
    assert bound == [3, 5]


def test_the_exception_that_kills_a_rank_is_in_its_last_record(tmp_path):
    pytest.importorskip("torch")
    code = ("import sys, torch.distributed as dist\n"
            "from nodehealth.hang import timer\n"
            f"timer.enable({str(tmp_path)!r})\n"
            f"dist.init_process_group('gloo', init_method='tcp://127.0.0.1:{free_port()}', rank=0, world_size=1)\n"
            "raise RuntimeError('CUDA error: an illegal memory access')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "NODEHEALTH_HANG_JOB": "boom"})
    assert out.returncode == 1 and "illegal memory access" in out.stderr, "the usual traceback still shows"
    rec = record.read_record(record.record_path(str(tmp_path), "boom", 0))
    assert rec["exited"] and rec["exit_reason"] == "uncaught RuntimeError: CUDA error: an illegal memory access"
    from nodehealth.hang import merge

    (v,) = [v for v in merge.verdicts({"records": {"0": rec}, "processes": {"0": "gone"}}) if v["kind"] == "rank_gone"]
    assert v["summary"] == ("rank 0's process is gone (exit code 1): it exited after an uncaught "
                            "RuntimeError: CUDA error: an illegal memory access while its peers wait")


def test_the_launcher_puts_the_scripts_exit_code_in_the_last_record(tmp_path):
    """Under `python -m nodehealth.hang.run` a SystemExit's code is known to the rank itself, so the
    report says it even where the daemon cannot hear exits from the kernel."""
    pytest.importorskip("torch")
    script = tmp_path / "train.py"
    script.write_text("import sys, torch.distributed as dist\n"
                      f"dist.init_process_group('gloo', init_method='tcp://127.0.0.1:{free_port()}', rank=0, "
                      "world_size=1)\n"
                      "sys.exit(3)\n")
    out = subprocess.run([sys.executable, "-m", "nodehealth.hang.run", str(script)], capture_output=True, text=True,
                         timeout=120, env={**os.environ, "NODEHEALTH_HANG_JOB": "three",
                                           "NODEHEALTH_HANG_DIR": str(tmp_path / "records")})
    assert out.returncode == 3, out.stderr
    rec = record.read_record(record.record_path(str(tmp_path / "records"), "three", 0))
    assert rec["exited"] and rec["exit_code"] == 3 and rec["exit_reason"] is None
    from nodehealth.hang import merge

    (v,) = [v for v in merge.verdicts({"records": {"0": rec}, "processes": {"0": "gone"}}) if v["kind"] == "rank_gone"]
    assert v["summary"] == "rank 0's process is gone (exit code 3): it exited while its peers wait"
    # the kernel's word, when the daemon heard it, comes first
    (v,) = [v for v in merge.verdicts({"records": {"0": rec}, "processes": {"0": "gone"},
                                       "exit_statuses": {"0": "killed by SIGKILL"}}) if v["kind"] == "rank_gone"]
    assert v["summary"].startswith("rank 0's process is gone (killed by SIGKILL)")


def test_an_async_op_issued_while_the_watchdog_dozes_is_timed_at_once(tmp_path):
    """With nothing to poll the watchdog sleeps until the next record; an async handle wakes it, so
    the op's time is not rounded up to the publish interval (DDP's all-reduce comes this way)."""
    try:
        import torch
        import torch.distributed as dist
    except ImportError:
        pytest.skip("torch is not installed")
    t = timer.enable(str(tmp_path), interval=5.0)
    try:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
        time.sleep(0.3)  # the watchdog has published once and dozes for 5 s
        assert t.dozing
        dist.all_reduce(torch.ones(4), async_op=True)  # never waited on: only the watchdog completes it
        time.sleep(0.5)
        (stream,) = t.streams.values()
        assert stream.pending == {} and stream.recent[-1]["seconds"] < 0.3
    finally:
        t.uninstall()
        dist.destroy_process_group()


def test_snapshots_taken_while_another_thread_issues_calls_stay_consistent(tmp_path):
    """The calling thread changes a stream without a lock: the watchdog's copies must never fail and
    never show an op as both finished and pending, or more finished than issued."""
    import threading

    t = timer.Timer(str(tmp_path), 1.0)
    t.group_class = FakeGroup
    group = FakeGroup()
    t.groups[group] = ("0", [0, 1])
    tensor = type("CpuTensor", (), {"shape": (4,), "dtype": "torch.float32", "is_cuda": False})()
    wrapped = {name: timer._wrap(t, name, lambda tensor, group=None: None, False)
               for name in ("all_reduce", "broadcast", "barrier", "all_gather", "reduce", "scatter")}
    stop = threading.Event()

    def issue() -> None:
        while not stop.is_set():
            for fn in wrapped.values():
                fn(tensor, group)

    caller = threading.Thread(target=issue)
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as the interpreter can
    caller.start()
    try:
        snapshots = 0
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            for stream in list(t.streams.values()):
                snap = stream.snapshot()
                assert snap["completed"] <= snap["enqueued"]
                assert all(op["seq"] > snap["completed"] for op in snap["pending"]), snap
                assert all("seconds" in op and op["sizes"] == [(4,)] for op in snap["recent"])
                snapshots += 1
    finally:
        stop.set()
        caller.join()
        sys.setswitchinterval(interval)
    stream = t.streams["0"]
    assert snapshots > 100 and stream.enqueued > 1000 and not stream.pending
    assert sorted(stream.durations) == sorted(wrapped), "every op name timed"


@pytest.mark.parametrize("env, expected", [
    ({"NODEHEALTH_HANG_POD_NAME": "llama-7b-worker-0", "NODEHEALTH_HANG_POD_NAMESPACE": "team-a"},
     {"namespace": "team-a", "name": "llama-7b-worker-0"}),
    ({"NODEHEALTH_HANG_POD_NAME": "llama-7b-worker-0"}, {"namespace": None, "name": "llama-7b-worker-0"}),
    ({"NODEHEALTH_HANG_POD_NAMESPACE": "team-a"}, None),  # not in a pod, or the pod does not say its name
])
def test_the_pod_from_the_downward_api(monkeypatch, env, expected):
    for key in (timer.ENV_POD_NAME, timer.ENV_POD_NAMESPACE):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert timer._pod() == expected


def test_an_uninstalled_timer_writes_nothing_at_exit(tmp_path):
    """uninstall() has published the last record: the exit hook must not write again (into a directory
    a benchmark or test has since removed, which printed a traceback at every exit)."""
    pytest.importorskip("torch")
    code = ("import shutil, sys\nimport torch.distributed as dist\nfrom nodehealth.hang import timer\n"
            "t = timer.enable(sys.argv[1], interval=0.05)\n"
            "dist.init_process_group('gloo', init_method='tcp://127.0.0.1:' + sys.argv[2], rank=0, world_size=1)\n"
            "dist.all_reduce(__import__('torch').ones(2))\n"
            "t.uninstall()\nshutil.rmtree(sys.argv[1])\n"
            "dist.destroy_process_group()\n")
    hang = tmp_path / "hang"
    out = subprocess.run([sys.executable, "-c", code, str(hang), str(free_port())], capture_output=True, text=True,
                         timeout=60, env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
    assert not hang.exists()
