"""The daemon's and the controller's own `process_*` families: the names, types and values every
Prometheus exporter has, checked against the kernel's figures for the daemon's process and against
prometheus_client's own process collector reading the same process."""
from __future__ import annotations

import os
import resource

from conftest import machine
from prometheus_client import ProcessCollector
from prometheus_client.parser import text_string_to_metric_families

from nodehealth import config, exporter
from nodehealth.process_metrics import process_metrics

FAMILIES = {"process_cpu_seconds": "counter", "process_resident_memory_bytes": "gauge",
            "process_virtual_memory_bytes": "gauge", "process_open_fds": "gauge", "process_max_fds": "gauge",
            "process_start_time_seconds": "gauge"}


def parsed(text: str) -> dict[str, tuple[str, float]]:
    """{family: (type, value)} of the process_* families in an exposition text."""
    return {f.name: (f.type, f.samples[0].value) for f in text_string_to_metric_families(text)
            if f.name.startswith("process_")}


def test_the_daemons_own_figures_are_the_kernels(tmp_path, daemon_factory):
    d = daemon_factory(machine("plain-host"), str(tmp_path / "state"))
    d.wait_ready()
    pid = d.proc.pid
    got = parsed(d.get("/metrics")[1].decode())
    assert {name: kind for name, (kind, _) in got.items()} == FAMILIES
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    with open("/proc/stat") as f:
        boot = next(float(line.split()[1]) for line in f if line.startswith("btime "))
    assert abs(got["process_start_time_seconds"][1] - (boot + int(fields[19]) / ticks)) < 1.0
    page = os.sysconf("SC_PAGE_SIZE")
    rss = int(fields[21]) * page
    assert 0.5 * rss < got["process_resident_memory_bytes"][1] < 2 * rss
    assert 0 < got["process_cpu_seconds"][1] < 600
    assert 3 <= got["process_open_fds"][1] <= len(os.listdir(f"/proc/{pid}/fd")) + 16
    with open(f"/proc/{pid}/limits") as f:
        soft = next(line.split()[3] for line in f if line.startswith("Max open files"))
    assert got["process_max_fds"][1] == float(soft)


def test_the_same_as_prometheus_clients_process_collector():
    """prometheus_client reads /proc itself; both describe this very process alike."""
    ours = parsed(exporter.render(process_metrics()).decode())
    theirs = {m.name: (m.type, m.samples[0].value) for m in ProcessCollector(registry=None).collect()}
    assert {k: v[0] for k, v in ours.items()} == {k: v[0] for k, v in theirs.items() if k in ours}
    assert set(ours) == set(FAMILIES) and set(ours) <= set(theirs)
    assert abs(ours["process_start_time_seconds"][1] - theirs["process_start_time_seconds"][1]) < 1.0
    assert ours["process_max_fds"][1] == theirs["process_max_fds"][1] == resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    assert abs(ours["process_virtual_memory_bytes"][1] - theirs["process_virtual_memory_bytes"][1]) < 64 << 20
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(300)]  # as the infiniband collector's kept files
    try:
        ours = parsed(exporter.render(process_metrics()).decode())
        theirs = {m.name: m.samples[0].value for m in ProcessCollector(registry=None).collect()}
    finally:
        for fd in held:
            os.close(fd)
    assert abs(ours["process_open_fds"][1] - theirs["process_open_fds"]) <= 1  # theirs counts its listing's own


def test_the_controller_has_them_too(tmp_path):
    from fake_kube_apiserver import FakeApiServer

    from nodehealth.pingmesh import controller

    server = FakeApiServer().start()
    try:
        cfg = config.defaults()
        cfg["kube"]["kubeconfig"] = server.kubeconfig(str(tmp_path / "kubeconfig"))
        c = controller.Controller(cfg, "controller-a")
        assert set(FAMILIES) <= set(parsed(exporter.render(c.metrics()).decode()))
    finally:
        server.close()


def test_a_forked_child_describes_itself_not_its_parent():
    """The start time is read once a process: a child forked after a scrape has its own figures."""
    def cpu() -> float:
        return next(m.samples[0][1] for m in process_metrics() if m.name == "process_cpu_seconds_total")

    while cpu() < 0.3:  # the parent has spent CPU (the test run's imports, at least), a new child almost none
        sum(range(10**6))
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.write(write, repr(cpu()).encode())
        os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    child = float(os.read(read, 100))
    os.close(read)
    assert child < 0.2 < cpu()
