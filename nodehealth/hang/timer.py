"""In-process collective timer: imported by training code, so only the standard library at import.

Long on purpose: it runs inside the training process, which may import nothing but the standard
library and this module.

`enable()` wraps the torch.distributed functions that talk to peers. Each call gets a sequence
number in its process group, an enqueue time, its tensor sizes and dtype, and is pending until it
completes. Completion on CPU (gloo) is the call returning, or for `async_op=True` its Work handle
completing; on GPU it is a CUDA event recorded after the call, queried by the watchdog thread
through the driver with ctypes (which releases the GIL, where `torch.cuda.Event.query()` holds it
and can wait behind the CUDA context lock). The watchdog thread also publishes the state record
every `interval` seconds; its timestamp is the heartbeat the detector watches.

The timer only records; the daemon decides what is a hang.
"""
from __future__ import annotations

import atexit
import collections
import contextlib
import ctypes
import itertools
import logging
import os
import socket
import sys
import threading
import time
import weakref
from collections.abc import Iterator
from typing import Any

from nodehealth.hang import record
from nodehealth.host import write_atomic

ENV_DIR = "NODEHEALTH_HANG_DIR"
ENV_INTERVAL = "NODEHEALTH_HANG_INTERVAL"
ENV_JOB = "NODEHEALTH_HANG_JOB"
# The Kubernetes pod's owner, for pods that get no API rights: set from the downward API in the pod
# spec (a label naming the owning PyTorchJob, Job or JobSet; metadata.namespace; the owner's uid
# where its controller labels pods with it, so a re-created job of the same name is another job).
ENV_POD_OWNER = "NODEHEALTH_HANG_POD_OWNER"
ENV_POD_NAMESPACE = "NODEHEALTH_HANG_POD_NAMESPACE"
ENV_POD_OWNER_UID = "NODEHEALTH_HANG_POD_OWNER_UID"
ENV_POD_NAME = "NODEHEALTH_HANG_POD_NAME"  # the rank's own pod (metadata.name), named in the hang bundle
DEFAULT_DIR = "/run/nodehealth/hang"  # the daemon's default hang.directory
DEFAULT_INTERVAL = 0.5
POLL_SECONDS = 0.05
POLL_BATCH = 64  # async handles queried per poll
PUBLISH_WAIT_SECONDS = 2.0  # a publish waits this long for another thread's to end, then is skipped
# Flight Recorder is read every this many publish intervals (10 s by default): its dump holds the GIL
# for tens of milliseconds, and it only matters for collectives issued from C++, judged in minutes.
FR_POLL_INTERVALS = 20
DURATIONS_KEPT = 256
# Every op's duration by its sequence number, for the straggler rule: summed over aligned blocks of
# BLOCK_OPS ops, the same ops on every rank of a group (a wait lands in whichever op it lands in).
BY_SEQ_KEPT = 512  # 64 blocks: stretches long enough for jobs of up to ~100 collectives a step
BLOCK_OPS = 8
RECENT_KEPT = 8
PENDING_PUBLISHED = 8

COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter", "reduce_scatter_tensor",
               "broadcast", "barrier", "reduce", "all_to_all", "all_to_all_single", "gather", "scatter")
P2P = ("send", "recv", "isend", "irecv", "batch_isend_irecv")

_timer: Timer | None = None
_enable_lock = threading.Lock()


def enable(directory: str | None = None, interval: float | None = None) -> Timer:
    """Start timing collectives and publishing this rank's record under `directory`.

    The directory defaults to $NODEHEALTH_HANG_DIR, else /run/nodehealth/hang (the daemon's). Call
    it before or after init_process_group; the record is written once the default group exists.
    Idempotent.
    """
    global _timer
    with _enable_lock:
        if _timer is not None:
            return _timer
        directory = directory or os.environ.get(ENV_DIR) or DEFAULT_DIR
        if interval is None:
            interval = float(os.environ.get(ENV_INTERVAL) or DEFAULT_INTERVAL)
        timer = Timer(directory, interval)
        timer.install()
        _timer = timer
        return timer


def enable_from_env() -> Timer | None:
    """enable() when $NODEHEALTH_HANG_DIR is set, else nothing: for launch wrappers."""
    return enable() if os.environ.get(ENV_DIR) else None


@contextlib.contextmanager
def region(name: str) -> Iterator[None]:
    """Mark a stretch of user code; leaving a region named "step" counts a step."""
    timer = _timer
    if timer is None:
        yield
        return
    timer.enter_region(name)
    try:
        yield
    finally:
        timer.leave_region(name)


class _Stream:
    """Sequence state of one process group (collectives) or its point-to-point traffic.

    The calling thread changes it without a lock (a lock taken twice per call was a fifth of the
    timer's cost in a training loop): each change is one dict or deque operation, atomic under
    the GIL, and the watchdog reads it through copies made in one C call each.
    """

    __slots__ = ("ranks", "counter", "enqueued", "pending", "recent", "durations", "by_seq")

    def __init__(self, ranks: list[int] | None):
        self.ranks = ranks
        self.counter = itertools.count(1)  # next() is atomic: two threads issuing never share a number
        self.enqueued = 0
        self.pending: dict[int, dict[str, Any]] = {}
        self.recent: collections.deque = collections.deque(maxlen=RECENT_KEPT)
        self.durations: dict[str, collections.deque] = {}
        self.by_seq = [0.0] * BY_SEQ_KEPT  # slot seq % BY_SEQ_KEPT: the duration of op seq

    def snapshot(self) -> dict[str, Any]:
        enqueued = self.enqueued
        pending = list(self.pending.values())
        if pending:  # ops begun since `enqueued` was read count too
            completed = min(op["seq"] for op in pending) - 1
            enqueued = max(enqueued, max(op["seq"] for op in pending))
        else:
            completed = enqueued
        return {"ranks": self.ranks, "enqueued": enqueued, "completed": completed,
                "pending": [_public(op) for op in pending[:PENDING_PUBLISHED]], "pending_count": len(pending),
                "recent": [_public(op) for op in list(self.recent)],
                "p99": {op: {"seconds": _quantile(d, 0.99), "p50": _quantile(d, 0.5), "samples": len(d)}
                        for op, d in list(self.durations.items()) if d},
                "blocks": self.blocks(completed, enqueued)}

    def blocks(self, completed: int, enqueued: int) -> dict[str, Any]:
        """Seconds spent in each block of BLOCK_OPS ops (block b: ops b*BLOCK_OPS+1 to (b+1)*BLOCK_OPS),
        in total and in the longest op, for the blocks whose ops all completed and are still kept."""
        durations = list(self.by_seq)  # one C call; every op up to `completed` had written its slot
        issued = max(enqueued, self.enqueued)  # read after the copy: no slot beyond it was written
        first = max(0, (issued - BY_SEQ_KEPT - 1) // BLOCK_OPS + 1)  # older slots were written over
        total, longest = [], []
        for b in range(first, completed // BLOCK_OPS):
            start = b * BLOCK_OPS + 1
            block = [durations[s % BY_SEQ_KEPT] for s in range(start, start + BLOCK_OPS)]
            total.append(round(sum(block), 4))
            longest.append(round(max(block), 4))
        return {"ops": BLOCK_OPS, "first": first, "seconds": total, "longest": longest}


def _public(op: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in dict(op).items() if k[0] != "_"}  # dict(): one C call, while the op may change


def _quantile(values: collections.deque, q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class Timer:
    def __init__(self, directory: str, interval: float):
        self.directory = directory
        self.interval = interval
        self.lock = threading.Lock()
        self.publish_lock = threading.Lock()  # taken before `lock` (publish takes a snapshot under it)
        self.streams: dict[str, _Stream] = {}
        # by the group itself, held weakly: an id() could be reused by a later group
        self.groups: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self.last_group: tuple[Any, Any] | None = None  # (weak ref to a group, its entry in self.groups)
        # async handles the watchdog polls, by id (the dict holds the handle, so the id stays its own):
        # removal is O(1), and a loop issuing thousands before waiting must not cost O(n) per call
        self.works: dict[int, tuple[Any, dict[str, Any], _Stream]] = {}
        # CUDA events, oldest first, each with the CUDA stream it was recorded on (None: not known)
        self.events: collections.deque[tuple[Any, dict[str, Any], _Stream, Any]] = collections.deque()
        self.regions: list[tuple[str, float]] = []
        self.step = 0
        self.last_error: str | None = None
        self.logged_error = False
        self.originals: dict[str, Any] = {}
        self.dist: Any = None
        self.c10d_world: Any = None  # c10d's _World, where the default group is read cheaply
        # torch.cuda, whose `_initialized` says whether any tensor can be on a GPU at all: reading
        # is_cuda of every CPU tensor costs on every call
        self.cuda_state: Any = _ASSUME_CUDA
        self.torch_cuda: Any = None  # torch.cuda, once installed: the GPU path makes events with it
        # torch's (stream id, device, device type) of a device's current stream, where this torch has it: a
        # call where torch.cuda.current_stream also builds a Stream object (2-4 us), made once per stream here
        self.current_stream_ids: Any = None
        self.cuda_streams: dict[tuple[int, int, int], Any] = {}
        self.cuda = _CudaQuery()
        self.path: str | None = None
        self.stop = threading.Event()
        self.fr_groups: dict[str, dict[str, Any]] = {}  # "fr/NAME": what Flight Recorder saw past our wrappers
        self.next_fr_poll = 0.0
        self.wake = threading.Event()  # set with stop, or when the watchdog dozes and something needs polling
        self.dozing = False
        self.thread = threading.Thread(target=self._watchdog, name="nodehealth-hang", daemon=True)
        self.host = socket.gethostname()
        self.pid = os.getpid()
        self.start_time = _process_start_ticks()
        self.identity: dict[str, Any] | None = None  # job, rank, world size: kept for after destroy
        self.finished = False  # the default process group was destroyed: a clean finish, not a hang
        self.exit_reason: str | None = None
        # the status this process exits with, where Python tells us (an uncaught exception; SystemExit
        # under nodehealth.hang.run): the daemon may not hear it from the kernel
        self.exit_code: int | None = None

    # -- wiring ------------------------------------------------------------------------------
    def install(self) -> None:
        import torch.distributed as dist  # only paid for when the timer is enabled

        self.dist = dist
        self.group_class = dist.ProcessGroup
        world = getattr(dist.distributed_c10d, "_world", None)
        self.c10d_world = world if hasattr(world, "_default_pg") else None
        import torch.cuda

        self.torch_cuda = torch.cuda
        if hasattr(torch.cuda, "_initialized"):
            self.cuda_state = torch.cuda
        self.current_stream_ids = getattr(torch._C, "_cuda_getCurrentStream", None)
        for name in COLLECTIVES + P2P:
            fn = getattr(dist, name, None)
            if fn is not None:
                self.originals[name] = fn
                setattr(dist, name, _wrap(self, name, fn, name in P2P))
        self._time_ddp()
        destroy = dist.destroy_process_group
        self.originals["destroy_process_group"] = destroy

        def destroy_process_group(*args: Any, **kwargs: Any) -> Any:
            result = destroy(*args, **kwargs)
            self.group_destroyed(args[0] if args else kwargs.get("group"))
            return result
        destroy_process_group.__wrapped__ = destroy  # type: ignore[attr-defined]
        dist.destroy_process_group = destroy_process_group
        self._note_fatal_exception()
        os.makedirs(self.directory, exist_ok=True)
        atexit.register(self.close)
        self.thread.start()

    def _note_fatal_exception(self) -> None:
        """Keep the exception that ends the process, for the last record: "rank 2's process is gone"
        then says why. The hook before ours still runs."""
        previous = self.previous_excepthook = sys.excepthook

        def excepthook(kind: Any, value: Any, tb: Any) -> None:
            self.exit_reason = f"uncaught {kind.__name__}: {value}"[:300]
            # Python's status after an uncaught exception; KeyboardInterrupt ends it by SIGINT instead
            self.exit_code = None if issubclass(kind, KeyboardInterrupt) else 1
            previous(kind, value, tb)
        sys.excepthook = self.excepthook = excepthook

    def _time_ddp(self) -> None:
        """DistributedDataParallel issues its gradient all-reduce from C++, past our wrappers. Before
        a DDP model's first forward, unless the user registered a communication hook of their own,
        register PyTorch's reference all-reduce hook (same result as the built-in path): it calls
        torch.distributed.all_reduce, which we time like any other call."""
        try:
            from torch.nn.parallel import DistributedDataParallel as DDP
        except ImportError:
            return
        forward = DDP.forward
        self.originals["DDP.forward"] = (DDP, forward)
        timer = self

        def timed_forward(ddp: Any, *args: Any, **kwargs: Any) -> Any:
            if not getattr(ddp, "_nodehealth_timed", False):
                ddp._nodehealth_timed = True
                timer.hook_ddp(ddp)
            return forward(ddp, *args, **kwargs)
        timed_forward.__wrapped__ = forward  # type: ignore[attr-defined]
        DDP.forward = timed_forward

    def hook_ddp(self, ddp: Any) -> None:
        if getattr(ddp, "_comm_hooks", None) or getattr(ddp, "reducer", None) is None:
            return  # the user's hook (it calls torch.distributed, timed) or nothing to reduce
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

        try:
            ddp.register_comm_hook(ddp.process_group, allreduce_hook)
        except Exception as e:  # a built-in hook already registered: say so, train on
            ddp._comm_hooks[:] = [h for h in ddp._comm_hooks if h[0] is not allreduce_hook]
            self._watchdog_error(f"DDP all-reduce not timed: {type(e).__name__}: {e}"[:300])

    def uninstall(self) -> None:
        """Put the original functions back (tests, benchmarks)."""
        global _timer
        for name, fn in self.originals.items():
            if name == "DDP.forward":
                fn[0].forward = fn[1]
                continue
            setattr(self.dist, name, fn)
        if getattr(self, "excepthook", None) is sys.excepthook:
            sys.excepthook = self.previous_excepthook
        atexit.unregister(self.close)  # the record's last word is written now, not again at exit
        self.close()
        if _timer is self:
            _timer = None

    def group_destroyed(self, group: Any) -> None:
        """destroy_process_group() of the default group is the job's clean finish: say so at once."""
        self.last_group = None
        if group is None or not self.dist.is_initialized():
            self.finished = True
            self.publish()

    def close(self) -> None:
        self.stop.set()
        self.wake.set()
        if self.thread.is_alive() and self.thread is not threading.current_thread():
            self.thread.join(2 * POLL_SECONDS + 1)
        self.publish(exited=True)

    # -- per call (the hot path is _wrap's `timed`) -------------------------------------------
    def new_stream(self, key: str, ranks: list[int] | None) -> _Stream:
        with self.lock:  # once per group: the watchdog iterates `streams` under the lock
            return self.streams.setdefault(key, _Stream(ranks))

    def issued(self, op: dict[str, Any], stream: _Stream, result: Any) -> Any:
        """The call returned: done on CPU; an async handle or a GPU op completes later."""
        if result is not None and hasattr(result, "is_completed"):
            with self.lock:
                self.works[id(result)] = (result, op, stream)
            if self.dozing:
                self.wake.set()
            return _TimedWork(result, op, stream, self)
        if isinstance(result, list) and result and hasattr(result[0], "is_completed"):
            with self.lock:  # batch_isend_irecv: the batch completes when its last handle does
                self.works[id(result[-1])] = (result[-1], op, stream)
            if self.dozing:
                self.wake.set()
            return result
        if op.get("_cuda"):
            cuda_stream, key = self.current_stream(op["_device"])
            event = self.torch_cuda.Event()
            event.record(cuda_stream)
            with self.lock:
                self.events.append((event, op, stream, key))
            if self.dozing:
                self.wake.set()
            return result
        self.complete(op, stream)
        return result

    def current_stream(self, device: int) -> tuple[Any, Any]:
        """The device's current CUDA stream, and what tells it from the others (None where not known)."""
        if self.current_stream_ids is None:
            return self.torch_cuda.current_stream(device), None
        ids = self.current_stream_ids(device)
        cuda_stream = self.cuda_streams.get(ids)
        if cuda_stream is None:  # a stream seen for the first time
            cuda_stream = self.cuda_streams[ids] = self.torch_cuda.Stream(
                stream_id=ids[0], device_index=ids[1], device_type=ids[2])
        return cuda_stream, ids

    def complete(self, op: dict[str, Any], stream: _Stream, error: str | None = None) -> None:
        seconds = time.time() - op["enqueued_at"]
        if stream.pending.pop(op["seq"], None) is None:
            return  # completed already: wait() and the watchdog may both see it done
        op["seconds"] = seconds
        if error:
            op["error"] = error
            self.last_error = error
        stream.recent.append(op)
        stream.by_seq[op["seq"] % BY_SEQ_KEPT] = seconds
        durations = stream.durations.get(op["op"])
        if durations is None:
            durations = stream.durations.setdefault(op["op"], collections.deque(maxlen=DURATIONS_KEPT))
        durations.append(seconds)

    def group(self, group: Any) -> tuple[str, list[int] | None] | None:
        """Name and ranks of a call's process group; None when this rank takes no part in the call
        (torch's NON_GROUP_MEMBER, a group without this rank, anything not a process group): torch
        returns at once or fails, and timing it would leave an op that no peer ever matches."""
        if group is None:  # the default group, where this torch keeps it: dist.group.WORLD is two property calls
            world = self.c10d_world
            group = world._default_pg if world is not None else self.dist.group.WORLD
        last = self.last_group  # most calls name the group of the call before: skip the weak lookup
        if last is not None and last[0]() is group:
            return last[1]
        if not isinstance(group, self.group_class):
            return None
        known = self.groups.get(group, _UNKNOWN)
        if known is not _UNKNOWN:
            self.last_group = (weakref.ref(group), known)
            return known
        try:
            ranks: list[int] | None = list(self.dist.get_process_group_ranks(group))
        except Exception:  # not initialized yet: time it, the ranks stay unknown
            ranks = None
        member = ranks is None or self.dist.get_rank() in ranks
        known = (str(getattr(group, "group_name", None) or "0"), ranks) if member else None
        self.groups[group] = known
        self.last_group = (weakref.ref(group), known)
        return known

    # -- regions -----------------------------------------------------------------------------
    def enter_region(self, name: str) -> None:
        with self.lock:
            self.regions.append((name, time.time()))

    def leave_region(self, name: str) -> None:
        with self.lock:
            for i in range(len(self.regions) - 1, -1, -1):
                if self.regions[i][0] == name:
                    del self.regions[i]
                    break
            if name == "step":
                self.step += 1

    # -- watchdog thread ---------------------------------------------------------------------
    def _watchdog(self) -> None:
        next_publish = 0.0
        # wake every POLL_SECONDS only while async handles or CUDA events wait to be polled: a thread
        # waking 20 times a second for nothing takes the GIL and a core from the training loop
        # (an async handle or event issued during a longer sleep wakes it, so its time stays exact)
        while not self.stop.is_set():
            self.dozing = not (self.works or self.events)
            self.wake.wait(min(self.interval, max(POLL_SECONDS, next_publish - time.monotonic()))
                           if self.dozing else POLL_SECONDS)
            self.dozing = False
            self.wake.clear()
            if self.stop.is_set():
                break
            try:
                self.poll_completions()
            except Exception as e:  # a broken query must not stop the heartbeat: that would look like a hang
                self._watchdog_error(f"polling completions failed: {type(e).__name__}: {e}")
            now = time.monotonic()
            if now >= next_publish:
                next_publish = now + self.interval
                try:
                    if now >= self.next_fr_poll and self.path is not None:
                        self.next_fr_poll = now + FR_POLL_INTERVALS * self.interval
                        self.poll_flight_recorder()
                    self.publish()
                    self.answer_flight_recorder_request()
                except Exception as e:  # a full disk must not kill the thread: keep trying
                    self._watchdog_error(f"publishing the state record failed: {e}")

    def _watchdog_error(self, message: str) -> None:
        """Say it in the record every time, in the rank's log only the first time."""
        if not self.logged_error:
            self.logged_error = True
            logging.getLogger(__name__).warning("nodehealth hang timer: %s", message)
        self.last_error = message

    def poll_completions(self) -> None:
        with self.lock:
            # the oldest few: the detector judges a group by its oldest pending op, and wait() completes the rest
            works, events = list(itertools.islice(self.works.values(), POLL_BATCH)), list(self.events)
        for work, op, stream in works:
            try:
                done = work.is_completed()
            except Exception as e:
                self._forget_work(work)
                self.complete(op, stream, error=f"{type(e).__name__}: {e}")
                continue
            if done:
                self._forget_work(work)
                self.complete(op, stream)
        done_through = self._done_through(events)
        for i, (event, op, stream, key) in enumerate(events):  # in order: stop at the first still running
            error = None
            if key in done_through:  # its stream bisected: done up to there, still running past it
                if i > done_through[key]:
                    break
            else:
                try:
                    if not self.cuda.done(event, op["_device"]):
                        break
                except Exception as e:  # it will never answer: let the events behind it complete
                    error = f"querying its CUDA event failed: {type(e).__name__}: {e}"
            with self.lock:
                self.events.popleft()
            self.complete(op, stream, error=error)

    def _done_through(self, events: list[tuple[Any, dict[str, Any], _Stream, Any]]) -> dict[Any, int]:
        """For each known CUDA stream, the position in `events` of its newest event that is done (-1: none),
        found by bisection: events on one stream complete in the order recorded, so every older one on it
        is done too and every newer one still running, with no query of their own. Each query drops the
        GIL and takes it back: two thread switches that the training thread waits through, once per op
        when every event was asked. A stream whose query fails is left out: its events are then asked one
        by one, where the error is told with its op."""
        on: dict[Any, list[int]] = {}
        for i, (_, _, _, key) in enumerate(events):
            if key is not None:
                on.setdefault(key, []).append(i)
        done_through: dict[Any, int] = {}
        for key, positions in on.items():
            lo, hi = 0, len(positions)  # positions[:lo] are done, positions[hi:] are not
            try:
                while lo < hi:
                    mid = (lo + hi) // 2
                    event, op = events[positions[mid]][:2]
                    if self.cuda.done(event, op["_device"]):
                        lo = mid + 1
                    else:
                        hi = mid
            except Exception:  # noqa: BLE001 (asked again one by one, where the error is told)
                continue
            done_through[key] = positions[lo - 1] if lo else -1
        return done_through

    def _forget_work(self, work: Any) -> None:
        with self.lock:
            self.works.pop(id(work), None)

    def snapshot(self, exited: bool = False) -> dict[str, Any] | None:
        dist = self.dist
        if dist is None:
            return None
        if dist.is_initialized():
            if self.identity is None or self.finished:  # a new default group (re-initialized)
                self.identity = {"job": _job_id(), "rank": dist.get_rank(), "world_size": dist.get_world_size(),
                                 "pod": _pod()}
                self.finished = False
        elif self.identity is None:
            return None
        else:
            self.finished = True  # destroyed, whoever did it: what follows is not training
        now = time.time()
        with self.lock:
            groups = {key: stream.snapshot() for key, stream in self.streams.items()}
            groups.update(self.fr_groups)
            regions = [{"name": n, "seconds": now - t} for n, t in self.regions]
            step = self.step
        return {"version": record.VERSION, **self.identity, "local_rank": _int_env("LOCAL_RANK"),
                "host": self.host, "pid": self.pid, "start_time": self.start_time,
                "pid_namespace": _pid_namespace(), "heartbeat": now, "interval": self.interval,
                "step": step, "regions": regions, "groups": groups, "exited": exited, "finished": self.finished,
                "exit_reason": self.exit_reason if exited else None, "exit_code": self.exit_code if exited else None,
                "gpu_poll": self.cuda.method, "last_error": self.last_error,
                "flight_recorder": self.flight_recorder_info(self.identity["rank"])}

    def publish(self, exited: bool = False) -> None:
        """Write the state record. The watchdog, the training thread (a group's end) and the exit all
        publish: one at a time, so that a record taken earlier is never written over a later one. A
        publish that cannot have its turn within PUBLISH_WAIT_SECONDS (a disk stalled, or a child forked
        while another thread held the turn) is skipped: the next one says as much."""
        if not self.publish_lock.acquire(timeout=PUBLISH_WAIT_SECONDS):
            return
        try:
            snap = self.snapshot(exited)
            if snap is None:
                return
            if self.path is None:
                self.path = record.record_path(self.directory, snap["job"], snap["rank"])
            record.write_json(self.path, snap)
        finally:
            self.publish_lock.release()

    # -- Flight Recorder ---------------------------------------------------------------------
    def flight_recorder_info(self, rank: int) -> dict[str, Any] | None:
        """That Flight Recorder is on, and the name of PyTorch's NCCL debug pipe when it lies in our
        directory (the detector uses no other); None when FR is off. The request and dump files
        are named after the record (record.flight_recorder_paths), never taken from it."""
        size = _int_env("TORCH_FR_BUFFER_SIZE") or _int_env("TORCH_NCCL_TRACE_BUFFER_SIZE")
        if not size or self.path is None:
            return None
        pipe = os.environ.get("TORCH_NCCL_DEBUG_INFO_PIPE_FILE")
        prefix = (os.environ.get("TORCH_FR_DUMP_TEMP_FILE") or os.environ.get("TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
                  or "/tmp/nccl_trace_rank_")
        pipe_path = f"{pipe}{rank}.pipe" if pipe else None
        ours = pipe_path and os.path.dirname(os.path.realpath(pipe_path)) == os.path.realpath(self.directory)
        return {"buffer_size": size, "nccl_pipe": os.path.basename(pipe_path) if ours else None,
                "nccl_dump": f"{prefix}{rank}"}

    def poll_flight_recorder(self) -> None:
        """Collectives issued from C++ (FSDP, DTensor, a built-in DDP hook) pass our wrappers but not
        PyTorch's Flight Recorder: when it has counted more ops in a group than we have, publish its
        view of that group as group "fr/NAME" (its sequence numbers and active ops), judged like ours."""
        if self.flight_recorder_info(self.identity["rank"] if self.identity else 0) is None:
            return
        import json

        from torch._C._distributed_c10d import _dump_fr_trace_json

        dump = json.loads(_dump_fr_trace_json(True, True))
        active: dict[str, list[dict[str, Any]]] = {}
        for e in dump.get("entries") or []:
            pg = e.get("process_group") or ["?"]
            if e.get("is_p2p") or e.get("state") == "completed" or not isinstance(e.get("collective_seq_id"), int):
                continue
            active.setdefault(str(pg[0]), []).append(
                {"seq": e["collective_seq_id"], "op": str(e.get("profiling_name", "?")).split(":")[-1],
                 "sizes": (e.get("input_sizes") or [])[:4], "dtype": (e.get("input_dtypes") or [None])[0],
                 "enqueued_at": (e.get("time_created_ns") or 0) / 1e9, "state": e.get("state")})
        groups = {}
        with self.lock:
            for name, st in (dump.get("pg_status") or {}).items():
                enqueued, completed = int(st["last_enqueued_collective"]), int(st["last_completed_collective"])
                ours = self.streams.get(str(name))
                if enqueued <= (ours.enqueued if ours else 0):
                    continue  # we saw every op of this group ourselves
                # gloo leaves finished entries "scheduled": the group's completed count is what says done
                pending = sorted((op for op in active.get(str(name), []) if op["seq"] > completed),
                                 key=lambda op: op["seq"])[:PENDING_PUBLISHED]
                groups[f"fr/{name}"] = {"ranks": ours.ranks if ours else None, "enqueued": enqueued,
                                        "completed": max(0, completed), "pending": pending,
                                        "pending_count": len(pending), "recent": [], "p99": {}}
            self.fr_groups = groups

    def answer_flight_recorder_request(self) -> None:
        """The detector touched our request file: dump FR as JSON next to the record.

        This works for every backend FR records (gloo included), unlike the NCCL-only pipe.
        """
        if self.path is None:
            return
        request, dump = record.flight_recorder_paths(self.path)
        if not os.path.exists(request):
            return
        try:
            from torch._C._distributed_c10d import _dump_fr_trace_json

            data = _dump_fr_trace_json()
        except Exception as e:
            data = record_error_json(f"Flight Recorder dump failed in the rank: {type(e).__name__}: {e}")
        write_atomic(dump, data if isinstance(data, bytes) else data.encode())
        with contextlib.suppress(OSError):
            os.unlink(request)


def record_error_json(message: str) -> bytes:
    import json

    return json.dumps({"error": message}).encode()


class _TimedWork:
    """A Work handle whose wait() also marks our op complete; everything else is the real one."""

    __slots__ = ("_work", "_op", "_stream", "_timer")

    def __init__(self, work: Any, op: dict[str, Any], stream: _Stream, timer: Timer):
        self._work, self._op, self._stream, self._timer = work, op, stream, timer

    def wait(self, *args: Any, **kwargs: Any) -> Any:
        result = self._work.wait(*args, **kwargs)
        if not self._op.get("_cuda"):
            self._timer._forget_work(self._work)
            self._timer.complete(self._op, self._stream)
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self._work, name)


def _wrap(timer: Timer, name: str, fn: Any, p2p: bool) -> Any:
    at = _group_position(fn)
    clock = time.time
    cuda_state = timer.cuda_state

    def timed(*args: Any, **kwargs: Any) -> Any:
        """The hot path, in one frame: every call and attribute read here costs each collective."""
        group = args[at] if at is not None and len(args) > at else None
        if kwargs:
            group = kwargs.get("group", group)
        if group is None:  # the default group, where this torch keeps it: dist.group.WORLD is two property calls
            world = timer.c10d_world
            group = world._default_pg if world is not None else timer.dist.group.WORLD
        last = timer.last_group  # most calls name the group of the call before: skip the weak lookup
        known = last[1] if last is not None and last[0]() is group else timer.group(group)
        if known is None:
            return fn(*args, **kwargs)
        key, ranks = known
        first = args[0] if args else None
        if not kwargs and len(args) == 1 and type(first) in _TENSOR_TYPES:  # all_reduce(tensor): most calls
            sizes = [first.shape]
        else:
            tensors = _tensors(args, kwargs)
            first = tensors[0] if tensors else None
            sizes = [t.shape for t in tensors[:4]]
        dtype = None
        if first is not None:
            dtype = _DTYPES.get(first.dtype) or _dtype_name(first.dtype)
        # whole before the watchdog can see it in `pending`; shapes kept as torch.Size (a tuple):
        # copying them costs on every call, and the record's JSON makes them lists anyway
        op: dict[str, Any] = {"op": name, "enqueued_at": clock(), "sizes": sizes, "dtype": dtype}
        if first is not None and cuda_state._initialized and first.is_cuda:  # the device of the call, read here:
            op["_cuda"], op["_device"] = True, first.device.index  # the watchdog thread has its own device
        if p2p:
            key += "/p2p"
            op["peer"] = _peer(name, args, kwargs)
        stream = timer.streams.get(key) or timer.new_stream(key, ranks)
        seq = op["seq"] = next(stream.counter)
        stream.enqueued = seq
        stream.pending[seq] = op
        try:
            result = fn(*args, **kwargs)
        except BaseException as e:
            timer.complete(op, stream, error=f"{type(e).__name__}: {e}"[:300])
            raise
        if result is not None or "_cuda" in op:
            return timer.issued(op, stream, result)
        # the common case, a blocking call on CPU, done: complete() inlined, as no other thread knows the op
        seconds = op["seconds"] = clock() - op["enqueued_at"]
        del stream.pending[seq]
        stream.recent.append(op)
        stream.by_seq[seq % BY_SEQ_KEPT] = seconds
        durations = stream.durations.get(name)
        if durations is None:
            durations = stream.durations.setdefault(name, collections.deque(maxlen=DURATIONS_KEPT))
        durations.append(seconds)
        return None

    timed.__name__ = timed.__qualname__ = name
    timed.__doc__ = fn.__doc__
    timed.__wrapped__ = fn
    return timed


def _group_position(fn: Any) -> int | None:
    """Where `group` sits among the positional arguments of a torch.distributed function."""
    import inspect

    try:
        names = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return None
    return names.index("group") if "group" in names else None


_UNKNOWN = object()
_ASSUME_CUDA = type("AssumeCuda", (), {"_initialized": True})()  # no torch.cuda state to read: ask every tensor
_DTYPES: dict[Any, str] = {}
_TENSOR_TYPES: set[type] = set()


def _dtype_name(dtype: Any) -> str:
    """The name of a dtype ("float32"), remembered: str() of a dtype is slow on the hot path."""
    name = _DTYPES.get(dtype)
    if name is None:
        name = _DTYPES[dtype] = str(dtype)[6:]
    return name


def _tensors(args: tuple, kwargs: dict) -> list[Any]:
    """The tensors of a call (first two positional arguments, lists flattened), cheaply: a type once
    seen to have a shape is known by its type (reading `shape` builds an object every time)."""
    items = args[:2]
    if kwargs:
        items += tuple(kwargs[k] for k in ("tensor", "output", "input") if k in kwargs)
    out = []
    for a in items:
        if type(a) in _TENSOR_TYPES:
            out.append(a)
        elif hasattr(a, "shape"):
            _TENSOR_TYPES.add(type(a))
            out.append(a)
        elif isinstance(a, (list, tuple)) and a:
            if hasattr(a[0], "shape"):
                out.extend(a)
            elif hasattr(a[0], "tensor"):  # batch of P2POp
                out.extend(p.tensor for p in a)
    return out


def _peer(name: str, args: tuple, kwargs: dict) -> int | None:
    key = "dst" if name in ("send", "isend") else "src"
    peer = kwargs.get(key, args[1] if len(args) > 1 else None)
    return peer if isinstance(peer, int) else None


def _job_id() -> str:
    """The same for every rank of a job, different for two jobs on one node at one time: the id the
    user or scheduler gave, else the Kubernetes pod's owner, else torchrun's run id (not its default
    "none"), else Slurm's job id, else the rendezvous endpoint (a port two live jobs cannot share), with
    the launcher's pid and start time when all ranks are on this node (so a later job on the same port
    is another job) or the elastic restart."""
    job = os.environ.get(ENV_JOB)
    if job:
        return job
    owner = os.environ.get(ENV_POD_OWNER)
    if owner:  # an unset label reaches the pod as an empty string
        parts = [os.environ.get(ENV_POD_NAMESPACE), owner, (os.environ.get(ENV_POD_OWNER_UID) or "")[:8]]
        return "k8s/" + "/".join(p for p in parts if p)
    for key in ("TORCHELASTIC_RUN_ID", "SLURM_JOB_ID"):
        value = os.environ.get(key)
        if value and value != "none":
            return value
    endpoint = f"{os.environ.get('MASTER_ADDR', 'local')}:{os.environ.get('MASTER_PORT', '0')}"
    world, local = _int_env("WORLD_SIZE"), _int_env("LOCAL_WORLD_SIZE")
    if world is not None and world == local:
        return f"{endpoint}-{os.getppid()}-{_process_start_ticks(os.getppid())}"
    return f"{endpoint}-{_int_env('TORCHELASTIC_RESTART_COUNT') or 0}"


def _pod() -> dict[str, str | None] | None:
    """This rank's pod from the downward API, when it says its name."""
    name = os.environ.get(ENV_POD_NAME)
    return {"namespace": os.environ.get(ENV_POD_NAMESPACE) or None, "name": name} if name else None


def _int_env(key: str) -> int | None:
    try:
        return int(os.environ[key])
    except (KeyError, ValueError):
        return None


def _process_start_ticks(pid: int | None = None) -> int | None:
    """Start time in clock ticks since boot: the same in every PID namespace, so the daemon can
    find this process from the host even when our pid differs there."""
    try:
        with open(f"/proc/{pid or 'self'}/stat", encoding="ascii", errors="replace") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def _pid_namespace() -> str | None:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


class _CudaQuery:
    """Completion of a CUDA event without the GIL: the driver's cuEventQuery through ctypes.

    ctypes drops the GIL for the call, so a query that waits behind the CUDA context lock stalls
    only the watchdog thread. Falls back to Event.query() (holds the GIL) when the driver library
    cannot be loaded, and says so in the record.
    """

    NOT_READY = 600

    def __init__(self) -> None:
        self.fn: Any = None
        self.method = "none"
        self.bound_device: int | None = None

    def done(self, event: Any, device: int) -> bool:
        if self.fn is None and self.method == "none":
            self._load()
        if self.fn is None:
            return bool(event.query())
        if self.bound_device != device:  # the driver wants the event's context current on this thread
            import torch

            torch.cuda.set_device(device)
            self.bound_device = device
        rc = self.fn(ctypes.c_void_p(event.cuda_event))
        if rc == self.NOT_READY:
            return False
        return True  # success, or an error: the event will never complete, so stop waiting on it

    def _load(self) -> None:
        try:
            lib = ctypes.CDLL("libcuda.so.1")
            self.fn = lib.cuEventQuery
            self.fn.argtypes = [ctypes.c_void_p]
            self.fn.restype = ctypes.c_int
            self.method = "cuEventQuery (GIL released)"
        except (OSError, AttributeError):
            self.method = "torch.cuda.Event.query (holds the GIL)"
