"""The measured rows of deploy/README.md's "Privileges" table: what `nodehealth check` says on a fixture
machine when one of the DaemonSet's host paths is missing or unreadable. If one of these changes (a
check that learns to say `unknown` instead of being skipped), change the table with it."""
from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

import pytest
from conftest import live_root, machine

KERNEL_LOG_CHECKS = {"xid", "kernel", "crashes", "link_events", "memory_errors", "nic_health", "storage_errors"}


def check(root, tmp_path, *args: str) -> tuple[int, dict | str]:
    """`nodehealth check` of `root`; args before "--only" are a prefix to the command (setpriv ...)."""
    prefix, options = (args[:args.index("--only")], args[args.index("--only"):]) if "--only" in args else (args, ())
    state = tmp_path / "state"
    state.mkdir(exist_ok=True)
    done = subprocess.run([*prefix, sys.executable, "-m", "nodehealth.cli", "check", "--root", str(root),
                           "--state-dir", str(state), "--json", *options], capture_output=True, text=True,
                          timeout=120)
    try:
        return done.returncode, json.loads(done.stdout)
    except ValueError:
        return done.returncode, done.stderr


def copy_without(name: str, tmp_path, rel: str | None):
    root = tmp_path / "machine"
    shutil.copytree(machine(name), root, symlinks=True)
    if rel is not None:
        path = root / rel
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    return root


def unsupported(report: dict) -> set[str]:
    return {c["name"] for c in report["collectors"] if not c["supported"]}


def test_without_host_proc_the_agent_refuses_to_start(tmp_path):
    code, out = check(copy_without("h100-8x-cx7", tmp_path, "proc"), tmp_path)
    assert code == 2 and "no proc/ directory there" in out


SYSFS_COLLECTORS = {"pcie", "topology", "infiniband", "edac", "nvml"}


def test_on_a_live_host_without_its_sys_mount_the_sysfs_collectors_say_unknown(tmp_path):
    """The DaemonSet without its /sys mount: the host still has its PCI devices, NICs and memory
    controllers, so their checks cannot judge (unknown), rather than being skipped as absent."""
    with live_root(tmp_path / "blind") as root:
        _, report = check(root, tmp_path / "blind")
    with live_root(tmp_path / "seeing", sysfs=True) as root:
        _, full = check(root, tmp_path / "seeing")
    failed = {c["name"]: c["error"] for c in report["collectors"] if c["supported"] and not c["success"]}
    assert set(failed) >= SYSFS_COLLECTORS - {"nvml"}, report["collectors"]
    assert all("no sysfs mounted at" in failed[name] for name in SYSFS_COLLECTORS - {"nvml"})
    assert report["status"] == "unknown"
    assert {("pcie", "CollectorFailed"), ("edac", "CollectorFailed")} <= {
        (f["check"], f["reason"]) for f in report["findings"] if f["severity"] == "unknown"}
    assert {c["name"] for c in full["collectors"] if c["success"]} >= {"pcie", "topology"}


def test_a_fixture_machine_recorded_without_sys_skips_the_sysfs_collectors(tmp_path):
    _, full = check(copy_without("host-faults", tmp_path / "a", None), tmp_path / "a")
    code, report = check(copy_without("host-faults", tmp_path / "b", "sys"), tmp_path / "b")
    assert {"pcie", "edac"} <= unsupported(report) - unsupported(full)
    assert "edac" in {f["check"] for f in full["findings"]} - {f["check"] for f in report["findings"]}
    assert not [f for f in report["findings"] if f["severity"] == "unknown"]


def test_without_the_kmsg_device_a_node_with_an_xid_reads_healthy(tmp_path):
    _, full = check(copy_without("h100-8x-cx7", tmp_path / "a", None), tmp_path / "a")
    assert full["status"] == "unhealthy" and "Xid79FallenOffBus" in {f["reason"] for f in full["findings"]}
    code, report = check(copy_without("h100-8x-cx7", tmp_path / "b", "dev/kmsg"), tmp_path / "b")
    assert (code, report["status"]) == (0, "healthy") and "kmsg" in unsupported(report)


def test_with_the_kmsg_device_refused_the_kernel_log_checks_say_unknown():
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("runs the check as user nobody through setpriv, which needs root")
    with tempfile.TemporaryDirectory() as tmp:  # pytest's tmp_path is under a directory only root may enter
        tmp_path = pathlib.Path(tmp)
        root = copy_without("h100-8x-cx7", tmp_path, None)
        (tmp_path / "state").mkdir()
        for where, _, _ in os.walk(tmp_path):
            os.chmod(where, 0o777)
        os.chmod(root / "dev" / "kmsg", 0o600)  # root's alone, as /dev/kmsg is to a process the kernel refuses
        code, report = check(root, tmp_path, "setpriv", "--reuid=65534", "--regid=65534", "--clear-groups")
    assert (code, report["status"]) == (2, "unknown"), report
    [finding] = [f for f in report["findings"] if f["severity"] == "unknown"]
    assert (finding["check"], finding["reason"]) == ("kmsg", "KernelLogUnreadable")  # one, not one per check
    assert set(finding["evidence"]["checks"]) == KERNEL_LOG_CHECKS
    assert "Permission denied" in finding["message"] and "kernel-log-privileged" in finding["message"]


def test_on_a_live_host_without_a_kernel_log_the_node_gets_one_finding_naming_the_fix(tmp_path):
    """The DaemonSet without /dev/kmsg and without the journal's directories: the host has a kernel log the
    agent cannot see, so the node is unknown with one finding that says how to fix it (before, the
    kernel-log checks were skipped and a node with an Xid in its log read healthy)."""
    with live_root(tmp_path / "host") as root:
        code, report = check(root, tmp_path, "--only", "kmsg")
    assert (code, report["status"]) == (2, "unknown"), report
    [finding] = report["findings"]
    assert (finding["check"], finding["reason"]) == ("kmsg", "KernelLogUnreadable")
    assert "/var/log" in finding["message"] and "no journal holds kernel records of this boot" in finding["message"]


def test_with_dev_kmsg_refused_and_the_journal_mounted_the_xid_is_seen(tmp_path):
    """The base DaemonSet on containerd with runc: /dev/kmsg refused to the agent (root without
    capabilities), the host's journal mounted read-only. The journal files are root's (0640), readable
    by uid 0 without any capability; the Xid of h100-8x-cx7's log is seen."""
    from journal_files import kmsg_entries, machine_journal, write_journal

    from nodehealth.collectors import kmsg
    from nodehealth.host import HostPaths, boot_id
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("drops capabilities through setpriv, which needs root")
    root = copy_without("h100-8x-cx7", tmp_path, None)
    host = HostPaths(str(root))
    os.chmod(root / "dev" / "kmsg", 0)  # refused to root without CAP_DAC_OVERRIDE, as the device cgroup refuses it
    no_caps = ("setpriv", "--bounding-set=-all", "--inh-caps=-all")
    code, blind = check(root, tmp_path, *no_caps)
    assert [f["reason"] for f in blind["findings"] if f["severity"] == "unknown"] == ["KernelLogUnreadable"]
    journal = write_journal(machine_journal(str(root)), kmsg_entries(str(root / "dev" / "kmsg"), boot_id(host),
                                                                      kmsg.boot_time(host)))
    assert os.stat(journal).st_mode & 0o777 == 0o640
    code, report = check(root, tmp_path, *no_caps)
    assert (code, report["status"]) == (1, "unhealthy"), report
    assert "Xid79FallenOffBus" in {f["reason"] for f in report["findings"]}
    assert not [f for f in report["findings"] if f["severity"] == "unknown"]


def test_without_sys_ptrace_a_mount_point_under_a_root_process_root_is_refused():
    """The mounts check stats the host's mount points through /host/proc/1/root (collectors/mounts.py):
    the kernel refuses that to a root process without SYS_PTRACE when the target holds capabilities
    it lacks, before the stat reaches the mount. The base keeps SYS_PTRACE for it."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("drops capabilities through setpriv, which needs root")
    target = subprocess.Popen(["sleep", "60"])
    try:
        path = f"/proc/{target.pid}/root/"
        results = {}
        for caps in ("-all", "-all,+sys_ptrace"):
            done = subprocess.run(["setpriv", f"--bounding-set={caps}", "--inh-caps=-all", sys.executable, "-c",
                                   f"import os; os.stat({path!r}); print('ok')"], capture_output=True, text=True,
                                  timeout=60)
            results[caps] = "ok" if done.stdout.strip() == "ok" else done.stderr.strip().splitlines()[-1]
    finally:
        target.kill()
        target.wait()
    assert results["-all"].startswith("PermissionError"), results
    assert results["-all,+sys_ptrace"] == "ok", results
