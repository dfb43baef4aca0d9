"""Shared test helpers: fixture machines, a real daemon process, free ports."""
from __future__ import annotations

import contextlib
import functools
import importlib
import json
import logging
import os
import random
import resource
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
MACHINES_DIR = os.path.join(HERE, "fixtures", "machines")
MACHINES = sorted(d for d in os.listdir(MACHINES_DIR) if os.path.isdir(os.path.join(MACHINES_DIR, d)))
IN_CI = os.environ.get("CI") == "true"
# How long a stopped daemon may take to exit in a test: its own joins take at most 1.5 s; the rest is
# room for the interpreter's teardown on a busy 2-core machine, still well inside the pod's 10 s grace.
STOP_SECONDS = 4.0


@dataclass(frozen=True)
class KmsgFacts:
    """Stand-in for the kernel-log collector's facts in table-driven check tests."""

    events: tuple
    boot_id: str | None = "live-boot"  # None: a saved log replayed with --kernel-log


def load_script(path: str, name: str):
    """A script of the repository (dashboards/generate.py, docs/generate.py), imported as module `name`."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, os.path.join(os.path.dirname(HERE), path))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def machine(name: str) -> str:
    return os.path.join(MACHINES_DIR, name)


def unavailable(why: str):
    """A real part the test needs is not here: under CI that fails, elsewhere the test skips."""
    if IN_CI:
        pytest.fail(f"needed under CI: {why}")
    pytest.skip(why)


@contextlib.contextmanager
def live_root(root, sysfs: bool = False):
    """`root` as the DaemonSet mounts the host at /host: a real procfs at proc/ (so HostPaths takes it for
    a live host), and with `sysfs` the real sysfs at sys/; what else is there stays. Needs CAP_SYS_ADMIN."""
    mounted = []
    try:
        for name, fstype in (("proc", "proc"), ("sys", "sysfs"))[:2 if sysfs else 1]:
            path = os.path.join(str(root), name)
            os.makedirs(path, exist_ok=True)
            if subprocess.run(["mount", "-t", fstype, fstype, path], capture_output=True).returncode:
                pytest.skip(f"cannot mount a {fstype} here (needs CAP_SYS_ADMIN)")
            mounted.append(path)
        yield str(root)
    finally:
        for path in reversed(mounted):
            subprocess.run(["umount", path], capture_output=True)


def require_tool(name: str) -> str:
    """A real part the test needs; under CI a missing one fails instead of skipping."""
    path = shutil.which(name)
    if path:
        return path
    if IN_CI:
        pytest.fail(f"{name} is not installed; .ci/run must install it")
    pytest.skip(f"{name} is not installed")


def require_netns() -> None:
    """Network namespaces with faults: root, ip, nft and tc."""
    if os.geteuid() != 0:
        unavailable("network namespaces need root")
    for tool in ("ip", "nft", "tc"):
        if shutil.which(tool) is None:
            unavailable(f"{tool} is not installed (.ci/run installs iproute2 and nftables)")


def wait_for(predicate, timeout: float = 5.0, step: float = 0.01):
    """The predicate's first true value within `timeout` seconds, else None: tests wait for what they
    need, never a fixed time."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(step)
    return None


_HANDED_OUT: set[int] = set()
_PORTS = random.Random()


@functools.cache
def ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (net.ipv4.ip_local_port_range)."""
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        return int(f.read().split()[0])


def free_port() -> int:
    """A port nothing is bound to now, never one handed out before in this run, and below the kernel's
    ephemeral range: the test hands it to another process to bind later, and meanwhile a port from that
    range can become any connection's local port or another bind(0)'s (CI once failed on a torchrun's
    EADDRINUSE so). Checked by binding the wildcard address, which clashes with a bind on any address."""
    low = ephemeral_low()
    while True:
        port = _PORTS.randrange(10000, low) if low > 10000 + 1000 else 0
        with socket.socket() as s:
            try:
                s.bind(("", port))
            except OSError:
                continue
            port = s.getsockname()[1]
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port


def started_agent(listen: str, node: str):
    """A pingmesh Ping service answering as `node` on `listen` (ADDR:PORT), started; stop() it when done."""
    from nodehealth.pingmesh import agent

    a = agent.Agent(listen, node)
    a.start()
    return a


@pytest.fixture(scope="session")
def protoc_probe(tmp_path_factory):
    """protoc's code for probe.proto, generated now (modules probe_pb2 and probe_pb2_grpc): what an agent
    of a version before ping_wire ran, and the reference ping_wire is held to."""
    pytest.importorskip("grpc_tools")
    out = tmp_path_factory.mktemp("protoc")
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", "-Inodehealth/pingmesh", f"--python_out={out}",
                    f"--grpc_python_out={out}", "nodehealth/pingmesh/probe.proto"], cwd=os.path.dirname(HERE),
                   check=True)
    sys.path.insert(0, str(out))
    try:
        yield importlib.import_module("probe_pb2"), importlib.import_module("probe_pb2_grpc")
    finally:
        sys.path.remove(str(out))


def http_get(url: str, timeout: float = 5.0):
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


class DaemonProcess:
    """`nodehealth daemon` as a real subprocess on loopback."""

    def __init__(self, root: str, state_dir: str, *extra: str, interval: float = 1.0, env: dict | None = None,
                 max_files: int | None = None):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "nodehealth.cli", "daemon", "--root", root, "--state-dir", state_dir,
               "--listen", f"127.0.0.1:{self.port}", "--interval", str(interval), *extra]
        env = dict(os.environ if env is None else env, PYTHONFAULTHANDLER="1")  # stacks on SIGABRT
        limit = (None if max_files is None
                 else lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (max_files, max_files)))
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                                     preexec_fn=limit)

    def wait_ready(self, timeout: float = 15.0) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"daemon exited {self.proc.returncode}: {self.proc.stdout.read()}")
            try:
                code, body = http_get(self.url + "/v1/report", timeout=1.0)
                if code == 200:
                    return json.loads(body)
            except OSError:
                pass
            time.sleep(0.05)
        raise AssertionError("daemon did not become ready")

    def get(self, path: str):
        return http_get(self.url + path)

    def stop(self, timeout: float = 10.0) -> float:
        """SIGTERM; returns how long it took to exit."""
        if self.proc.poll() is not None:
            return 0.0
        t0 = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.send_signal(signal.SIGABRT)  # faulthandler prints every thread's stack
            try:
                self.proc.wait(5.0)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            raise AssertionError(f"daemon did not exit {timeout:g}s after SIGTERM; its output and "
                                 f"stacks:\n{self.output()[-20000:]}") from None
        return time.monotonic() - t0

    def output(self) -> str:
        return self.proc.stdout.read() if self.proc.stdout else ""


@pytest.fixture
def daemon_factory():
    started = []

    def start(root: str, state_dir: str, *extra: str, interval: float = 1.0, env: dict | None = None,
              max_files: int | None = None) -> DaemonProcess:
        d = DaemonProcess(root, state_dir, *extra, interval=interval, env=env, max_files=max_files)
        started.append(d)
        return d
    yield start
    for d in started:
        if d.proc.poll() is None:
            d.proc.kill()
            d.proc.wait()


@pytest.fixture(scope="session", autouse=True)
def _vm_tier_booted_first(request, tmp_path_factory):
    """A session with VM tests boots their guest as it starts: it runs beside the other tests instead of
    after them (tests/vm/tier.py), and tests/test_vm_tier.py reads what it left."""
    if not any(item.get_closest_marker("vm") for item in request.session.items):
        yield
        return
    from vm import tier

    boot = tier.Boot(str(tmp_path_factory.mktemp("vm-out")), str(tmp_path_factory.mktemp("vm-work")))
    request.config.stash[tier.BOOT] = boot
    yield
    boot.stop()


@pytest.fixture(scope="session", autouse=True)
def _image_built_first(request, tmp_path_factory):
    """A session with image tests starts building the image's root filesystem as it starts, beside the
    other tests (tests/image_rootfs.py); tests/test_image.py waits for it."""
    import image_rootfs

    if not any(item.get_closest_marker("image") for item in request.session.items) or image_rootfs.missing():
        yield
        return
    build = image_rootfs.Build(str(tmp_path_factory.mktemp("image") / "rootfs"))
    request.config.stash[image_rootfs.BUILD] = build
    yield
    build.stop()


@pytest.fixture(autouse=True)
def _root_logging_restored():
    """A test that runs a command in-process (logs.setup) leaves a root handler on a stream pytest then
    closes; the next test's log lines would fail on it. Each test gets the root logger as it found it."""
    root = logging.getLogger()
    before, level = set(root.handlers), root.level
    yield
    for h in root.handlers[:]:
        if type(h) is logging.StreamHandler and h not in before:  # logs.setup's, not pytest's own
            root.removeHandler(h)
    root.setLevel(level)
