"""Whole machines with broken sources: the broken collector fails, every other one still reports.

A FIFO with no writer (a read that would block), a device that vanished between listing and
reading, and a file the process may not read (EACCES) each cost only their own collector.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

import pytest
from conftest import machine


def copy(tmp_path, name: str):
    root = tmp_path / name
    shutil.copytree(machine(name), root, symlinks=True)
    return root


def check(root, *prefix: str) -> tuple[int, dict, float]:
    t0 = time.monotonic()
    result = subprocess.run([*prefix, sys.executable, "-m", "nodehealth.cli", "check", "--json", "--root",
                             str(root), "--state-dir", str(root / "state")],
                            capture_output=True, text=True, timeout=60)
    return result.returncode, json.loads(result.stdout), time.monotonic() - t0


def collectors(doc) -> dict:
    return {c["name"]: c for c in doc["collectors"]}


def test_a_fifo_with_no_writer_fails_its_collector_without_blocking(tmp_path):
    root = copy(tmp_path, "plain-host")
    os.unlink(root / "proc" / "buddyinfo")
    os.mkfifo(root / "proc" / "buddyinfo")
    code, doc, elapsed = check(root)
    assert elapsed < 10
    by_name = collectors(doc)
    assert not by_name["buddyinfo"]["success"] and "buddyinfo" in by_name["buddyinfo"]["error"]
    assert all(c["success"] for n, c in by_name.items() if n != "buddyinfo" and c["supported"])
    assert code == 2 and doc["status"] == "unknown"
    assert [(f["check"], f["severity"]) for f in doc["findings"]] == [("memory", "unknown")]


def test_a_vanished_infiniband_device_does_not_stop_the_pass(tmp_path):
    root = copy(tmp_path, "h100-8x-cx7")
    device = root / "sys" / "class" / "infiniband" / "mlx5_9"
    shutil.rmtree(device)
    os.symlink("../../devices/pci0000:00/gone", device)  # listed, but nothing behind it any more
    code, doc, _ = check(root)
    by_name = collectors(doc)
    assert all(c["success"] for c in by_name.values() if c["supported"]), by_name
    assert code == 1  # the node's own faults still show


def test_an_unreadable_file_fails_its_collector_only(tmp_path):
    """Root reads anything, so drop the capabilities that let it ignore file modes."""
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("setpriv (util-linux) is not installed")
    root = copy(tmp_path, "h100-8x-cx7")
    os.chmod(root / "proc" / "modules", 0)
    prefix = [setpriv, "--bounding-set=-dac_override,-dac_read_search",
              "--inh-caps=-dac_override,-dac_read_search"] if os.geteuid() == 0 else []
    code, doc, _ = check(root, *prefix)
    by_name = collectors(doc)
    assert not by_name["modules"]["success"] and "Permission denied" in by_name["modules"]["error"]
    assert by_name["infiniband"]["success"] and by_name["kmsg"]["success"]
    assert ("modules", "unknown") in [(f["check"], f["severity"]) for f in doc["findings"]]
    assert code == 1  # unknown for modules, but the fatal Xids still make the node unhealthy


@pytest.mark.parametrize("garbage", [b"", b"\x00\xff" * 100, b"Node 0, zone Normal 1 2 x\n", b"Node\n" * 10000])
def test_garbage_in_procfs_is_a_clear_error(tmp_path, garbage):
    root = copy(tmp_path, "plain-host")
    (root / "proc" / "buddyinfo").write_bytes(garbage)
    code, doc, _ = check(root)
    assert code == 2 and not collectors(doc)["buddyinfo"]["success"]
    assert collectors(doc)["buddyinfo"]["error"]
