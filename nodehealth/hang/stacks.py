"""Stacks of live ranks through py-spy, careful with the targets.

Before touching a process we read its state: a process with any thread in uninterruptible sleep
(D) can hang a ptrace attach, and one stopped by someone else (T) must stay as it was, so both get
py-spy's `--nonblocking` mode (memory reads only, no attach) and no native pass. After a blocking
dump we check the target is not left stopped and send SIGCONT if it is; after py-spy had to be
killed at its timeout we send SIGCONT at once and watch the target a little longer. A target in
another PID namespace is dumped from here by its host pid for Python frames (py-spy reads its
files through /proc/PID/root); native frames need py-spy run inside the target's namespaces
(`nsenter -t PID -p -m`), which works only when the same py-spy path exists in the target's mount
namespace, otherwise the bundle says why they are missing.
"""
from __future__ import annotations

import bisect
import contextlib
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from nodehealth.host import HostPaths, list_dir, read_text

log = logging.getLogger(__name__)
OUTPUT_LIMIT = 16 << 20
MAPS_LIMIT = 16 << 20  # /proc/PID/maps of a CUDA training process: thousands of mappings
ADDRESS = re.compile(r"0x[0-9a-fA-F]+")  # a native frame py-spy could not name
STOP_POLL_SECONDS = 0.1  # how soon a shutdown reaches a running py-spy
RECHECKS, RECHECK_SECONDS = 5, 0.1  # after a killed py-spy: watch the target ~0.5 s for a late stop


@dataclass(frozen=True)
class ProcessState:
    pid: int
    state: str  # the letter of /proc/PID/status State: R S D T t Z ...
    wchan: str | None
    nspid: int  # the pid inside its own PID namespace (== pid when it is ours)
    other_namespace: bool
    blocked_thread: int | None = None  # a thread in uninterruptible sleep (D), the main one or another


def process_state(host: HostPaths, pid: int) -> ProcessState | None:
    """State of a process; None when it is gone."""
    try:
        status = read_text(host.proc(str(pid), "status"), 65536)
    except OSError:
        return None
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    state = fields.get("State", "?").strip()[:1] or "?"
    nspids = fields.get("NSpid", str(pid)).split()
    try:
        wchan = read_text(host.proc(str(pid), "wchan"), 256).strip() or None
    except OSError:
        wchan = None
    try:
        other = os.readlink(host.proc(str(pid), "ns", "pid")) != os.readlink(host.proc("self", "ns", "pid"))
    except OSError:
        other = False
    nspid = int(nspids[-1]) if nspids and nspids[-1].isdigit() else pid
    return ProcessState(pid, state, None if wchan == "0" else wchan, nspid, other, _thread_in_d(host, pid))


def _thread_in_d(host: HostPaths, pid: int) -> int | None:
    """The first thread of the process in D state: ptrace must stop every thread, and one in
    uninterruptible sleep (a GPU driver call, a dead NFS server) can hang the attach."""
    for tid in list_dir(host.proc(str(pid), "task")):
        try:
            text = read_text(host.proc(str(pid), "task", tid, "stat"), 4096)
        except OSError:
            continue  # the thread ended
        fields = text.rsplit(")", 1)[-1].split()
        if fields and fields[0] == "D" and tid.isdigit():
            return int(tid)
    return None


class StackCollector:
    """py-spy dumps of many processes, in parallel with a bound, each with a hard timeout."""

    def __init__(self, py_spy: str = "py-spy", timeout: float = 10.0, native_timeout: float = 30.0,
                 parallel: int = 8, host: HostPaths | None = None):
        self.py_spy = py_spy
        self.timeout = timeout
        self.native_timeout = native_timeout
        self.parallel = max(1, parallel)
        self.host = host or HostPaths()
        self.stop = threading.Event()  # set at shutdown: a dump in flight is killed, its target resumed

    def binary(self) -> str | None:
        """py-spy on PATH, else beside this interpreter or this command: `nodehealth` run by its full
        path from a virtual environment that is not activated finds the py-spy installed with it."""
        found = shutil.which(self.py_spy)
        if found or os.sep in self.py_spy:
            return found
        for where in (os.path.dirname(sys.executable), os.path.dirname(os.path.abspath(sys.argv[0] or "."))):
            found = shutil.which(self.py_spy, path=where)
            if found:
                return found
        return None

    def collect(self, pids: list[int], native: bool = False) -> dict[int, dict[str, Any]]:
        if not pids:
            return {}
        with ThreadPoolExecutor(min(self.parallel, len(pids)), thread_name_prefix="py-spy") as pool:
            results = pool.map(lambda pid: self.dump(pid, native), pids)
            return dict(zip(pids, results))

    def dump(self, pid: int, native: bool = False) -> dict[str, Any]:
        started = time.monotonic()
        out = self._dump(pid, native)
        out["seconds"] = round(time.monotonic() - started, 4)
        if out.get("error"):
            log.warning("stacks of pid %d%s: %s", pid, " (native)" if native else "", out["error"])
        return out

    def _dump(self, pid: int, native: bool) -> dict[str, Any]:
        before = process_state(self.host, pid)
        if before is None:
            return {"pid": pid, "error": "process exited before its stack could be collected"}
        out: dict[str, Any] = {"pid": pid, "state": before.state, "wchan": before.wchan}
        if before.state in ("Z", "X"):
            return {**out, "error": "process exited (zombie) before its stack could be collected"}
        binary = self.binary()
        if binary is None:
            return {**out, "error": f"py-spy not found ({self.py_spy!r} is not on PATH or not executable); "
                                    "install nodehealth[hang] or set hang.py_spy"}
        hands_off = before.state in ("D", "T", "t") or before.blocked_thread is not None
        if before.blocked_thread is not None and before.state != "D":
            out["blocked_thread"] = before.blocked_thread
        if native and hands_off:
            what = (f"process is in state {before.state} (wchan {before.wchan or '?'})"
                    if before.state in ("D", "T", "t")
                    else f"its thread {before.blocked_thread} is in state D")
            return {**out, "error": f"native stack skipped: {what}, attaching with ptrace could hang or resume it"}
        cmd = [binary, "dump", "--json", "--pid", str(pid)]
        if hands_off:
            cmd.append("--nonblocking")
            out["mode"] = "nonblocking"
        else:
            out["mode"] = "blocking"
        if native:
            cmd.append("--native")
            if before.other_namespace:
                inside = self.host.proc(str(pid), "root", binary.lstrip("/"))
                if not (os.path.exists(inside) and shutil.which("nsenter")):
                    return {**out, "error": "native stack skipped: the process is in another PID namespace and "
                                            f"{binary} does not exist in its mount namespace (or nsenter is missing)"}
                cmd = ["nsenter", "-t", str(pid), "-p", "-m", binary, "dump", "--json", "--native",
                       "--pid", str(before.nspid)]
                out["namespace"] = f"entered the target's PID and mount namespaces (pid {before.nspid} there)"
        elif before.other_namespace:
            out["namespace"] = f"other PID namespace (pid {before.nspid} there); dumped by host pid"
        if self.stop.is_set():
            return {**out, "error": "not collected: the detector is shutting down"}
        rc, stdout, stderr, timed_out = _run(cmd, self.native_timeout if native else self.timeout, self.stop)
        if before.state not in ("T", "t"):  # stopped before we came: leave it as its owner wants it
            self._never_leave_stopped(pid, out, timed_out)
        if timed_out and self.stop.is_set():
            return {**out, "error": "py-spy was killed: the detector is shutting down"}
        if timed_out:
            limit = self.native_timeout if native else self.timeout
            return {**out, "error": f"py-spy did not answer within {limit:g} s and was killed"}
        if rc != 0:
            after = process_state(self.host, pid)
            if after is None or after.state in ("Z", "X"):
                return {**out, "error": "process exited during stack collection"}
            return {**out, "error": f"py-spy failed (exit {rc}): {_error_text(stderr or stdout)}"}
        try:
            out["threads"] = [_thread(t) for t in json.loads(stdout)]
        except (ValueError, TypeError, AttributeError, KeyError) as e:
            return {**out, "error": f"py-spy printed something that is not its JSON stack dump: {e}"}
        if native:
            self._name_addresses(pid, out["threads"])
        return out

    def _name_addresses(self, pid: int, threads: list[dict[str, Any]]) -> None:
        """Native frames py-spy could not name (a stripped libc's) are bare addresses, which differ in
        every process (ASLR): name them by file and offset in it ("libc.so.6+0x2924a"), the same in
        every process of that build, so the ranks' stacks merge. Left bare if the process is gone."""
        try:
            maps = _file_mappings(read_text(self.host.proc(str(pid), "maps"), MAPS_LIMIT))
        except OSError:
            return
        starts = [m[0] for m in maps]
        for thread in threads:
            for frame in thread["frames"]:
                if not ADDRESS.fullmatch(frame["name"]):
                    continue
                address = int(frame["name"], 16)
                i = bisect.bisect_right(starts, address) - 1
                if i >= 0 and address < maps[i][1]:
                    start, _, offset, path = maps[i]
                    frame["name"] = f"{os.path.basename(path)}+0x{address - start + offset:x}"

    def _never_leave_stopped(self, pid: int, out: dict[str, Any], killed: bool) -> None:
        """Resume a target that py-spy left stopped. A py-spy killed mid-attach may leave it stopped
        a moment later, after the kernel detaches it: then SIGCONT at once, whatever its state,
        and watch it for a while."""
        if killed:
            self._resume(pid, out, "py-spy was killed at its timeout; sent SIGCONT")
        for i in range(RECHECKS if killed else 1):
            if i:
                time.sleep(RECHECK_SECONDS)
            after = process_state(self.host, pid)
            if after is not None and after.state in ("T", "t"):
                self._resume(pid, out, "the target was left stopped after py-spy; sent SIGCONT")

    def _resume(self, pid: int, out: dict[str, Any], why: str) -> None:
        try:
            os.kill(pid, signal.SIGCONT)
            out["resumed"] = why
            log.warning("pid %d: %s", pid, why)
        except ProcessLookupError:
            pass  # it exited: nothing left to resume
        except OSError as e:
            out["resumed"] = f"{why.split(';')[0]}; SIGCONT failed: {e.strerror}"


def _run(cmd: list[str], timeout: float, stop: threading.Event) -> tuple[int, str, str, bool]:
    """Run py-spy; killed (True) at its timeout or as soon as `stop` is set."""
    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    except OSError as e:
        return 127, "", f"cannot run {cmd[0]}: {e.strerror or e}", False
    deadline = time.monotonic() + timeout
    while True:
        try:
            stdout, stderr = proc.communicate(timeout=min(STOP_POLL_SECONDS, max(0.0, deadline - time.monotonic())))
            break
        except subprocess.TimeoutExpired:
            if time.monotonic() < deadline and not stop.is_set():
                continue
            with contextlib.suppress(OSError):  # kill the group: nsenter runs py-spy as its child
                os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            return -9, "", "", True
    return (proc.returncode, stdout[:OUTPUT_LIMIT].decode("utf-8", "replace"),
            stderr[-4096:].decode("utf-8", "replace"), False)


def _error_text(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith(("Error", "Reason"))]
    return " / ".join(errors or lines[-2:]) or "no message"


def _file_mappings(maps: str) -> list[tuple[int, int, int, str]]:
    """(start, end, offset in the file, path) of the file-backed mappings in /proc/PID/maps, by start."""
    out = []
    for line in maps.splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and fields[5].startswith("/"):
            start, _, end = fields[0].partition("-")
            with contextlib.suppress(ValueError):
                out.append((int(start, 16), int(end, 16), int(fields[2], 16), fields[5].strip()))
    return sorted(out)


def _thread(raw: dict[str, Any]) -> dict[str, Any]:
    """A py-spy JSON thread, kept small: no locals, short file names, innermost frame first. py-spy
    names threads from the `threading` module; a process that never imported it has them unnamed,
    and its main thread (the one whose id is the pid) is named here, so it merges with the others'."""
    main = raw.get("os_thread_id") is not None and raw.get("os_thread_id") == raw.get("pid")
    return {"thread_id": raw.get("thread_id"), "os_thread_id": raw.get("os_thread_id"),
            "name": raw.get("thread_name") or ("MainThread" if main else ""), "active": bool(raw.get("active")),
            "owns_gil": bool(raw.get("owns_gil")),
            "frames": [{"name": str(f.get("name", "?")),
                        "file": str(f.get("short_filename") or f.get("filename") or f.get("module") or "?"),
                        "line": int(f.get("line") or 0)}
                       for f in raw.get("frames") or []]}


_THREAD = re.compile(r'^Thread (\S+) \(([^)]*)\)(?:: "(.*)")?\s*$')
_FRAME = re.compile(r"^\s+(\S.*?) \(([^()]*?)(?::(\d+))?\)\s*$")


def parse_text_dump(text: str) -> list[dict[str, Any]]:
    """Threads from `py-spy dump` text output (as pasted in bug reports), same shape as --json.

    Lines that are neither a thread header nor a frame (the Process/Python header, blank lines,
    errors) are skipped; frames before any thread header belong to no thread and are dropped.
    """
    threads: list[dict[str, Any]] = []
    for line in text.splitlines():
        m = _THREAD.match(line)
        if m:
            tid, status, name = m.groups()
            threads.append({"thread_id": tid, "os_thread_id": None, "name": name or "",
                            "active": status.startswith("active"), "owns_gil": "gil" in status, "frames": []})
            continue
        m = _FRAME.match(line)
        if m and threads:
            name, file, line_no = m.groups()
            threads[-1]["frames"].append({"name": name, "file": file, "line": int(line_no or 0)})
    return threads
