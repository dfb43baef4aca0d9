import json
import os

import pytest

from nodehealth import cli, config, node_pass, registry


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


def test_kernel_log_that_cannot_be_read_is_unknown(tmp_path, capsys):
    code = cli.main(["check", "--kernel-log", str(tmp_path / "absent.log"), "--only", "kmsg", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 2 and [f["reason"] for f in doc["findings"]] == ["KernelLogUnreadable"]
    assert "absent.log" in doc["findings"][0]["message"]


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
