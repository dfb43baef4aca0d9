"""netcheck job's discovery: Slurm host lists (checked against Slurm's own parser), torchrun's
environment (as real torchrun sets it), Kubernetes pods, and a verbs device found from an address."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import require_tool

from nodehealth.host import HostPaths
from nodehealth.netcheck import discovery as discover
from nodehealth.netcheck.discovery import DiscoveryError
from nodehealth.rdma import bw as rdma
from nodehealth.rdma import pair as rdmapair

HOSTLISTS = ["node[01-04,07]", "gpu7", "rack[1-2]-n[1-2]", "x[8-11],y", "n[009-011],m[1,3-4]",
             "a-b[0-2],c[10-9999]"]


def test_hostlist_expands_as_slurm_does(tmp_path):
    scontrol = require_tool("scontrol")
    conf = tmp_path / "slurm.conf"  # `show hostnames` only parses, but scontrol wants a configuration
    conf.write_text("ClusterName=x\nSlurmctldHost=localhost\nNodeName=n1 CPUs=1 State=UNKNOWN\n"
                    "PartitionName=p Nodes=n1\n")
    for text in HOSTLISTS:
        p = subprocess.run([scontrol, "show", "hostnames", text], capture_output=True, text=True,
                           env=dict(os.environ, SLURM_CONF=str(conf)), timeout=30)
        assert p.returncode == 0, p.stderr
        assert discover.expand_hostlist(text) == p.stdout.split(), text


def test_hostlist_keeps_padding_and_order():
    assert discover.expand_hostlist("node[01-04,07]") == ["node01", "node02", "node03", "node04", "node07"]
    assert discover.expand_hostlist("r[1-2]n[08-09]") == ["r1n08", "r1n09", "r2n08", "r2n09"]


@pytest.mark.parametrize("text, fragment", [
    ("node[01-04", "unbalanced"), ("node01-04]", "unbalanced"), ("node[a-b]", "numeric"),
    ("node[5-1]", "bad range"), ("n[1-99999999]", "bad range"), ("a[1-400],b[1-400]x[1-400]", "more than"),
])
def test_bad_hostlists_are_one_clear_error(text, fragment):
    with pytest.raises(DiscoveryError, match=fragment):
        discover.expand_hostlist(text)


def test_slurm_plan():
    env = {"SLURM_JOB_NODELIST": "gpu[01-03,07]", "SLURM_NODEID": "0", "SLURM_JOB_NUM_NODES": "4"}
    plan = discover.from_slurm(env)
    assert plan.hosts == ["gpu01", "gpu02", "gpu03", "gpu07"] and plan.coordinator == "gpu01" and plan.is_coordinator
    assert plan.count == 4 and plan.source == "slurm"
    assert not discover.from_slurm(dict(env, SLURM_NODEID="3")).is_coordinator
    with pytest.raises(DiscoveryError, match="srun"):
        discover.from_slurm({"SLURM_JOB_NODELIST": "gpu[01-02]"})  # sbatch's script, not a step on each node
    with pytest.raises(DiscoveryError, match="beyond"):
        discover.from_slurm(dict(env, SLURM_NODEID="4"))
    with pytest.raises(DiscoveryError, match="at least two"):
        discover.from_slurm({"SLURM_JOB_NODELIST": "gpu01", "SLURM_NODEID": "0"})


def test_torchrun_options_as_the_training_operator_sets_them():
    """$PET_* are torchrun's own options as environment (torch.distributed.run reads them)."""
    env = {"PET_NNODES": "2:4", "PET_RDZV_ENDPOINT": "train-master-0:29400", "PET_NPROC_PER_NODE": "8"}
    plan = discover.from_torchrun(env, is_local=lambda h: h == "train-master-0")
    assert (plan.coordinator, plan.is_coordinator, plan.count, plan.min_count) == ("train-master-0", True, 4, 2)
    plan = discover.from_torchrun(dict(env, PET_NODE_RANK="1"), is_local=lambda h: True)
    assert not plan.is_coordinator  # a rank is stronger than an address guess
    env = {"PET_NNODES": "3", "PET_MASTER_ADDR": "10.0.0.5", "PET_MASTER_PORT": "23456", "PET_NODE_RANK": "0"}
    plan = discover.from_torchrun(env, is_local=lambda h: False)
    assert (plan.coordinator, plan.is_coordinator, plan.count) == ("10.0.0.5", True, 3)
    with pytest.raises(DiscoveryError, match="MIN:MAX"):
        discover.from_torchrun({"PET_NNODES": "two", "MASTER_ADDR": "x"}, is_local=lambda h: False)
    with pytest.raises(DiscoveryError, match="not a torchrun job"):
        discover.from_torchrun({"PET_NNODES": "2"}, is_local=lambda h: False)


def _torchrun_worker_env(tmp_path, rank: int, port: int) -> subprocess.Popen:
    script = tmp_path / "dump.py"
    script.write_text("import json, os, sys\njson.dump(dict(os.environ), open(sys.argv[1], 'w'))\n")
    return subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(rank),
                             "--nproc-per-node", "1", "--master-addr", "127.0.0.1", "--master-port", str(port),
                             str(script), str(tmp_path / f"env{rank}.json")],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_the_environment_real_torchrun_gives_a_pre_step(tmp_path):
    """`torchrun --nproc-per-node=1 ... nodehealth netcheck job` uses torchrun's own rendezvous: its
    workers get the node count, the node rank and the master's address."""
    from conftest import free_port

    port = free_port()
    procs = [_torchrun_worker_env(tmp_path, rank, port) for rank in (0, 1)]
    for p in procs:
        out, _ = p.communicate(timeout=120)
        assert p.returncode == 0, out
    envs = [json.loads((tmp_path / f"env{r}.json").read_text()) for r in (0, 1)]
    assert envs[1]["GROUP_RANK"] == "1" and envs[1]["WORLD_SIZE"] == "2" and envs[1]["LOCAL_WORLD_SIZE"] == "1"
    plans = [discover.from_torchrun(env, is_local=lambda h: False) for env in envs]
    assert [p.is_coordinator for p in plans] == [True, False]
    assert {p.coordinator for p in plans} == {"127.0.0.1"} and {p.count for p in plans} == {2}
    per_node = dict(envs[0], WORLD_SIZE="16", LOCAL_WORLD_SIZE="8", GROUP_RANK="1", RANK="9")
    plan = discover.from_torchrun(per_node, is_local=lambda h: True)
    assert plan.count == 2 and not plan.is_coordinator  # 16 processes, 8 a node: 2 nodes; node rank 1


def _pod(name, ip=None, index=None, phase="Pending", deleting=False):
    meta = {"name": name, "labels": {"job-name": "train"}}
    if index is not None:
        meta["labels"]["batch.kubernetes.io/job-completion-index"] = str(index)
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"metadata": meta, "status": {"phase": phase, **({"podIP": ip} if ip else {})}}


def test_pods_plan_waits_for_every_ip_and_index_zero_coordinates():
    label = "batch.kubernetes.io/job-completion-index"
    pods = [_pod("train-b", "10.1.0.2", 1), _pod("train-a", "10.1.0.9", 2), _pod("train-c", None, 0),
            _pod("train-old", "10.1.0.7", 0, deleting=True), _pod("train-done", "10.1.0.8", 3, phase="Failed")]
    assert discover.from_pods(pods, "train-b", 3, label) is None  # index 0 has no IP yet: list again
    pods[2] = _pod("train-c", "10.1.0.3", 0)
    plan = discover.from_pods(pods, "train-b", 3, label)
    assert plan.hosts == ["train-c", "train-b", "train-a"] and plan.coordinator == "train-c"
    assert not plan.is_coordinator and plan.addresses["train-c"] == "10.1.0.3"
    assert discover.from_pods(pods, "train-c", 3, label).is_coordinator
    unindexed = [_pod("w-1", "10.2.0.1"), _pod("w-0", "10.2.0.2")]
    assert discover.from_pods(unindexed, "w-0", 2, label).coordinator == "w-0"  # first by name
    with pytest.raises(DiscoveryError, match="not among"):
        discover.from_pods(pods, "someone-else", 3, label)
    with pytest.raises(DiscoveryError, match="narrow the selector"):
        discover.from_pods(pods, "train-b", 2, label)


def test_hostfile_and_host_list(tmp_path):
    f = tmp_path / "hosts"
    f.write_text("# the job\nnode1 slots=8\n\nnode2:9470  # agent on another port\n10.0.0.3\n")
    assert discover.read_hostfile(str(f)) == ["node1", "node2:9470", "10.0.0.3"]
    plan = discover.from_hosts(["node2", "node1", "node2"], is_local=lambda h: h == "node2")
    assert plan.hosts == ["node2", "node1"] and plan.is_coordinator and plan.count == 2
    assert discover.host_of("[fd00::1]:9460") == "fd00::1" and discover.host_of("fd00::1") == "fd00::1"
    with pytest.raises(DiscoveryError, match="cannot read"):
        discover.read_hostfile(str(tmp_path / "absent"))


def test_this_machine_is_recognised():
    from nodehealth.netcheck import preflight

    assert preflight.is_local_address("127.0.0.1") and not preflight.is_local_address("192.0.2.77")
    assert not preflight.is_local_address("0.0.0.0")  # every address, so nobody's in particular
    assert preflight.source_address("127.0.0.1", 9) == "127.0.0.1"


def _device(root, name, link_layer, gids, state="4: ACTIVE"):
    port = root / "sys" / "class" / "infiniband" / name / "ports" / "1"
    (port / "gids").mkdir(parents=True)
    (port / "gid_attrs" / "types").mkdir(parents=True)
    (port / "link_layer").write_text(link_layer + "\n")
    (port / "state").write_text(state + "\n")
    for i, (gid, kind) in enumerate(gids):
        (port / "gids" / str(i)).write_text(gid + "\n")
        (port / "gid_attrs" / "types" / str(i)).write_text(kind + "\n")


def test_verbs_device_and_gid_found_from_the_data_address(tmp_path):
    """The GID table as rdma_rxe shows it in the VM tier (fe80 link-local, then the IPv4-mapped address)."""
    host = HostPaths(str(tmp_path))
    with pytest.raises(rdma.RdmaError, match="no RDMA device"):
        rdmapair.find_setup(host, "10.9.0.3")
    (tmp_path / "proc").mkdir()
    _device(tmp_path, "rxe_a", "Ethernet", [("fe80:0000:0000:0000:4c2a:6fff:fe11:2233", "IB/RoCE v1"),
                                            ("fe80:0000:0000:0000:4c2a:6fff:fe11:2233", "RoCE v2"),
                                            ("0000:0000:0000:0000:0000:ffff:0a09:0002", "IB/RoCE v1"),
                                            ("0000:0000:0000:0000:0000:ffff:0a09:0002", "RoCE v2")])
    _device(tmp_path, "rxe_b", "Ethernet", [("0000:0000:0000:0000:0000:ffff:0a09:0003", "IB/RoCE v1"),
                                            ("0000:0000:0000:0000:0000:ffff:0a09:0003", "RoCE v2")])
    setup = rdmapair.find_setup(host, "10.9.0.3")
    assert (setup.device, setup.gid_index) == ("rxe_b", 1) and setup.describe() == "rxe_b port 1 GID 1"
    assert rdmapair.find_setup(host, "10.9.0.2").gid_index == 3
    assert rdmapair.find_setup(host, "10.9.0.2", device="rxe_b", gid_index=0).gid_index == 0  # given wins
    with pytest.raises(rdma.RdmaError, match="no RoCE v2 GID for 10.9.0.9 on rxe_a, rxe_b"):
        rdmapair.find_setup(host, "10.9.0.9")
    with pytest.raises(rdma.RdmaError, match="no RDMA device 'mlx5_0'"):
        rdmapair.find_setup(host, "10.9.0.2", device="mlx5_0")
    _device(tmp_path, "mlx5_0", "InfiniBand", [("fe80:0000:0000:0000:0002:c903:0001:0001", "IB/RoCE v1")])
    assert rdmapair.find_setup(host, "ib-host-7", device="mlx5_0").gid_index is None  # InfiniBand: LID


def test_indexed_job_names_its_pods_from_the_headless_service():
    fqdn = "train-2.train-svc.ml.svc.cluster.local"
    plan = discover.from_indexed_job("2", "train-2", fqdn, 4)
    assert plan.hosts[0] == "train-0.train-svc.ml.svc.cluster.local" and len(plan.hosts) == 4
    assert plan.hosts[3] == "train-3.train-svc.ml.svc.cluster.local" and not plan.is_coordinator
    assert discover.from_indexed_job("0", "my-job-0", "my-job-0.s.ns.svc", 2).is_coordinator
    with pytest.raises(DiscoveryError, match="headless service"):
        discover.from_indexed_job("1", "train-1", "train-1", 4)  # no subdomain: the names do not resolve
    with pytest.raises(DiscoveryError, match="not an Indexed Job pod"):
        discover.from_indexed_job("1", "worker-abc12", fqdn, 4)
    with pytest.raises(DiscoveryError, match="below the job's 4 pods"):
        discover.from_indexed_job("4", "train-4", "train-4.s", 4)
