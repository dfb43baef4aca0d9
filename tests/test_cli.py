import json
import os
import re
import shutil
import subprocess
import sys

import pytest
import yaml
from conftest import machine

from nodehealth import cli, config, node_pass, registry
from nodehealth.model import CollectorResult, Finding, Report, Severity, Status
from nodehealth.report import to_table


def test_select_by_check_and_collector_names():
    collectors, checks = node_pass.select(["modules"], [])
    assert [m.NAME for m in collectors] == ["modules"] and [c.NAME for c in checks] == ["modules"]
    collectors, checks = node_pass.select([], ["modules"])
    assert "modules" not in [m.NAME for m in collectors] and "modules" not in [c.NAME for c in checks]
    all_collectors, all_checks = node_pass.select([], [])
    assert len(all_collectors) == len(registry.COLLECTORS) and len(all_checks) == len(registry.CHECKS)


def test_unknown_name_is_a_usage_error_with_exit_2(capsys):
    with pytest.raises(config.UsageError, match="unknown check or collector: nope"):
        node_pass.select(["nope"], [])
    assert cli.main(["check", "--root", "/nonexistent", "--only", "nope"]) == 2
    assert "known:" in capsys.readouterr().err


def test_bad_config_exits_2(tmp_path, capsys):
    bad = tmp_path / "c.yaml"
    bad.write_text("policy: {raise_after_passes: x}\n")
    assert cli.main(["check", "--config", str(bad)]) == 2
    assert "policy.raise_after_passes" in capsys.readouterr().err


def test_version(capsys):
    assert cli.main(["version"]) == 0
    assert capsys.readouterr().out.startswith("nodehealth ")


def test_check_on_this_host_gives_a_json_document(capsys):
    code = cli.main(["check", "--json", "--state-dir", "/nonexistent-state"])
    doc = json.loads(capsys.readouterr().out)
    assert code == {"healthy": 0, "unhealthy": 1, "unknown": 2}[doc["status"]]
    assert set(doc) >= {"node", "status", "findings", "collectors"}
    assert {c["name"] for c in doc["collectors"]} == {m.NAME for m in registry.COLLECTORS}
    for c in doc["collectors"]:
        assert set(c) >= {"name", "success", "duration_seconds", "error"}


@pytest.mark.parametrize("log, reason, device, severity", [
    ("gpud/dmesg-with-xid-119.log", "Xid119GspRpcTimeout", "0000:9b:00.0", "fatal"),  # dmesg -T
    ("issues/nvsentinel-155.fallen-off-bus-multiline-no-xid.txt", "Xid79FallenOffBus", "0000:b3:00.0", "fatal"),
    ("m4-logs/jean-zay-iam06.a100.dmesg-T.hung-tasks.txt", "HungTask", "python", "degraded"),
    ("issues/ironfish-701.syslogd-wall.soft-and-hard-lockup.txt", "HardLockup", "", "fatal"),
    ("gpud/kmsg.1.log", None, None, None),  # raw kmsg records with nothing wrong in them
])
def test_post_mortem_from_a_saved_kernel_log(log, reason, device, severity, capsys):
    path = os.path.join(os.path.dirname(__file__), "fixtures", "kmsg", log)
    code = cli.main(["check", "--kernel-log", path, "--only", "kmsg", "--json"])
    doc = json.loads(capsys.readouterr().out)
    found = {(f["reason"], f["device"], f["severity"]) for f in doc["findings"]}
    if reason is None:
        assert code == 0 and found == set()
    else:
        assert code == 1 and (reason, device, severity) in found


@pytest.mark.parametrize("name", ["absent.log", "a-directory", "a-fifo"])
def test_a_kernel_log_that_cannot_be_read_is_one_usage_error(tmp_path, name, capsys):
    (tmp_path / "a-directory").mkdir()
    os.mkfifo(tmp_path / "a-fifo")  # refused at once, not waited on
    path = tmp_path / name
    code = cli.main(["check", "--kernel-log", str(path), "--only", "kmsg"])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert err.startswith(f"nodehealth: --kernel-log {path}: cannot read it: ") and err.count("\n") == 1


@pytest.mark.parametrize("data", [b"", b"\x00\x01\x02\xff" * 64])
def test_an_empty_or_binary_kernel_log_is_unknown_not_healthy(tmp_path, data, capsys):
    path = tmp_path / "kern.log"
    path.write_bytes(data)
    code = cli.main(["check", "--kernel-log", str(path), "--only", "kmsg", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 2 and doc["status"] == "unknown"
    [finding] = doc["findings"]  # one for the seven checks that read the kernel log
    assert set(finding["evidence"]["checks"]) == {"xid", "kernel", "link_events", "crashes", "memory_errors",
                                                  "storage_errors", "nic_health"}
    assert finding["severity"] == "unknown" and f"0 records recognised in {path}" in finding["message"]


def test_a_gzipped_kernel_log_is_judged(tmp_path, capsys):
    import gzip

    src = os.path.join(os.path.dirname(__file__), "fixtures", "kmsg", "gpud", "dmesg-with-xid-119.log")
    path = tmp_path / "kern.log.2.gz"
    path.write_bytes(gzip.compress(open(src, "rb").read()))
    assert cli.main(["check", "--kernel-log", str(path), "--only", "kmsg", "--json"]) == 1
    assert "Xid119GspRpcTimeout" in {f["reason"] for f in json.loads(capsys.readouterr().out)["findings"]}


@pytest.mark.parametrize("root", ["/nonexistent", "EMPTY"])
def test_a_root_that_is_no_machine_is_a_usage_error(tmp_path, root, capsys):
    root = str(tmp_path) if root == "EMPTY" else root
    assert cli.main(["check", "--root", root]) == 2
    err = capsys.readouterr().err
    assert f"--root {root}: no proc/" in err and len(err.splitlines()) == 1


@pytest.mark.parametrize("only", ["", " , "])
def test_an_empty_only_is_a_usage_error(only, capsys):
    assert cli.main(["check", "--only", only]) == 2
    assert "--only needs at least one" in capsys.readouterr().err


def test_only_a_source_this_host_lacks_says_nothing_was_checked(capsys):
    root = os.path.join(os.path.dirname(__file__), "fixtures", "machines", "plain-host")
    assert cli.main(["check", "--root", root, "--only", "infiniband"]) == 2
    out = capsys.readouterr().out
    assert "UNKNOWN" in out and "Nothing was checked" in out and "no findings" not in out
    assert cli.main(["check", "--root", root, "--only", "infiniband", "--json"]) == 2
    doc = json.loads(capsys.readouterr().out)
    assert doc["status"] == "unknown" and [f["reason"] for f in doc["findings"]] == ["NothingChecked"]


@pytest.mark.parametrize("argv", [["breaker", "reset"], ["daemon", "--kube", "--listen", "127.0.0.1:0"]])
def test_kubernetes_features_without_the_package_name_the_extra_in_one_line(argv, tmp_path, monkeypatch, capsys):
    import sys

    monkeypatch.setitem(sys.modules, "kubernetes", None)  # `import kubernetes` raises ImportError
    root = os.path.join(os.path.dirname(__file__), "fixtures", "machines", "plain-host")
    extra = ["--root", root, "--state-dir", str(tmp_path)] if argv[0] == "daemon" else []
    assert cli.main(argv + extra) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pip install 'nodehealth[k8s]'" in err


def run_check(*argv: str) -> tuple[int, str]:
    """`nodehealth check` in a process of its own, its table 120 columns wide."""
    done = subprocess.run([sys.executable, "-m", "nodehealth.cli", "check", *argv], capture_output=True, text=True,
                          timeout=120, env=dict(os.environ, COLUMNS="120"))
    return done.returncode, done.stdout + done.stderr


def judged(doc: dict) -> tuple[list[str], set[str]]:
    """The checks `check` judged in a JSON report, and the sources they read: every check whose
    collectors all ran here (the daemon's own sources never do)."""
    supported = {c["name"] for c in doc["collectors"] if c["supported"]}
    checks = [c.NAME for c in registry.CHECKS if all(n in supported for n in c.NEEDS)]
    return checks, {n for c in registry.CHECKS if c.NAME in checks for n in c.NEEDS}


def test_a_healthy_check_says_what_it_checked(capsys):
    root = machine("plain-host")
    assert cli.main(["check", "--root", root, "--json"]) == 0
    checks, sources = judged(json.loads(capsys.readouterr().out))
    assert len(checks) >= 8 and len(sources) >= 4
    code, out = run_check("--root", root)
    assert code == 0
    lines = out.splitlines()
    assert re.fullmatch(r"node \S+: HEALTHY", lines[0]) and "no findings" in lines
    skipped = len(registry.CHECKS) - len(checks)
    assert f"checked: {len(checks)} checks on {len(sources)} sources; {skipped} skipped, their source is not " \
           "here (-v lists each check)" in lines


def test_verbose_lists_each_check_with_its_source_and_verdict(capsys):
    root = machine("host-faults")
    assert cli.main(["check", "--root", root, "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    checks, _ = judged(doc)
    code, out = run_check("--root", root, "-v")
    assert code == 1
    verdicts = {}
    for line in out.splitlines():
        row = re.match(r"^(\w+) +(\w+(?:, \w+)*) +(ok|info|warning|degraded|fatal|unknown|skipped: .*)$", line)
        if row and row.group(1) in {c.NAME for c in registry.CHECKS}:
            verdicts[row.group(1)] = (row.group(2), row.group(3))
    assert set(verdicts) == {c.NAME for c in registry.CHECKS}
    for c in registry.CHECKS:
        source, verdict = verdicts[c.NAME]
        assert source == ", ".join(c.NEEDS)
        found = [f for f in doc["findings"] if f["check"] == c.NAME]
        if c.NAME not in checks:
            assert verdict.startswith("skipped: ") and not found
        elif found:
            assert verdict == max((f["severity"] for f in found), key=lambda s: Severity(s).rank)
        else:
            assert verdict == "ok"
    assert verdicts["rdma_bw"][1] == "skipped: only the daemon runs it"
    assert verdicts["nvml"][1].startswith("skipped: no NVIDIA GPUs") if "nvml" in verdicts else True


def test_the_table_shows_each_finding_s_reason(capsys):
    root = machine("nvml-h100-xid79-lost")
    assert cli.main(["check", "--root", root, "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    code, out = run_check("--root", root)
    head = next(line for line in out.splitlines() if line.startswith("STATUS"))
    assert code == 1 and head.split()[:5] == ["STATUS", "CHECK", "REASON", "DEVICE", "ACTION"]
    rows = [line.split()[:5] for line in out.splitlines() if line.split()[:1] in (["fatal"], ["degraded"])]
    assert [[f["severity"], f["check"], f["reason"], f["device"] or "-", f["action"]] for f in doc["findings"]
            if f["severity"] in ("fatal", "degraded")] == rows


def test_check_help_says_what_each_exit_code_means(capsys):
    with pytest.raises(SystemExit) as done:
        cli.main(["check", "--help"])
    out = capsys.readouterr().out
    assert done.value.code == 0
    codes = re.findall(r"^ +([0-2]) +(\S.*)$", out.split("exit codes:")[1], re.M)
    assert [c for c, _ in codes] == ["0", "1", "2"]
    assert "healthy" in codes[0][1] and "degraded or fatal" in codes[1][1] and "unknown" in codes[2][1]


def test_a_source_refused_for_want_of_privilege_is_said_once_with_a_hint(tmp_path):
    """Root reads anything, so drop the capabilities that let it ignore file modes, as a user's run has none."""
    if os.geteuid() == 0 and shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) is not installed")
    root = tmp_path / "machine"
    shutil.copytree(machine("plain-host"), root, symlinks=True)
    os.chmod(root / "dev" / "kmsg", 0)
    prefix = ["setpriv", "--bounding-set=-dac_override,-dac_read_search",
              "--inh-caps=-dac_override,-dac_read_search"] if os.geteuid() == 0 else []
    done = subprocess.run([*prefix, sys.executable, "-m", "nodehealth.cli", "check", "--root", str(root)],
                          capture_output=True, text=True, timeout=120, env=dict(os.environ, COLUMNS="120"))
    out = done.stdout
    assert done.returncode == 2 and out.splitlines()[0].endswith("UNKNOWN")
    assert out.count("Permission denied") == 1 and out.count("hint: ") == 1, out
    kernel_log_checks = sorted(c.NAME for c in registry.CHECKS if c.NEEDS == ("kmsg",))
    assert f"{len(kernel_log_checks)} checks could not judge: {', '.join(kernel_log_checks)}" in out


def test_check_list_names_every_check_with_its_source_and_what_it_finds(capsys):
    assert cli.main(["check", "--list"]) == 0
    out = capsys.readouterr().out
    flat = " ".join(out.split())
    for c in registry.CHECKS:
        assert re.search(rf"^{c.NAME} +\[{c.SUBSYSTEM}\] +reads {', '.join(c.NEEDS)}: ", out, re.M), c.NAME
        assert " ".join(c.FINDS.replace("`", "").split()) in flat
        assert " ".join(c.SOURCE.replace("`", "").split()) in flat
    assert "`" not in out


def test_config_defaults_prints_the_effective_configuration(tmp_path, capsys):
    assert cli.main(["config", "defaults"]) == 0
    printed = capsys.readouterr().out
    assert yaml.safe_load(printed) == config.defaults()
    mine = tmp_path / "mine.yaml"
    mine.write_text("daemon: {interval_seconds: 10}\nchecks: {xid: {overrides: {94: {severity: info}}}}\n")
    assert cli.main(["config", "defaults", "--config", str(mine)]) == 0
    merged = yaml.safe_load(capsys.readouterr().out)
    assert merged == config.load(str(mine)) and merged["daemon"]["interval_seconds"] == 10.0
    again = tmp_path / "printed.yaml"  # what it prints is a configuration file that loads as itself
    again.write_text(printed)
    assert config.load(str(again)) == config.defaults()


def test_config_defaults_with_a_bad_file_is_a_usage_error(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("daemon: {intervall: 1}\n")
    assert cli.main(["config", "defaults", "--config", str(bad)]) == 2
    assert "daemon.intervall: unknown setting" in capsys.readouterr().err


def test_clear_refuses_a_state_directory_that_is_not_the_daemon_s(tmp_path, capsys):
    typo = tmp_path / "nodehelth"
    assert cli.main(["clear", "--state-dir", str(typo)]) == 2
    assert not typo.exists() and f"{typo}" in capsys.readouterr().err
    empty = tmp_path / "empty"
    empty.mkdir()
    assert cli.main(["clear", "--state-dir", str(empty)]) == 2
    err = capsys.readouterr().err
    assert "state.json" in err and err.count("\n") == 1 and os.listdir(empty) == []
    (empty / "state.json").write_text("{}")
    assert cli.main(["clear", "--state-dir", str(empty), "--reason", "DIMM replaced"]) == 0
    assert "clear requested" in capsys.readouterr().out


def test_daemon_kube_without_any_credentials_says_so_and_exits_2(tmp_path):
    """No kubeconfig anywhere and no in-cluster service account: said at start, not retried for ever."""
    env = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST",
                                                             "KUBERNETES_SERVICE_PORT")}
    env["HOME"] = str(tmp_path)  # no ~/.kube/config
    done = subprocess.run([sys.executable, "-m", "nodehealth.cli", "daemon", "--kube", "--root",
                           machine("plain-host"), "--state-dir", str(tmp_path / "state"), "--listen",
                           "127.0.0.1:0"], capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith("nodehealth: --kube: ") and done.stderr.count("\n") == 1
    assert "kubeconfig" in done.stderr and "in-cluster" in done.stderr


def test_controller_without_any_credentials_says_so_and_exits_2(tmp_path):
    """The pingmesh controller needs the API server for its Lease and ConfigMaps: no credentials is said at
    start, not retried every 2 s for ever."""
    env = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST",
                                                             "KUBERNETES_SERVICE_PORT")}
    env["HOME"] = str(tmp_path)
    (tmp_path / "config.json").write_text('{"pingmesh": {"enabled": true}}')
    done = subprocess.run([sys.executable, "-m", "nodehealth.cli", "controller", "--config",
                           str(tmp_path / "config.json"), "--listen", "127.0.0.1:0"],
                          capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith("nodehealth: controller: no usable Kubernetes credentials") \
        and done.stderr.count("\n") == 1, done.stderr


@pytest.mark.parametrize("command", [["controller"], ["pingmesh", "analyze", "--bundle", "none.json"]])
def test_the_analysis_without_numpy_says_so_and_exits_2(command):
    """numpy is the `analysis` extra: a node installed without it gets one line saying what to install."""
    hide = "import sys; sys.modules['numpy'] = None; from nodehealth.cli import main; sys.exit(main(sys.argv[1:]))"
    done = subprocess.run([sys.executable, "-c", hide, *command], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == (f"nodehealth {' '.join(command[:2]) if command[0] == 'pingmesh' else command[0]}: the "
                           "pingmesh analysis needs numpy: pip install 'nodehealth[analysis]'\n")


def test_a_failed_collector_is_said_above_only_where_its_own_finding_is():
    """The engine folds a failed collector's checks into one finding under the collector's name; the table
    points at it ("... above") only when that finding is shown, not at another with the same reason."""
    failed = CollectorResult("kmsg", True, False, error="/dev/kmsg: Permission denied",
                             failed_reason="KernelLogUnreadable")
    own = Finding("kmsg", Severity.UNKNOWN, "KernelLogUnreadable", "Could not judge xid: collector kmsg failed.")
    other = Finding("journal_check", Severity.UNKNOWN, "KernelLogUnreadable", "Another source's words.")
    with_own = to_table(Report("n", Status.UNKNOWN, [own], [failed]), width=120)
    assert "could not read kmsg: KernelLogUnreadable above" in with_own
    with_other = to_table(Report("n", Status.UNKNOWN, [other], [failed]), width=120)
    assert "could not read kmsg: /dev/kmsg: Permission denied" in with_other
