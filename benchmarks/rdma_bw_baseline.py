"""`nodehealth rdma-bw` with another version of nodehealth/rdma/bw.py, so that two versions run side
by side in one boot (benchmarks/rdma_bw_vm.py --baseline REV). Usage: rdma_bw_baseline.py BW_FILE
rdma-bw [ARGS...]: the command line of `nodehealth`, its rdma-bw running BW_FILE's code."""
from __future__ import annotations

import argparse
import importlib.util
import sys

import nodehealth.rdma
from nodehealth.rdma import cli

spec = importlib.util.spec_from_file_location("nodehealth.rdma.bw", sys.argv[1])
module = importlib.util.module_from_spec(spec)
sys.modules["nodehealth.rdma.bw"] = module  # what cli.cmd_rdma_bw imports
spec.loader.exec_module(module)
nodehealth.rdma.bw = module
parser = argparse.ArgumentParser(prog="nodehealth")
cli.add_subcommands(parser.add_subparsers())
args = parser.parse_args(sys.argv[2:])
sys.exit(args.func(args))
