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
