"""The daemon's periodic RDMA WRITE bandwidth tests as facts and metric families.

Not a polled collector: `nodehealth/rdma/periodic.py` runs the tests on its own thread (a test
takes seconds and must not hold up a pass) and hands the daemon these facts; the `rdma_bw` check
judges them and this module describes them for /metrics. `nodehealth check` runs no test, so it
has no such facts and the check stays silent there.
"""
from __future__ import annotations

from dataclasses import dataclass

from nodehealth.model import Metric

NAME = "rdma_bw"
OK = "ok"


@dataclass(frozen=True)
class Run:
    """One test of one rail against one peer."""

    device: str
    port: int
    peer: str
    time: float  # Unix time the run ended
    stage: str  # OK, or the stage it failed in
    error: str | None = None
    size: int = 0
    seconds: float | None = None
    bw_avg_gbps: float | None = None
    bw_peak_gbps: float | None = None
    msg_rate_mpps: float | None = None

    @property
    def rail(self) -> str:
        return f"{self.device}:{self.port}"


@dataclass(frozen=True)
class RdmaBw:
    rails: tuple[str, ...]  # "device:port" of every rail under test
    runs: tuple[Run, ...]  # oldest first: the newest per rail and peer, and each rail's recent history
    counts: tuple[tuple[str, int, str, int], ...] = ()  # (device, port, stage, runs) since the daemon started
    served: tuple[tuple[str, int], ...] = ()  # (outcome, tests) this node served for its peers
    error: str | None = None  # why no rail can be tested at all (no RDMA device)


def latest(facts: RdmaBw) -> dict[tuple[str, int, str], Run]:
    """The newest run of each rail against each peer."""
    out: dict[tuple[str, int, str], Run] = {}
    for run in facts.runs:
        out[(run.device, run.port, run.peer)] = run
    return out


def metrics(facts: RdmaBw) -> list[Metric]:
    labels = ("device", "port", "peer")
    bw = Metric("nodehealth_rdma_write_bw_gbps",
                "RDMA WRITE bandwidth of the last test of a rail against a peer, as ib_write_bw reports it "
                "(stat: avg or peak); absent when that test failed.", labels=labels + ("stat",))
    rate = Metric("nodehealth_rdma_write_messages_per_second", "Messages per second of that test (MsgRate).",
                  labels=labels)
    size = Metric("nodehealth_rdma_write_message_size_bytes", "Message size of that test.", labels=labels)
    when = Metric("nodehealth_rdma_bw_last_run_timestamp_seconds", "Unix time the last test of a rail against a "
                  "peer ended.", labels=labels)
    success = Metric("nodehealth_rdma_bw_last_run_success", "1 if that test measured and verified its bytes, "
                     "else 0.", labels=labels)
    for (device, port, peer), run in sorted(latest(facts).items()):
        key = (device, port, peer)
        when.add(key, run.time)
        success.add(key, 1 if run.stage == OK else 0)
        if run.stage == OK:
            bw.add(key + ("avg",), run.bw_avg_gbps)
            bw.add(key + ("peak",), run.bw_peak_gbps)
            rate.add(key, None if run.msg_rate_mpps is None else run.msg_rate_mpps * 1e6)
            size.add(key, run.size)
    runs = Metric("nodehealth_rdma_bw_runs_total", "Tests this node ran as the client, by rail and result "
                  "(ok, or the stage that failed: preflight, setup, peer, transfer).", "counter",
                  ("device", "port", "result"))
    for device, port, stage, n in sorted(facts.counts):
        runs.add((device, port, stage), n)
    served = Metric("nodehealth_rdma_bw_served_total", "Tests this node served for its peers, by result "
                    "(ok, error, or refused: a client rdma_bw.serve_to does not admit).", "counter", ("result",))
    for outcome, n in sorted(facts.served):
        served.add((outcome,), n)
    return [bw, rate, size, when, success, runs, served]
