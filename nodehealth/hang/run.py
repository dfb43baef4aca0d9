"""Run a training script with the hang timer on, for launchers that cannot edit the code:

    torchrun --nproc-per-node 8 -m nodehealth.hang.run train.py --lr 3e-4
    NODEHEALTH_HANG_DIR=/run/nodehealth/hang python -m nodehealth.hang.run train.py

The records go to $NODEHEALTH_HANG_DIR (default /run/nodehealth/hang).
"""
from __future__ import annotations

import os
import runpy
import sys

from nodehealth.hang.timer import enable


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit("usage: python -m nodehealth.hang.run SCRIPT [ARGS...]  (or -m MODULE [ARGS...])")
    timer = enable()
    try:
        if sys.argv[1] == "-m" and len(sys.argv) > 2:
            sys.argv = sys.argv[2:]
            runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
        else:
            sys.argv = sys.argv[1:]
            sys.path.insert(0, os.path.dirname(os.path.abspath(sys.argv[0])))
            runpy.run_path(sys.argv[0], run_name="__main__")
    except SystemExit as e:  # the exit code the last record gives, as Python will make it
        timer.exit_code = e.code & 0xFF if isinstance(e.code, int) else 0 if e.code is None else 1
        raise


if __name__ == "__main__":
    main()
