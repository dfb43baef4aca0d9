"""The systemd unit (deploy/systemd/nodehealth.service): systemd-analyze verify accepts it, its hardening is
there, each capability it keeps is justified in a comment and needed (shown by running without it),
and the documented install command installs this very file."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time

import pytest
from conftest import HERE, free_port, http_get, require_tool

from nodehealth.config import DAEMON_DEFAULTS

ROOT = os.path.dirname(HERE)
UNIT = os.path.join(ROOT, "deploy", "systemd", "nodehealth.service")
INSTALLED = "/opt/nodehealth/bin/nodehealth"  # the path docs/slurm.md installs to
NODEHEALTH = os.path.join(os.path.dirname(sys.executable), "nodehealth")  # this venv's command


def unit_text() -> str:
    with open(UNIT, encoding="utf-8") as f:
        return f.read()


def settings(text: str) -> dict[str, str]:
    """Key=value lines of the unit (no key is repeated in ours)."""
    out = {}
    for line in text.splitlines():
        m = re.match(r"([A-Za-z]+)=(.*)$", line)
        if m:
            assert m.group(1) not in out, f"{m.group(1)} twice"
            out[m.group(1)] = m.group(2)
    return out


def verify(text: str, tmp_path) -> subprocess.CompletedProcess:
    """systemd-analyze verify on the unit, with its ExecStart pointing at this venv's command (verify
    checks that the program exists, and /opt/nodehealth is not installed on a test machine)."""
    analyze = require_tool("systemd-analyze")
    assert os.access(NODEHEALTH, os.X_OK), NODEHEALTH
    path = tmp_path / "nodehealth.service"
    path.write_text(text.replace(INSTALLED, NODEHEALTH))
    return subprocess.run([analyze, "verify", "--man=no", str(path)], capture_output=True, text=True, timeout=120)


def test_systemd_analyze_verify_accepts_the_unit_without_a_word(tmp_path):
    done = verify(unit_text(), tmp_path)
    assert (done.returncode, done.stdout + done.stderr) == (0, "")


def test_verify_would_see_a_mistake(tmp_path):
    """The check above can fail: a misspelt key is said, and a program that is not there fails."""
    done = verify(unit_text().replace("ProtectSystem=strict", "ProtectSytem=strict"), tmp_path)
    assert "Unknown key name 'ProtectSytem'" in done.stderr or "Unknown key 'ProtectSytem'" in done.stderr, done.stderr
    done = verify(unit_text().replace(INSTALLED, "/nonexistent/nodehealth"), tmp_path)
    assert done.returncode != 0 and "/nonexistent/nodehealth" in done.stderr


def test_the_unit_is_hardened_and_each_capability_is_justified():
    text = unit_text()
    s = settings(text)
    assert s["NoNewPrivileges"] == "yes" and s["ProtectSystem"] == "strict"
    assert s["StateDirectory"] == "nodehealth" and DAEMON_DEFAULTS["state_dir"] == "/var/lib/nodehealth"
    assert s["ExecStart"].startswith(INSTALLED + " daemon")
    for key in ("ProtectHome", "ProtectKernelTunables", "ProtectKernelModules", "ProtectControlGroups",
                "RestrictSUIDSGID", "PrivateTmp", "RestrictAddressFamilies", "LockPersonality"):
        assert key in s, key
    assert "ProtectKernelLogs" not in s and "PrivateDevices" not in s  # they hide /dev/kmsg and the GPUs
    caps = s["CapabilityBoundingSet"].split()
    assert caps and s["AmbientCapabilities"] == ""
    for cap in caps:
        assert re.search(rf"^# {cap}: \S", text, re.M), f"{cap} has no comment saying why"


def test_the_documented_install_command_installs_this_file():
    with open(os.path.join(ROOT, "docs", "slurm.md"), encoding="utf-8") as f:
        docs = f.read()
    assert "install -m 0644 deploy/systemd/nodehealth.service /etc/systemd/system/nodehealth.service" in docs
    assert "install -m 0644 deploy/systemd/nodehealth.service /etc/systemd/system/nodehealth.service" in unit_text()


def daemon_with_caps(caps: list[str], tmp_path, name: str) -> dict:
    """`nodehealth daemon` on this host with only `caps` (as the unit's bounding set leaves root), no new
    privileges; its kernel-log follower's metric once the first pass is done."""
    setpriv = require_tool("setpriv")
    bounding = ",".join(["-all", *(f"+{c.lower().removeprefix('cap_')}" for c in caps)])
    port = free_port()
    proc = subprocess.Popen([setpriv, "--no-new-privs", f"--bounding-set={bounding}", "--inh-caps=-all",
                             NODEHEALTH, "daemon", "--state-dir", str(tmp_path / name), "--listen",
                             f"127.0.0.1:{port}", "--interval", "30", "--only", "kernel,limits,memlock"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert proc.poll() is None, proc.stdout.read()
            try:
                code, body = http_get(f"http://127.0.0.1:{port}/metrics", timeout=2.0)
            except OSError:
                code, body = 0, b""
            text = body.decode()
            if code == 200 and "nodehealth_daemon_passes_total" in text:
                up = re.search(r"^nodehealth_kernel_log_follower_up (\d)", text, re.M)
                report = json.loads(http_get(f"http://127.0.0.1:{port}/v1/report")[1])
                return {"follower_up": up and up.group(1), "report": report}
            time.sleep(0.1)
        raise AssertionError("the daemon did not serve its first pass")
    finally:
        proc.terminate()
        proc.wait(20)


def test_the_units_capabilities_are_enough_and_cap_syslog_is_needed(tmp_path):
    """Where kernel.dmesg_restrict=1, the daemon with the unit's capabilities follows the kernel log;
    without CAP_SYSLOG it cannot, and says so in one unknown KernelLogUnreadable finding."""
    if os.geteuid() != 0:
        pytest.skip("drops root's capabilities through setpriv, which needs root")
    with open("/proc/sys/kernel/dmesg_restrict") as f:
        if f.read().strip() != "1":
            pytest.skip("kernel.dmesg_restrict is 0 here: anyone may read the kernel log")
    if not os.path.exists("/dev/kmsg"):
        pytest.skip("no /dev/kmsg on this machine")
    caps = settings(unit_text())["CapabilityBoundingSet"].split()
    full = daemon_with_caps(caps, tmp_path, "full")
    assert full["follower_up"] == "1", full
    assert not [f for f in full["report"]["findings"] if f["check"] == "kernel" and f["severity"] == "unknown"]
    less = daemon_with_caps([c for c in caps if c != "CAP_SYSLOG"], tmp_path, "less")
    assert {(f["reason"], f["severity"]) for f in less["report"]["findings"]} >= {("KernelLogUnreadable", "unknown")}, \
        less


def test_cap_sys_ptrace_and_dac_read_search_let_the_memlock_scan_see_another_users_processes(tmp_path):
    """The scan reads every process's fd links; another user's need both capabilities (the directory is
    that user's, mode 0500; each link needs ptrace access). A procfs of one entry, a link to that
    user's process, keeps the rest of this machine out of the count."""
    if os.geteuid() != 0:
        pytest.skip("drops root's capabilities through setpriv, which needs root")
    setpriv = require_tool("setpriv")
    other = subprocess.Popen([setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", "sleep", "120"])
    procfs = tmp_path / "proc"
    procfs.mkdir()
    os.symlink(f"/proc/{other.pid}", procfs / str(other.pid))
    scan = ("from nodehealth.collectors import limits\nfrom nodehealth.host import HostPaths\n"
            f"print(limits.scan_rdma_processes(HostPaths(procfs={str(procfs)!r}), 10, 1000)[1])")
    caps = settings(unit_text())["CapabilityBoundingSet"].split()
    tries = {"the unit's": caps, **{f"without {c}": [k for k in caps if k != c]
                                    for c in ("CAP_SYS_PTRACE", "CAP_DAC_READ_SEARCH")}}
    try:
        unreadable = {}
        for name, kept in tries.items():
            bounding = ",".join(["-all", *(f"+{c.lower().removeprefix('cap_')}" for c in kept)])
            done = subprocess.run([setpriv, "--no-new-privs", f"--bounding-set={bounding}", "--inh-caps=-all",
                                   sys.executable, "-c", scan], capture_output=True, text=True, timeout=120)
            assert done.returncode == 0, done.stderr
            unreadable[name] = int(done.stdout)
    finally:
        other.kill()
        other.wait()
    assert unreadable == {"the unit's": 0, "without CAP_SYS_PTRACE": 1, "without CAP_DAC_READ_SEARCH": 1}


def test_the_tool_is_installed_where_ci_runs():
    """.ci/run installs systemd (for systemd-analyze) when it is missing, as the README's command does."""
    with open(os.path.join(ROOT, ".ci", "run"), encoding="utf-8") as f:
        assert "command -v systemd-analyze >/dev/null 2>&1 || need+=(systemd)" in f.read()
    assert shutil.which("systemd-analyze") or os.environ.get("CI") != "true"
