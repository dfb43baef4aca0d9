"""A real one-node Slurm cluster for the tests: munged, slurmctld and slurmd from Debian, on loopback.

Everything lives in one temporary directory (slurm.conf, the munge key made here, state, logs) and
every daemon runs in the foreground as a child of the test, so stopping it is a kill of our own child.
"""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Iterator

from conftest import free_port, require_tool, unavailable

NODE = "nh1"
TOOLS = ("munged", "slurmctld", "slurmd", "scontrol", "sbatch", "scancel")


class SlurmCluster:
    """`gres_gpus` > 0 gives the node that many GPUs as GRES (/dev/tty0... stand in for their device files:
    slurmd only checks they exist) and the cons_tres selector, which gives jobs GPU indices."""

    def __init__(self, top: str, prolog: str | None = None, gres_gpus: int = 0):
        self.top = top
        self.gres_gpus = gres_gpus
        self.procs: dict[str, subprocess.Popen] = {}
        self.conf = os.path.join(top, "slurm.conf")
        self.env = dict(os.environ, SLURM_CONF=self.conf)
        self.sock = os.path.join(top, "munge", "munge.socket")
        for d in ("munge", "state", "spool", "log"):
            os.makedirs(os.path.join(top, d), mode=0o700, exist_ok=True)
        os.chmod(top, 0o755)  # munged refuses a socket directory others may write
        with open(os.path.join(top, "munge", "munge.key"), "wb") as f:
            f.write(os.urandom(1024))
        os.chmod(os.path.join(top, "munge", "munge.key"), 0o600)
        host = socket.gethostname().split(".")[0]
        self._write_conf(host, free_port(), free_port(), prolog)

    def _write_conf(self, host: str, ctld_port: int, slurmd_port: int, prolog: str | None) -> None:
        t = self.top
        n = self.gres_gpus
        select = "select/cons_tres\nSelectTypeParameters=CR_Core\nGresTypes=gpu" if n else "select/linear"
        node = f"CPUs=2 RealMemory=64 Gres=gpu:{n}" if n else "CPUs=1 RealMemory=64"  # two jobs at once
        if n:
            with open(os.path.join(t, "gres.conf"), "w") as f:
                f.write(f"Name=gpu File=/dev/tty[0-{n - 1}]\n")
        with open(self.conf, "w") as f:
            f.write(f"""ClusterName=nodehealth-test
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={self.sock}
StateSaveLocation={t}/state
SlurmdSpoolDir={t}/spool
SlurmctldPidFile={t}/slurmctld.pid
SlurmdPidFile={t}/slurmd.pid
SlurmctldLogFile={t}/log/slurmctld.log
SlurmdLogFile={t}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/builtin
SelectType={select}
MpiDefault=none
ReturnToService=2
MessageTimeout=3
SlurmctldTimeout=5
SlurmdTimeout=30
NodeName={NODE} NodeAddr=127.0.0.1 NodeHostname={host} {node} State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES State=UP
""")
            if prolog:
                f.write(f"Prolog={prolog}\n")

    def _spawn(self, name: str, argv: list[str]) -> None:
        log = open(os.path.join(self.top, "log", f"{name}.out"), "ab")
        self.procs[name] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=self.env,
                                            stdin=subprocess.DEVNULL)
        log.close()

    def start(self, timeout: float = 60.0) -> None:
        t = self.top
        self._spawn("munged", [shutil.which("munged"), "--foreground", "--force", f"--socket={self.sock}",
                               f"--key-file={t}/munge/munge.key", f"--pid-file={t}/munge/munged.pid",
                               f"--log-file={t}/log/munged.log", f"--seed-file={t}/munge/munged.seed"])
        self.wait_for(lambda: os.path.exists(self.sock), "munged", 15)
        self.start_controller()
        self._spawn("slurmd", [shutil.which("slurmd"), "-D", "-N", NODE, "-f", self.conf])
        self.wait_state("IDLE", timeout)

    def wait_state(self, state: str, timeout: float = 60.0) -> None:
        self.wait_for(lambda: self.state() == state, f"node state {state}", timeout)

    def start_controller(self, timeout: float = 30.0) -> None:
        self._spawn("slurmctld", [shutil.which("slurmctld"), "-D", "-i", "-f", self.conf])
        self.wait_for(lambda: self.scontrol("ping").returncode == 0, "slurmctld", timeout)

    def stop_controller(self) -> None:
        self._stop("slurmctld")

    def scontrol(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([shutil.which("scontrol"), *args], env=self.env, capture_output=True, text=True,
                              timeout=30)

    def node(self) -> dict[str, str]:
        """The node's State and Reason as scontrol shows them (Reason without its [user@time] tail)."""
        out = self.scontrol("show", "node", NODE).stdout
        fields: dict[str, str] = {}
        for line in out.splitlines():
            line = line.strip()
            if line.startswith("Reason="):
                fields["Reason"] = line[len("Reason="):].rsplit(" [", 1)[0]
            elif line.startswith("State="):
                fields["State"] = line.split()[0][len("State="):]
        return fields

    def state(self) -> str:
        return self.node().get("State", "")

    def wait_for(self, ready, what: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name, p in self.procs.items():
                if p.poll() is not None:
                    raise RuntimeError(f"{name} exited {p.returncode}: {self.log_tail(name)}")
            if ready():
                return
            time.sleep(0.3)
        raise RuntimeError(f"timed out waiting for {what}: {self.log_tail('slurmctld')} {self.log_tail('slurmd')}")

    def log_tail(self, name: str) -> str:
        text = ""
        for suffix in (".out", ".log"):
            try:
                with open(os.path.join(self.top, "log", name + suffix), errors="replace") as f:
                    text += f.read()[-1500:]
            except OSError:
                pass
        return text

    def _stop(self, name: str) -> None:
        p = self.procs.pop(name, None)
        if p is None or p.poll() is not None:
            return
        p.terminate()
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(5)

    def stop(self) -> None:
        for name in ("slurmd", "slurmctld", "munged"):
            self._stop(name)


def running(make: Callable[[], SlurmCluster]) -> Iterator[SlurmCluster]:
    """A module fixture's body: the cluster `make` builds, started, then stopped. Where it cannot run
    here (no tools, not root, does not start) the tests skip, and fail under CI."""
    for tool in TOOLS:
        require_tool(tool)
    if os.geteuid() != 0:
        unavailable("slurmd and slurmctld need root here (SlurmUser=root); CI runs as root")
    cluster = make()
    try:
        try:
            cluster.start()
        except RuntimeError as e:
            unavailable(f"the Slurm cluster did not start: {e}")
        yield cluster
    finally:
        cluster.stop()
