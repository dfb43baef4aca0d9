"""Merges the *.yaml files of a directory, in name order, into one config file for the daemon.

The init container of the agent and of the pingmesh controller runs it, so that an overlay changes one
key by adding a file with that key alone: mappings merge key by key, anything else (a value, a list)
is replaced by the later file's. The daemon validates the result when it loads it.

    python3 merge.py /etc/nodehealth/config.d /run/nodehealth-config/config.yaml
"""
import glob
import os
import sys

import yaml


def merge(base: dict, override: dict) -> None:
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            merge(base[key], value)
        else:
            base[key] = value


def main(source: str, target: str) -> int:
    merged: dict = {}
    for path in sorted(glob.glob(os.path.join(source, "*.yaml"))):
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f)
        if data is None:
            continue
        if not isinstance(data, dict):
            print(f"{path}: expected a mapping of settings, got {type(data).__name__}", file=sys.stderr)
            return 1
        merge(merged, data)
    with open(target + ".tmp", "w", encoding="utf-8") as f:
        yaml.safe_dump(merged, f, sort_keys=False)
    os.replace(target + ".tmp", target)
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(f"usage: {sys.argv[0]} SOURCE_DIR TARGET_FILE")
    sys.exit(main(sys.argv[1], sys.argv[2]))
