"""The pingmesh benchmarks run, at tiny sizes: a smoke test that they still work, never a timing.

Their figures are benchmarks/RESULTS.md's, measured by hand at full size.
"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

BENCHMARKS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks")


def run(script: str, *args: str, timeout: float = 240) -> str:
    done = subprocess.run([sys.executable, os.path.join(BENCHMARKS, script), *args], cwd=BENCHMARKS,
                          capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_the_controller_benchmark_runs_both_forms_to_the_same_verdicts():
    out = run("pingmesh_controller.py", "--nodes", "96", "--leaf-size", "16", "--rails", "2", "--pairs", "1",
              "--cycles", "2", "--floor-every", "1")
    assert "cycle 2 json:" in out and "cycle 2 packed:" in out and "decode / floor" in out
    assert "the same verdicts: True" in out, out
    assert "verdicts packed: [('leaf'" in out  # the injected faults were found, not an empty list twice


@pytest.mark.parametrize("form", ["json", "packed"])
def test_the_localization_benchmark_runs(form):
    out = run("pingmesh_analyze.py", "--nodes", "96", "--leaf-size", "16", "--windows", "3", "--input", form)
    assert "windows analysed: 3; rejected: 0" in out and "node         gpu-00017" in out, out


def test_the_agent_benchmark_runs_with_the_controllers_fetches():
    out = run("pingmesh_agent.py", "--nodes", "2", "--rails", "1", "--seconds", "1", "--interval", "1",
              "--fetch", "both")
    assert "probe agent (packed):" in out and "the controller's fetches" in out, out


def test_the_packed_decoding_benchmark_runs_against_another_version():
    before = os.path.join(os.path.dirname(BENCHMARKS), "nodehealth", "pingmesh", "packed.py")
    out = run("packed_decode.py", "--agents", "5", "--nodes", "96", "--rails", "2", "--pairs", "1", "--rounds", "2",
              "--before", before)
    assert "5 steady answers" in out and "64 together" in out and "one at a time" in out and "before" in out, out
    assert "the floor)" in out, out
