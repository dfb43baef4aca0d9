"""`nodehealth netcheck job`: every node of a job runs it and exits with the job's verdict.

The nodes here are processes on loopback addresses (127.0.0.11, .12, ...: one agent port for all,
as on real nodes); their pods are in tests/fake_kube_apiserver.py, read by the real client. The TCP
test runs between them (no verbs device here); faults between namespaces are in
tests/test_netcheck_netns.py, over RDMA in the VM tier.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from conftest import free_port
from fake_kube_apiserver import FakeApiServer

INDEX = "batch.kubernetes.io/job-completion-index"


def job(name: str, address: str, port: int, *extra: str, env: dict | None = None) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "nodehealth.cli", "netcheck", "job", "--name", name, "--listen", address,
           "--port", str(port), "--seconds", "0.3", "--json", *extra]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, **(env or {})))


def finish(procs: list[subprocess.Popen]) -> list[tuple[int, dict | None, str]]:
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=90)
        out.append((p.returncode, json.loads(stdout) if stdout.strip() else None, stderr))
    return out


@pytest.fixture
def api():
    server = FakeApiServer().start()
    yield server
    server.close()


def test_kube_pods_by_selector_index_zero_coordinates(api, tmp_path):
    """As init containers: pods are Pending with IPs; one gets its IP late; index 0 is not first by name."""
    kubeconfig = api.kubeconfig(str(tmp_path / "kubeconfig"))
    port = free_port()
    pods = {"train-a": ("127.0.0.12", 1), "train-b": ("127.0.0.11", 0), "train-c": ("127.0.0.13", 2)}
    api.add_pod("ml", "train-a", {"job-name": "train", INDEX: "1"}, pods["train-a"][0])
    api.add_pod("ml", "train-b", {"job-name": "train", INDEX: "0"}, None)  # no sandbox yet
    api.add_pod("ml", "train-c", {"job-name": "train", INDEX: "2"}, pods["train-c"][0])
    api.add_pod("ml", "other-0", {"job-name": "other", INDEX: "0"}, "127.0.0.99")
    procs = [job(name, ip, port, "--kube-selector", "job-name=train", "--nodes", "3", "--namespace", "ml",
                 "--kubeconfig", kubeconfig, "--wait", "30") for name, (ip, _) in pods.items()]
    time.sleep(1.5)
    api.add_pod("ml", "train-b", {"job-name": "train", INDEX: "0"}, pods["train-b"][0])
    results = finish(procs)
    for rc, doc, err in results:
        assert rc == 0, err
        assert doc["coordinator"] == "train-b" and doc["method"] == "tcp"
        assert sorted(doc["nodes"]) == ["train-a", "train-b", "train-c"]
        assert {n["status"] for n in doc["nodes"].values()} == {"sound"}
    assert results[1][1]["source"] == "kubernetes"  # the coordinator's own report says where the nodes came from
    assert ("GET", "/api/v1/namespaces/ml/pods") in api.requests


def test_kube_without_a_size_or_api_is_a_clear_error(api, tmp_path):
    p = job("train-a", "127.0.0.12", free_port(), "--kube-selector", "job-name=train", "--kubeconfig",
            api.kubeconfig(str(tmp_path / "k")), env={"WORLD_SIZE": "", "PET_NNODES": ""})
    rc, doc, err = finish([p])[0]
    assert rc == 2 and "--nodes N" in err and doc is None
    api.fail(403, path_end="/pods")
    p = job("train-a", "127.0.0.12", free_port(), "--kube-selector", "job-name=train", "--nodes", "2",
            "--namespace", "ml", "--kubeconfig", api.kubeconfig(str(tmp_path / "k")))
    rc, doc, err = finish([p])[0]
    assert rc == 2 and "cannot list the job's pods: 403" in err and "Traceback" not in err


def test_host_list_names_a_node_that_never_joined(tmp_path):
    """Every node that ran gets the same verdict, exit 1: the job must not start without its fourth node."""
    port = free_port()
    hosts = "127.0.0.21,127.0.0.22,127.0.0.23,127.0.0.24"
    procs = [job(f"n{i}", f"127.0.0.2{i}", port, "--hosts", hosts, "--wait", "4") for i in (1, 2, 3)]
    results = finish(procs)
    docs = [doc for _, doc, _ in results]
    assert [rc for rc, _, _ in results] == [1, 1, 1], [err for _, _, err in results]
    assert all(d["missing"] == [{"node": "127.0.0.24", "error": "never joined within 4 s"}] for d in docs)
    assert all(sorted(d["nodes"]) == ["n1", "n2", "n3"] and d["faulty"] == [] for d in docs)
    assert {d["coordinator"] for d in docs} == {"127.0.0.21"} and docs[0]["source"] == "hosts"


def test_a_stranger_is_refused_and_slurm_env_is_read(tmp_path):
    """Slurm's nodelist gives the hosts; a node that is none of them is turned away."""
    port = free_port()
    slurm = {"SLURM_JOB_NODELIST": "127.0.0.[31-32]"}
    procs = [job("n1", "127.0.0.31", port, env=dict(slurm, SLURM_NODEID="0")),
             job("n2", "127.0.0.32", port, env=dict(slurm, SLURM_NODEID="1")),
             job("intruder", "127.0.0.39", port, env=dict(slurm, SLURM_NODEID="1"))]
    results = finish(procs)
    assert results[0][0] == 0 and results[1][0] == 0, results
    assert results[0][1]["source"] == "slurm" and sorted(results[1][1]["nodes"]) == ["n1", "n2"]
    rc, doc, err = results[2]
    assert rc == 2 and "refused this node" in err and "not one of the job's nodes" in err


def test_no_way_to_find_the_job_is_usage():
    env = {k: "" for k in ("SLURM_JOB_NODELIST", "SLURM_NODELIST", "MASTER_ADDR", "PET_MASTER_ADDR",
                           "PET_RDZV_ENDPOINT", "NODEHEALTH_NETCHECK_HOSTS")}
    rc, doc, err = finish([job("n1", "127.0.0.41", free_port(), env=env)])[0]
    assert rc == 2 and "--kube-selector" in err and "Slurm" in err
    rc, doc, err = finish([job("n1", "127.0.0.41", free_port(), "--hosts", "a,b", "--slow-fraction", "2")])[0]
    assert rc == 2 and "slow-fraction" in err
