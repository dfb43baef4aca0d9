"""The benchmarks in CI, only as a smoke: tiny sizes, each script run to its end and its figures printed.
Nothing here is timed: the figures go to benchmarks/RESULTS.md, measured side by side on purpose."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from conftest import require_tool

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_daemon_vs_node_exporter_runs_both_side_by_side():
    """On the moving copy of the tree, which takes every path the fixture as recorded takes."""
    binary = require_tool("prometheus-node-exporter")
    require_tool("py-spy")  # names the daemon's threads
    run = subprocess.run([sys.executable, "benchmarks/daemon_vs_node_exporter.py", "--rounds", "2", "--seconds", "1",
                          "--warmup", "1", "--moving", "--node-exporter", binary],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    version = re.search(r"^node_exporter (\d+\.\d+\.\d+) +CPU +[\d.]+ ms/s", run.stdout, re.M).group(1)
    assert int(re.search(r"^nodehealth +CPU .* passes (\d+)$", run.stdout, re.M).group(1)) >= 2, run.stdout
    assert re.search(rf"^nodehealth / node_exporter {re.escape(version)}: [\d.]+x over 2 s", run.stdout, re.M), \
        run.stdout
    assert re.search(r"^nodehealth RSS [\d.]+ MiB max", run.stdout, re.M), run.stdout
    # the whole process by thread: the passes', the collectors' and the listener's
    threads = re.search(r"^nodehealth by thread, ms/s \(runs/s\) from schedstat: (.*);", run.stdout, re.M).group(1)
    assert {"passes", "collectors", "http"} <= {part.rsplit(" ", 2)[0] for part in threads.split(", ")}


def test_daemon_vs_node_exporter_names_a_node_exporter_that_is_not_a_program(tmp_path):
    run = subprocess.run([sys.executable, "benchmarks/daemon_vs_node_exporter.py", "--node-exporter",
                          str(tmp_path / "absent")], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert run.returncode == 1
    assert run.stderr.strip() == f"not an executable: {tmp_path / 'absent'}"


def test_debian_node_exporter_unpacks_the_suites_release(tmp_path):
    """The script picks prometheus-node-exporter's stanza out of the suite's index (not a neighbour's) and
    unpacks that package; a mirror of one suite on disk stands in for deb.debian.org."""
    for tool in ("dpkg-deb", "curl", "xz"):
        require_tool(tool)
    mirror = tmp_path / "mirror"
    package = tmp_path / "package"
    (package / "DEBIAN").mkdir(parents=True)
    (package / "DEBIAN" / "control").write_text(
        "Package: prometheus-node-exporter\nVersion: 1.9.0-1\nArchitecture: all\nMaintainer: t <t@t>\n"
        "Description: t\n")
    (package / "usr" / "bin").mkdir(parents=True)
    program = package / "usr" / "bin" / "prometheus-node-exporter"
    program.write_text("#!/bin/sh\necho 'node_exporter, version 1.9.0 (branch: debian/sid)'\n")
    program.chmod(0o755)
    pool = mirror / "pool" / "main" / "p"
    pool.mkdir(parents=True)
    subprocess.run(["dpkg-deb", "--root-owner-group", "-b", str(package), str(pool / "ne_1.9.0_all.deb")],
                   check=True, capture_output=True)
    arch = subprocess.run(["dpkg", "--print-architecture"], capture_output=True, text=True, check=True).stdout.strip()
    index = mirror / "dists" / "trixie" / "main" / f"binary-{arch}"
    index.mkdir(parents=True)
    (index / "Packages").write_text(
        "Package: prometheus-node-exporter-collectors\nFilename: pool/main/p/collectors_0.0.4_all.deb\n\n"
        "Package: prometheus-node-exporter\nVersion: 1.9.0-1\nFilename: pool/main/p/ne_1.9.0_all.deb\n\n")
    subprocess.run(["xz", str(index / "Packages")], check=True)
    out = tmp_path / "unpacked"
    run = subprocess.run(["bash", "benchmarks/debian_node_exporter.sh", "trixie", str(out)], cwd=ROOT,
                         capture_output=True, text=True, timeout=60,
                         env={**os.environ, "DEBIAN_MIRROR": f"file://{mirror}"})
    assert run.returncode == 0, run.stderr
    binary = run.stdout.strip()
    assert binary == str(out / "root" / "usr" / "bin" / "prometheus-node-exporter")
    said = subprocess.run([binary, "--version"], capture_output=True, text=True, check=True).stdout
    assert "version 1.9.0" in said
    missing = subprocess.run(["bash", "benchmarks/debian_node_exporter.sh", "forky", str(tmp_path / "none")],
                             cwd=ROOT, capture_output=True, text=True, timeout=60,
                             env={**os.environ, "DEBIAN_MIRROR": f"file://{mirror}"})
    assert missing.returncode != 0  # no such suite on the mirror: an error, not an empty path


def test_daemon_parts_times_every_part():
    run = subprocess.run([sys.executable, "benchmarks/daemon_parts.py", "--rounds", "2", "--spacing", "0"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    parts = dict(re.findall(r"^  (.+?) +([\d.]+) ms$", run.stdout, re.M))
    assert {"collect infiniband", "collect infiniband, nothing kept", "pass (the pass thread's own part)",
            "render of every family", "scrape: the /metrics body"} <= set(parts), run.stdout


def test_daemon_instructions_runs_every_part():
    """What valgrind runs, without it (counting takes a minute a part): each part to its end."""
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    import daemon_instructions
    for part in daemon_instructions.PARTS:
        run = subprocess.run([sys.executable, "benchmarks/daemon_instructions.py", "--inside", part, "1"], cwd=ROOT,
                             capture_output=True, text=True, timeout=60)
        assert run.returncode == 0, (part, run.stderr)
    run = subprocess.run([sys.executable, "benchmarks/daemon_instructions.py", "--inside", "no such part", "1"],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert run.returncode != 0 and "no part 'no such part'" in run.stderr


@pytest.mark.parametrize("defer", [[], ["--defer-accept"]])
def test_the_pingmesh_tcp_floor_runs(defer):
    run = subprocess.run([sys.executable, "benchmarks/pingmesh_tcp_floor.py", "--seconds", "1", "--tick", "0.25",
                          *defer], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert re.search(r"^(deferred )?\d+ connects/s on loopback in 0.25 s ticks: [\d.]+ ms/s of CPU", run.stdout,
                     re.M), run.stdout
    assert run.stdout.startswith("deferred ") == bool(defer)


def test_the_pingmesh_grpc_floor_runs():
    run = subprocess.run([sys.executable, "benchmarks/pingmesh_grpc_floor.py", "--seconds", "1", "--rate", "10",
                          "--peers", "3"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert re.search(r"^10 of 10 Pings answered, [\d.]+ a second, .*: [\d.]+ ms/s of CPU", run.stdout, re.M), run.stdout
