"""Real `nodehealth daemon` processes with the probe agent, one per namespace of a Topology."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

from netns.topology import Topology

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLAIN_HOST = os.path.join(HERE, "fixtures", "machines", "plain-host")
HTTP_PORT = 9456
PROBE_PORT = 9457


class Mesh:
    """Starts a daemon in every node namespace and reads their summaries over the management network."""

    def __init__(self, topo: Topology, workdir: str, pingmesh: dict):
        self.topo = topo
        self.workdir = workdir
        self.procs: dict[str, subprocess.Popen] = {}
        self.inventory = os.path.join(workdir, "inventory.json")
        with open(self.inventory, "w") as f:
            json.dump(topo.inventory(), f)
        self.config = os.path.join(workdir, "config.json")
        with open(self.config, "w") as f:
            json.dump({"pingmesh": dict(pingmesh, port=PROBE_PORT)}, f)

    def start(self) -> Mesh:
        for n in self.topo.nodes:
            log = open(os.path.join(self.workdir, f"{n.name}.log"), "w")
            cmd = ["ip", "netns", "exec", n.ns, sys.executable, "-m", "nodehealth.cli", "daemon",
                   "--root", PLAIN_HOST, "--only", "modules", "--interval", "60",
                   "--state-dir", os.path.join(self.workdir, n.name), "--node-name", n.name,
                   "--listen", f"0.0.0.0:{HTTP_PORT}", "--config", self.config,
                   "--probe-listen", f"{n.address}:{PROBE_PORT}", "--probe-inventory", self.inventory]
            self.procs[n.name] = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
            log.close()
        deadline = time.monotonic() + 60
        for n in self.topo.nodes:
            while self.summary(n.name) is None:
                if self.procs[n.name].poll() is not None:
                    raise RuntimeError(f"daemon {n.name} exited: {self.log(n.name)}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"daemon {n.name} did not answer: {self.log(n.name)}")
                time.sleep(0.2)
        return self

    def url(self, name: str) -> str:
        return f"http://{self.topo.node(name).mgmt}:{HTTP_PORT}/v1/pingmesh"

    def summary(self, name: str, windows: int | None = None) -> dict | None:
        url = self.url(name) + (f"?windows={windows}" if windows is not None else "")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                return json.loads(r.read())
        except (OSError, ValueError):
            return None

    def summaries(self, windows: int | None = None) -> list[dict]:
        return [s for s in (self.summary(n.name, windows) for n in self.topo.nodes) if s is not None]

    def log(self, name: str) -> str:
        with open(os.path.join(self.workdir, f"{name}.log")) as f:
            return f.read()[-3000:]

    def stop(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs.values():
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
