"""`nodehealth netcheck job`: every node of a job runs it and exits with the job's verdict.

The nodes here are processes on loopback addresses (127.0.0.11, .12, ...: one agent port for all,
as on real nodes); their pods are in tests/fake_kube_apiserver.py, read by the real client. The TCP
test runs between them (no verbs device here); faults between namespaces are in
tests/test_netcheck_netns.py, over RDMA in the VM tier.
"""
from __future__ import annotations

import json
import os
import socket
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
        assert rc == 0, (err, doc)
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
    first = job("n1", "127.0.0.31", port, env=dict(slurm, SLURM_NODEID="0"))
    intruder = job("intruder", "127.0.0.39", port, env=dict(slurm, SLURM_NODEID="1"))
    rc, doc, err = finish([intruder])[0]  # it retries until the coordinator listens, then is turned away
    assert rc == 2 and "refused this node" in err and "not an address of the job's nodes" in err
    results = finish([first, job("n2", "127.0.0.32", port, env=dict(slurm, SLURM_NODEID="1"))])
    assert [r[0] for r in results] == [0, 0], results
    assert results[0][1]["source"] == "slurm" and sorted(results[1][1]["nodes"]) == ["n1", "n2"]


def test_a_stranger_with_a_job_hosts_name_is_refused_and_the_host_admitted():
    """Nodes are admitted by the address they join from: a stranger (127.0.0.39) that calls itself
    127.0.0.36 is turned away, and the real 127.0.0.36 joins (it was turned away as a duplicate)."""
    port = free_port()
    hosts = "127.0.0.35,127.0.0.36"
    first = job("n1", "127.0.0.35", port, "--hosts", hosts, "--wait", "30")
    impostor = job("127.0.0.36", "127.0.0.39", port, "--hosts", hosts)
    rc, doc, err = finish([impostor])[0]
    assert rc == 2 and "refused this node" in err and "127.0.0.39" in err and "not an address of the job's" in err, err
    results = finish([first, job("n2", "127.0.0.36", port, "--hosts", hosts)])
    assert [r[0] for r in results] == [0, 0], results
    assert sorted(results[0][1]["nodes"]) == ["n1", "n2"] and results[0][1]["missing"] == []


def test_no_way_to_find_the_job_is_usage():
    env = {k: "" for k in ("SLURM_JOB_NODELIST", "SLURM_NODELIST", "MASTER_ADDR", "PET_MASTER_ADDR",
                           "PET_RDZV_ENDPOINT", "NODEHEALTH_NETCHECK_HOSTS")}
    rc, doc, err = finish([job("n1", "127.0.0.41", free_port(), env=env)])[0]
    assert rc == 2 and "--kube-selector" in err and "Slurm" in err
    rc, doc, err = finish([job("n1", "127.0.0.41", free_port(), "--hosts", "a,b", "--slow-fraction", "2")])[0]
    assert rc == 2 and "slow-fraction" in err


def test_method_is_rdma_only_where_every_node_has_a_device():
    from nodehealth.netcheck.agent import RDMA, TCP
    from nodehealth.netcheck.coordinator import Host, choose_method

    both = [Host(f"10.0.0.{i}:1", f"n{i}", f"10.0.0.{i}:1", (TCP, RDMA), "mlx5_0 port 1") for i in range(3)]
    assert choose_method(both, "auto") == RDMA and choose_method(both, "tcp") == TCP
    mixed = both + [Host("10.0.0.9:1", "n9", "10.0.0.9:1")]
    assert choose_method(mixed, "auto") == TCP  # bandwidths of two methods do not compare
    with pytest.raises(ValueError, match="no rdma test on n9"):
        choose_method(mixed, "rdma")


def test_rendezvous_takes_the_job_and_no_more():
    import threading

    from nodehealth.netcheck.agent import Member, Rendezvous

    rv = Rendezvous(2, answer_timeout=5,
                    accept=lambda m, source: None if source != "10.0.0.6" else "not one of the job's nodes")
    assert rv.add(Member("a", "10.0.0.1:9460"), "10.0.0.1") is None
    assert rv.join({"name": "b", "agent": "10.0.0.2:9460"}, "10.0.0.6") == {"error": "not one of the job's nodes"}
    assert "not HOST:PORT" in rv.join({"name": "b", "agent": "nocolon"}, "10.0.0.2")["error"]
    assert "a name" in rv.join({"name": "x" * 300, "agent": "10.0.0.2:9460"}, "10.0.0.2")["error"]
    answers = []

    def join_b():
        ours, theirs = socket.socketpair()
        with ours, theirs:  # it names another address for its agent: it is reached where it came from
            rv.deliver(ours, rv.join({"name": "b", "agent": "192.0.2.9:9461"}, "10.0.0.2"))  # sends it, counts it
            answers.append(json.loads(theirs.makefile().readline()))
    t = threading.Thread(target=join_b)
    t.start()
    members = rv.wait(2, deadline=__import__("time").monotonic() + 5)
    assert members == [Member("a", "10.0.0.1:9460"), Member("b", "10.0.0.2:9461")]
    assert "have joined already" in rv.join({"name": "c", "agent": "10.0.0.3:9460"}, "10.0.0.3")["error"]
    rv.finish({"verdict": {"faulty": []}, "code": 0}, linger=5)
    t.join(5)
    assert answers == [{"verdict": {"faulty": []}, "code": 0}]
    assert "too late" in rv.join({"name": "b", "agent": "10.0.0.2:9460"}, "10.0.0.2")["error"]


def test_an_agent_without_a_device_refuses_rdma_in_one_line():
    from nodehealth.netcheck import agent as netcheck_agent
    from nodehealth.netcheck.wire import request

    agent = netcheck_agent.Agent(("127.0.0.1", 0), netcheck_agent.AgentConfig("n1", "127.0.0.1:1"))
    ep = f"127.0.0.1:{agent.server_address[1]}"
    agent.start()
    try:
        hello = request(ep, {"op": "hello"}, 5)
        assert hello["methods"] == ["tcp"] and hello["rdma"] is None
        answer = request(ep, {"op": "send", "to": "127.0.0.1:9", "seconds": 1, "method": "rdma"}, 5)
        assert answer == {"error": "this agent has no 'rdma' test (it offers tcp)"}
        assert request(ep, {"op": "rdma-serve", "seconds": 1}, 5) == {"error": "this agent has no RDMA device"}
        assert "unknown op 'join'" in request(ep, {"op": "join", "name": "a", "agent": "1.2.3.4:5"}, 5)["error"]
    finally:
        agent.close()


@pytest.mark.parametrize("setting, fragment", [
    ({"slow_fraction": 1.5}, "netcheck.slow_fraction"), ({"method": "udp"}, "auto, tcp or rdma"),
    ({"port": 0}, "netcheck.port"), ({"seconds": 0}, "netcheck.seconds"), ({"max_rounds": 0}, "netcheck.max_rounds"),
])
def test_netcheck_config_is_checked(tmp_path, setting, fragment):
    from nodehealth import config

    path = tmp_path / "c.json"
    path.write_text(json.dumps({"netcheck": setting}))
    with pytest.raises(config.ConfigError, match=fragment):
        config.load(str(path))
    assert config.load(None)["netcheck"]["slow_fraction"] == 0.5


def test_flags_override_the_config(tmp_path):
    import argparse

    from nodehealth.netcheck import preflight

    path = tmp_path / "c.json"
    path.write_text(json.dumps({"netcheck": {"seconds": 5.0, "slow_fraction": 0.7}}))
    cfg = preflight.settings(argparse.Namespace(config=str(path), seconds=1.0, slow_fraction=None))
    assert cfg["seconds"] == 1.0 and cfg["slow_fraction"] == 0.7
    with pytest.raises(preflight.Usage, match="--seconds must be at most 60"):
        preflight.settings(argparse.Namespace(config=None, seconds=61.0))


def test_torchrun_environment_job_counts_who_joined():
    """Before torchrun: $PET_NNODES and $PET_MASTER_ADDR give a count and the coordinator, not the
    hosts; an elastic MIN:MAX job goes ahead with MIN, a fixed one names how many never came."""
    port = free_port()
    env = {"PET_NNODES": "3", "PET_MASTER_ADDR": "127.0.0.51"}
    procs = [job(f"n{i}", f"127.0.0.5{i}", port, "--wait", "3", env=dict(env, PET_NODE_RANK=str(i - 1)))
             for i in (1, 2)]
    results = finish(procs)
    assert [r[0] for r in results] == [1, 1], results
    assert results[1][1]["missing"] == [{"node": "1 of 3 nodes", "error": "never joined within 3 s"}]
    assert results[0][1]["source"] == "torchrun" and sorted(results[1][1]["nodes"]) == ["n1", "n2"]
    env = {"PET_NNODES": "2:3", "PET_MASTER_ADDR": "127.0.0.51"}
    procs = [job(f"n{i}", f"127.0.0.5{i}", port, "--wait", "3", env=dict(env, PET_NODE_RANK=str(i - 1)))
             for i in (1, 2)]
    assert [(rc, doc["missing"]) for rc, doc, _ in finish(procs)] == [(0, []), (0, [])]


def test_a_bad_config_file_is_one_line(tmp_path):
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"netcheck": {"slow_fraction": 3.0}}))
    for cmd in (["run", "--hosts", "a:1,b:2"], ["serve", "--listen", "127.0.0.1:1"], ["job", "--hosts", "a,b"]):
        p = subprocess.run([sys.executable, "-m", "nodehealth.cli", "netcheck", *cmd, "--config", str(path)],
                           capture_output=True, text=True, timeout=60)
        assert p.returncode == 2 and "netcheck.slow_fraction: must be a fraction" in p.stderr, (cmd, p.stderr)
        assert "Traceback" not in p.stderr


def test_the_init_container_example_is_valid_and_finds_its_pods():
    """deploy/examples/netcheck-job.yaml: valid objects; the init container's command parses; the
    Role allows only listing pods; the selector it lists by is the Job's pod label."""
    import kubernetes_validate
    import yaml

    from nodehealth import cli

    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "deploy", "examples",
                        "netcheck-job.yaml")
    with open(path) as f:
        docs = {d["kind"]: d for d in yaml.safe_load_all(f)}
    for doc in docs.values():
        kubernetes_validate.validate(doc, "1.30.0", strict=True)
    assert docs["Role"]["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}]
    pod = docs["Job"]["spec"]["template"]
    init = pod["spec"]["initContainers"][0]
    args = cli.parser().parse_args(init["command"][1:])
    assert args.netcheck_command == "job" and args.nodes == docs["Job"]["spec"]["completions"]
    # the Job controller labels its pods job-name=<the Job's name>
    assert args.kube_selector == f"job-name={docs['Job']['metadata']['name']}"
    assert docs["Service"]["spec"]["selector"] == {"job-name": docs["Job"]["metadata"]["name"]}
    assert {e["name"] for e in init["env"]} == {"POD_NAME", "POD_NAMESPACE"}
    assert pod["spec"]["serviceAccountName"] == docs["RoleBinding"]["subjects"][0]["name"]


def test_as_a_torchrun_pre_step_with_torchruns_own_rendezvous(tmp_path):
    """Two real torchrun launchers (nodes 0 and 1, one process each) run `netcheck job`: torchrun's
    worker environment alone tells each copy the node count, its rank and the coordinator."""
    port, master_port = free_port(), free_port()
    procs = []
    for rank in (0, 1):
        script = (f"exec {sys.executable} -m nodehealth.cli netcheck job --listen 127.0.0.6$((GROUP_RANK + 1)) "
                  f"--name node$GROUP_RANK --port {port} --seconds 0.3 --wait 30 --json > {tmp_path}/out{rank}.json")
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(rank),
             "--nproc-per-node", "1", "--master-addr", "127.0.0.61", "--master-port", str(master_port), "--no-python",
             "sh", "-c", script], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env={k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "PET_", "NODEHEALTH_"))}))
    for p in procs:
        out, _ = p.communicate(timeout=120)
        assert p.returncode == 0, out
    docs = [json.loads((tmp_path / f"out{r}.json").read_text()) for r in (0, 1)]
    assert docs[0] == docs[1] and docs[0]["source"] == "torchrun" and docs[0]["coordinator"] == "127.0.0.61"
    assert sorted(docs[0]["nodes"]) == ["node0", "node1"] and docs[0]["faulty"] == [] and docs[0]["missing"] == []


def test_a_node_joins_by_the_address_it_comes_from_not_its_name():
    """The host list's addresses and names' addresses admit; a name is a label (with the name of a
    job host, a stranger is still a stranger); one host joins once."""
    from nodehealth.netcheck import discovery as discover
    from nodehealth.netcheck.agent import Member
    from nodehealth.netcheck.preflight import JobNodes

    nodes = JobNodes(discover.from_hosts(["10.0.0.5", "10.0.0.6", "localhost"], lambda host: False))
    assert nodes.accept(Member("10.0.0.6", "10.9.9.9:9460"), "10.9.9.9") == \
        "10.0.0.6 joins from 10.9.9.9, which is not an address of the job's nodes"
    assert nodes.accept(Member("gpu-6", "10.0.0.6:9460"), "10.0.0.6") is None
    assert nodes.accept(Member("other", "10.0.0.6:9460"), "10.0.0.6") == "10.0.0.6 has joined already as gpu-6"
    assert nodes.accept(Member("me", "127.0.0.1:9460"), "127.0.0.1") is None  # localhost's address
    assert nodes.accept(Member("v4", "10.0.0.5:9460"), "::ffff:10.0.0.5") is None  # an IPv6 listener's view
