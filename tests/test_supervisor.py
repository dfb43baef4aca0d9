"""The daemon's workers under the supervisor: one that dies runs again after a backoff, and while it
is down /healthz and nodehealth_worker_up say so."""
from __future__ import annotations

import threading

import pytest
from conftest import machine, wait_for

from nodehealth import config, exporter, node_pass, supervisor
from nodehealth.daemon import Daemon


class Flaky:
    """A worker that dies until it is allowed to run; then it works until the stop."""

    def __init__(self, stop: threading.Event, die_by: str = "raising"):
        self.stop = stop
        self.die_by = die_by
        self.may_run = threading.Event()
        self.runs = 0

    def __call__(self) -> None:
        self.runs += 1
        if not self.may_run.is_set():
            if self.die_by == "returning":
                return
            raise OSError(24, "Too many open files")
        self.stop.wait()


def up(sup: supervisor.Supervisor, name: str) -> float:
    family = next(m for m in sup.metrics() if m.name == "nodehealth_worker_up")
    return dict(family.samples)[(name,)]


@pytest.fixture
def fast_backoff(monkeypatch):
    monkeypatch.setattr(supervisor, "FIRST_BACKOFF_SECONDS", 0.2)
    monkeypatch.setattr(supervisor, "MAX_BACKOFF_SECONDS", 0.4)


@pytest.mark.parametrize("die_by, why", [("raising", "OSError: [Errno 24] Too many open files"),
                                         ("returning", "returned before the stop")])
def test_a_worker_that_dies_is_run_again_and_reported_while_down(fast_backoff, die_by, why):
    stop = threading.Event()
    sup = supervisor.Supervisor(stop)
    worker = Flaky(stop, die_by)
    sup.add("prober", worker)
    sup.start()
    try:
        problems = wait_for(sup.problems)
        assert problems and problems[0].startswith(f"worker prober died ({why}) and is run again"), problems
        assert wait_for(lambda: worker.runs >= 3)  # it keeps trying
        worker.may_run.set()
        assert wait_for(lambda: not sup.problems() and up(sup, "prober") == 1)
        restarts = next(m for m in sup.metrics() if m.name == "nodehealth_worker_restarts_total")
        assert dict(restarts.samples)[("prober",)] == worker.runs - 1
    finally:
        stop.set()
        sup.join(2)
    assert not any(w.thread.is_alive() for w in sup.workers)


def test_a_watched_thread_that_ends_before_the_stop_is_reported_dead():
    stop = threading.Event()
    sup = supervisor.Supervisor(stop)
    sup.watch(threading.Thread(target=lambda: None, name="rdma-bw", daemon=True))
    sup.start()
    assert wait_for(lambda: sup.problems() == ["worker rdma-bw is dead"])
    assert up(sup, "rdma-bw") == 0
    stop.set()
    assert sup.problems() == []  # after the stop, ended is not dead


def daemon(tmp_path, **sections) -> Daemon:
    """A daemon on plain-host after one pass, the configuration's sections updated with `sections`."""
    cfg = config.load(None)
    cfg["daemon"]["state_dir"] = str(tmp_path / "state")
    for name, values in sections.items():
        cfg[name].update(values)
    d = Daemon(node_pass.build_engine(cfg, machine("plain-host"), None), cfg, "n")
    d.run_pass()
    return d


def unhealthy_body(d: Daemon) -> bytes:
    """What /healthz says once it says 503."""
    healthz = d.routes()["/healthz"]

    def unhealthy():
        answer = healthz("")
        return answer if answer[0] == 503 else None
    return wait_for(unhealthy)[1]


def test_the_daemon_fails_healthz_while_a_worker_is_down_and_recovers(tmp_path, fast_backoff):
    d = daemon(tmp_path)
    worker = Flaky(d.stop)
    d.workers.add("pingmesh-prober", worker)
    d.workers.start()
    try:
        healthz = d.routes()["/healthz"]
        body = unhealthy_body(d)
        assert body.startswith(b"worker pingmesh-prober died (OSError: [Errno 24] Too many open files)"), body
        assert 'nodehealth_worker_up{worker="pingmesh-prober"} 0' in exporter.render(d.metrics()).decode()
        worker.may_run.set()
        assert wait_for(lambda: healthz("")[0] == 200)
        assert 'nodehealth_worker_up{worker="pingmesh-prober"} 1' in exporter.render(d.metrics()).decode()
    finally:
        d.stop.set()
        d.workers.join(2)


def test_a_face_thread_that_ends_early_fails_healthz(tmp_path, monkeypatch):
    """The remediation hook's workers (a face's own threads) are watched: one that ends before the stop
    is named in /healthz and nodehealth_worker_up, not lost without a word."""
    from nodehealth.hooks.hook import Hook

    monkeypatch.setattr(Hook, "_worker", lambda self: None)  # each worker returns at once, as a dead one
    d = daemon(tmp_path, hooks={"enabled": True, "command": ["true"]})
    d.start()
    try:
        body = unhealthy_body(d)
        assert b"worker hook-0 is dead" in body, body
        assert 'nodehealth_worker_up{worker="hook-0"} 0' in exporter.render(d.metrics()).decode()
    finally:
        d.shutdown()
