"""The agent image's contents run `nodehealth check`: a root filesystem of the image's Debian packages
(deploy/image/packages), built by mmdebstrap without any container runtime or registry, gets our wheels
through the image's own install steps (deploy/image/install.sh), then runs, chrooted, what the DaemonSet
runs: a check of a fixture machine with the config directory, pyverbs, py-spy. Nothing is cached between runs:
the build (about a minute for the packages and one for the wheels) starts as the session does and runs
beside the other tests (tests/image_rootfs.py)."""
from __future__ import annotations

import json
import os
import pathlib
import shutil

import image_rootfs
import pytest
from conftest import machine, unavailable
from image_rootfs import ROOT, chroot

pytestmark = pytest.mark.image


@pytest.fixture(scope="module")
def rootfs(request):
    """The root filesystem the session started building as it began (tests/image_rootfs.py)."""
    why = image_rootfs.missing()
    if why == image_rootfs.OTHER_PYTHON:
        pytest.skip(why)
    if why:
        unavailable(why)
    return pathlib.Path(request.config.stash[image_rootfs.BUILD].wait())


def test_the_image_checks_a_machine_with_the_config_directory_the_daemonset_mounts(rootfs):
    shutil.copytree(machine("h100-8x-cx7"), rootfs / "machine", symlinks=True)
    shutil.copytree(os.path.join(ROOT, "deploy", "config"), rootfs / "config.d")
    (rootfs / "config.d" / "90-site.yaml").write_text("kube:\n  dry_run: false\n")
    done = chroot(rootfs, "nodehealth", "check", "--root", "/machine", "--config", "/config.d",
                  "--state-dir", "/tmp/state", "--json")
    assert done.returncode == 1, done.stderr  # unhealthy: the fixture's kernel log has an Xid 79
    assert done.stdout, done.stderr
    report = json.loads(done.stdout)
    assert "Xid79FallenOffBus" in {f["reason"] for f in report["findings"]}
    assert {c["name"] for c in report["collectors"] if c["success"]} >= {"kmsg", "infiniband", "pcie", "limits"}


def test_the_image_reads_the_kernel_log_from_a_journal_as_the_daemonset_mounts_it(rootfs):
    """The base DaemonSet's case: no /dev/kmsg it may open, the host's journal under /host/var/log. The
    image's python3-systemd (libsystemd) reads a journal file written by systemd-journal-remote."""
    from journal_files import kmsg_entries, machine_journal, write_journal

    from nodehealth.collectors import kmsg
    from nodehealth.host import HostPaths, boot_id
    root = rootfs / "journal-machine"
    shutil.copytree(machine("h100-8x-cx7"), root, symlinks=True)
    host = HostPaths(str(root))
    write_journal(machine_journal(str(root)), kmsg_entries(str(root / "dev" / "kmsg"), boot_id(host),
                                                          kmsg.boot_time(host)))
    (root / "dev" / "kmsg").unlink()
    done = chroot(rootfs, "nodehealth", "check", "--root", "/journal-machine", "--state-dir", "/tmp/state", "--json",
                  "--only", "kmsg")
    assert done.returncode == 1, done.stderr
    report = json.loads(done.stdout)
    assert "Xid79FallenOffBus" in {f["reason"] for f in report["findings"]}, report["findings"]


def test_the_image_carries_pyverbs_for_rdma_and_py_spy_for_hangs(rootfs):
    # rdma-bw loads Debian's pyverbs from its dist-packages (nodehealth/rdma.py); here as it would.
    # (Its extension modules link libibverbs and librdmacm: importing them loads both.)
    verbs = chroot(rootfs, "python3", "-c", "import sys; sys.path.append('/usr/lib/python3/dist-packages'); "
                   "from pyverbs import addr, cq, device, mr, pd, qp, wr; print('ok')")
    assert verbs.returncode == 0 and verbs.stdout.strip() == "ok", verbs.stderr
    spy = chroot(rootfs, "py-spy", "--version")
    assert spy.returncode == 0 and spy.stdout.startswith("py-spy"), spy.stderr
    for module in ("kubernetes", "grpc", "google.protobuf", "pynvml", "yaml", "numpy"):
        imported = chroot(rootfs, "python3", "-c", f"import {module}")
        assert imported.returncode == 0, (module, imported.stderr)
    # What the Dockerfile installs is what this test installed.
    with open(os.path.join(ROOT, "Dockerfile")) as f:
        dockerfile = f.read()
    for step in ("deploy/image/packages", "deploy/image/install.sh", "wheels.sh python3 . /wheels",
                 "ENV PATH=/opt/nodehealth/bin:$PATH"):
        assert step in dockerfile, step
