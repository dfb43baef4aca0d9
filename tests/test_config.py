import json

import pytest

from nodehealth import config


def write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def test_defaults_cover_every_collector_and_check():
    from nodehealth import registry
    cfg = config.defaults()
    assert set(cfg["collectors"]) == {m.NAME for m in registry.COLLECTORS}
    assert set(cfg["checks"]) == {m.NAME for m in registry.CHECKS}


def test_yaml_and_json_override(tmp_path):
    y = write(tmp_path, "c.yaml", "daemon:\n  interval_seconds: 5\npolicy:\n  raise_after_passes: 4\n")
    cfg = config.load(y)
    assert cfg["daemon"]["interval_seconds"] == 5.0 and cfg["policy"]["raise_after_passes"] == 4
    j = write(tmp_path, "c.json", json.dumps({"daemon": {"listen": "127.0.0.1:1"}}))
    assert config.load(j)["daemon"]["listen"] == "127.0.0.1:1"


@pytest.mark.parametrize("text, fragment", [
    ("daemon:\n  intervall: 5\n", "daemon.intervall: unknown setting"),
    ("daemon:\n  interval_seconds: fast\n", "daemon.interval_seconds: expected float"),
    ("policy:\n  raise_after_passes: true\n", "policy.raise_after_passes: expected int"),
    ("- a list\n", "config: expected a mapping"),
    ("daemon: [1, 2\n", "not valid YAML"),
    ("nonsense: 1\n", "nonsense: unknown setting"),
    ("daemon:\n  interval_seconds: -5\n", "daemon.interval_seconds: must be greater than 0"),
    ("daemon:\n  collector_timeout_seconds: 0\n", "daemon.collector_timeout_seconds: must be greater than 0"),
    ("collectors:\n  mounts:\n    timeout_seconds: 30\n", "must be below daemon.collector_timeout_seconds"),
    ("policy:\n  raise_after_passes: 0\n", "policy.raise_after_passes: must be at least 1"),
    ("checks:\n  infiniband:\n    expected_rate_gbps: {InfiniBand: 400 Gb/s}\n",
     "expected_rate_gbps.InfiniBand: must be a number of Gb/s"),
    ("collectors:\n  kmsg:\n    source: syslog\n", "collectors.kmsg.source: must be auto, kmsg or journal"),
    ("collectors:\n  kmsg:\n    journal_directories: [var/log/journal]\n",
     "collectors.kmsg.journal_directories: absolute paths"),
])
def test_bad_config_is_a_clear_error(tmp_path, text, fragment):
    with pytest.raises(config.ConfigError) as e:
        config.load(write(tmp_path, "c.yaml", text))
    assert fragment in str(e.value)


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(config.ConfigError, match="cannot read config"):
        config.load(str(tmp_path / "absent.yaml"))


def test_empty_file_means_defaults(tmp_path):
    assert config.load(write(tmp_path, "c.yaml", "")) == config.defaults()


@pytest.mark.parametrize("text, fragment", [
    ("fetch_concurrency: 0", "pingmesh.fetch_concurrency: must be at least 1, not 0"),
    ("fetch_timeout_seconds: 0", "pingmesh.fetch_timeout_seconds: must be greater than 0"),
    ("fetch_timeout_seconds: .nan", "pingmesh.fetch_timeout_seconds: must be greater than 0, not nan"),
    ("probe_interval_seconds: -1", "pingmesh.probe_interval_seconds: must be greater than 0"),
    ("ping_interval_seconds: 0", "pingmesh.ping_interval_seconds: must be greater than 0"),
    ("timeout_seconds: 0", "pingmesh.timeout_seconds: must be greater than 0"),
    ("window_seconds: 0.5", "pingmesh.window_seconds: must be at least 1, not 0.5"),
    ("windows_kept: 0", "pingmesh.windows_kept: must be at least 1"),
    ("max_concurrency: 0", "pingmesh.max_concurrency: must be at least 1"),
    ("max_probes_per_second: 0", "pingmesh.max_probes_per_second: must be greater than 0"),
    # open 2 + close 3 closed windows, and the open one.
    ("fetch_windows: 5", "pingmesh.fetch_windows (5) must be at least pingmesh.analysis.open_windows + "
                         "close_windows + 1 (6)"),
    ("analysis: {open_windows: 3}", "pingmesh.fetch_windows (6) must be at least"),
    ("inventory_configmap: nodehealth-pingmesh", "pingmesh.inventory_configmap: must not be pingmesh.configmap"),
])
def test_pingmesh_values_that_would_misbehave_are_refused(tmp_path, text, fragment):
    with pytest.raises(config.ConfigError) as e:
        config.load(write(tmp_path, "c.yaml", f"pingmesh:\n  {text}\n"))
    assert fragment in str(e.value)


@pytest.mark.parametrize("text", [
    "timeout_seconds: 15\n  probe_interval_seconds: 10",  # a probe may outlive the interval
    "fetch_windows: 7\n  analysis: {open_windows: 3, close_windows: 3}",  # exactly enough
    "fetch_windows: 6",  # the default bound exactly
    "window_seconds: 1\n  windows_kept: 1\n  max_concurrency: 1\n  fetch_concurrency: 1",
    "inventory_configmap: my-inventory\n  configmap: my-verdicts",
])
def test_pingmesh_values_at_their_bounds_are_accepted(tmp_path, text):
    assert config.load(write(tmp_path, "c.yaml", f"pingmesh:\n  {text}\n"))["pingmesh"]


def test_the_pingmesh_defaults_pass_their_own_checks():
    config.check_ranges(config.defaults())
    pm = config.defaults()["pingmesh"]
    assert pm["inventory_configmap"] == "nodehealth-pingmesh-inventory" != pm["configmap"]


@pytest.mark.parametrize("key,value,why", [
    ("loss_fraction", 0.0, "fraction"),
    ("leaf_fraction", 1.5, "fraction"),
    ("min_reporters", 0, "at least 1"),
    ("open_windows", 0, "at least 1"),
    ("p99_factor", 0.0, "greater than 0"),
])
def test_pingmesh_analysis_thresholds_are_checked(tmp_path, key, value, why):
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"pingmesh": {"analysis": {key: value}}}))
    with pytest.raises(config.ConfigError, match=f"pingmesh.analysis.{key}.*{why}"):
        config.load(str(path))


# -- a directory of config files (the DaemonSet mounts its ConfigMap's files and passes the directory) ---------

def test_a_directory_merges_its_files_in_name_order_key_by_key(tmp_path):
    write(tmp_path, "00-base.yaml", "daemon:\n  interval_seconds: 5\n  listen: 127.0.0.1:1\n"
          "collectors:\n  mounts:\n    paths: [/a, /b]\n")
    write(tmp_path, "50-component.json", json.dumps({"checks": {"xid": {"overrides": {"31": {"severity": "fatal"}}}}}))
    write(tmp_path, "90-site.yaml", "daemon:\n  interval_seconds: 7\ncollectors:\n  mounts:\n    paths: [/c]\n"
          "checks:\n  xid:\n    overrides:\n      '43': {severity: warning}\n")
    write(tmp_path, "README.txt", "not: a config file\n")  # only *.yaml, *.yml and *.json are read
    cfg = config.load(str(tmp_path))
    assert cfg["daemon"]["interval_seconds"] == 7.0  # a later file's value replaces
    assert cfg["daemon"]["listen"] == "127.0.0.1:1"  # a key the later file does not set stays
    assert cfg["collectors"]["mounts"]["paths"] == ["/c"]  # a list is replaced, not appended to
    assert cfg["checks"]["xid"]["overrides"] == {"31": {"severity": "fatal"}, "43": {"severity": "warning"}}


def test_a_configmap_volume_reads_as_its_files_only(tmp_path):
    """A ConfigMap volume holds its files as links into a hidden `..data` directory: those are skipped."""
    data = tmp_path / "..2026_01_01_00_00_00.000000001"
    data.mkdir()
    (data / "00-base.yaml").write_text("daemon:\n  interval_seconds: 9\n")
    (data / "bogus.yaml").write_text("nonsense: 1\n")
    (tmp_path / "..data").symlink_to(data.name)
    (tmp_path / "00-base.yaml").symlink_to("..data/00-base.yaml")
    assert config.load(str(tmp_path))["daemon"]["interval_seconds"] == 9.0


@pytest.mark.parametrize("files, fragment", [
    ({"10-a.yaml": "daemon:\n  interval_seconds: 5\n", "20-b.yaml": "daemon:\n  intervall: 5\n"},
     "20-b.yaml: daemon.intervall: unknown setting"),
    ({"10-a.yaml": "- a list\n"}, "10-a.yaml: config: expected a mapping"),
    ({"10-a.yaml": "daemon:\n  interval_seconds: 5\n", "20-b.yaml": "daemon:\n  interval_seconds: -1\n"},
     "daemon.interval_seconds: must be greater than 0"),
    ({"notes.txt": "x"}, "no *.yaml, *.yml or *.json file"),
])
def test_a_bad_directory_is_a_clear_error_naming_the_file(tmp_path, files, fragment):
    for name, text in files.items():
        write(tmp_path, name, text)
    with pytest.raises(config.ConfigError) as e:
        config.load(str(tmp_path))
    assert fragment in str(e.value)
