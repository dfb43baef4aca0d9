"""The memlock check: table-driven, no files."""
from __future__ import annotations

import pytest

from nodehealth.checks import memlock
from nodehealth.collectors.limits import Limits, MemlockLimit, RdmaProcess
from nodehealth.model import Action, Observed, Severity

KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30
UNLIMITED = MemlockLimit(None, None)
LOW = MemlockLimit(64 * KIB, 64 * KIB)


def limit(soft):
    return MemlockLimit(soft, soft)


def proc(pid=3127, comm="python3", memlock_limit=LOW, cap=False):
    return RdmaProcess(pid, comm, memlock_limit, cap, ("uverbs0",))


def facts(self_limit=UNLIMITED, devices=("uverbs0",), processes=()):
    return Limits(self_limit, True, tuple(devices), tuple(processes), 0, False)


def judge(f, **cfg):
    return memlock.judge(Observed({"limits": f}), {**memlock.DEFAULTS, **cfg})


def summary(findings):
    return [(f.severity, f.reason, f.device) for f in findings]


WARN, INFO = Severity.WARNING, Severity.INFO

CASES = [
    # (name, facts, config, expected (severity, reason, device) list)
    ("no rdma devices, tiny own limit: nothing to break", facts(limit(32 * KIB), devices=()), {}, []),
    ("no rdma devices, low rdma-less process ignored", facts(limit(64 * KIB), devices=(), processes=[proc()]), {}, []),
    ("rdma node, all unlimited", facts(processes=[proc(memlock_limit=UNLIMITED)]), {}, []),
    ("own limit 8 MiB", facts(limit(8 * MIB)), {}, [(WARN, "MemlockLimitLow", "nodehealth")]),
    ("own limit 64 KiB", facts(limit(64 * KIB)), {}, [(WARN, "MemlockLimitLow", "nodehealth")]),
    ("own limit just under 16 GiB", facts(limit(16 * GIB - 1)), {}, [(WARN, "MemlockLimitLow", "nodehealth")]),
    ("own limit exactly 16 GiB: finite", facts(limit(16 * GIB)), {}, [(INFO, "MemlockLimitFinite", "nodehealth")]),
    ("own limit 64 GiB: finite", facts(limit(64 * GIB)), {}, [(INFO, "MemlockLimitFinite", "nodehealth")]),
    ("finite tolerated when not expecting unlimited", facts(limit(64 * GIB)), {"expect_unlimited_on_rdma": False},
     []),
    ("low own limit still warns when not expecting unlimited", facts(limit(8 * MIB)),
     {"expect_unlimited_on_rdma": False}, [(WARN, "MemlockLimitLow", "nodehealth")]),
    ("own soft unlimited, hard finite", facts(MemlockLimit(None, 8 * MIB)), {}, []),
    ("threshold from config", facts(limit(8 * MIB)), {"min_bytes": 4 * MIB},
     [(INFO, "MemlockLimitFinite", "nodehealth")]),
    ("rdma process 64 KiB without CAP_IPC_LOCK", facts(processes=[proc()]), {},
     [(WARN, "RdmaProcessMemlockLow", "python3")]),
    ("rdma process 64 KiB with CAP_IPC_LOCK is fine", facts(processes=[proc(cap=True)]), {}, []),
    ("rdma process limit unreadable: not judged", facts(processes=[proc(memlock_limit=None)]), {}, []),
    ("rdma process capabilities unreadable: judged on its limit", facts(processes=[proc(cap=None)]), {},
     [(WARN, "RdmaProcessMemlockLow", "python3")]),
    ("rdma process 32 GiB is fine", facts(processes=[proc(memlock_limit=limit(32 * GIB))]), {}, []),
    ("rdma process soft low, hard unlimited: soft counts",
     facts(processes=[proc(memlock_limit=MemlockLimit(64 * KIB, None))]), {},
     [(WARN, "RdmaProcessMemlockLow", "python3")]),
    ("two commands, two findings, sorted by command",
     facts(processes=[proc(1, "torchrun"), proc(2, "ib_write_bw")]), {},
     [(WARN, "RdmaProcessMemlockLow", "ib_write_bw"), (WARN, "RdmaProcessMemlockLow", "torchrun")]),
    ("own and process findings together", facts(limit(64 * KIB), processes=[proc()]), {},
     [(WARN, "MemlockLimitLow", "nodehealth"), (WARN, "RdmaProcessMemlockLow", "python3")]),
]


@pytest.mark.parametrize("name, f, cfg, expected", CASES, ids=[c[0] for c in CASES])
def test_rules(name, f, cfg, expected):
    assert summary(judge(f, **cfg)) == expected


def test_every_finding_is_fix_config():
    findings = judge(facts(limit(64 * KIB), processes=[proc()])) + judge(facts(limit(32 * GIB)))
    assert findings and all(f.action is Action.FIX_CONFIG for f in findings)


def test_process_message_names_process_limit_failure_and_fixes():
    (finding,) = judge(facts(processes=[proc()]))
    for words in ("python3", "pid 3127", "64 KiB", "ulimit -l 64", "ENOMEM", "ibv_reg_mr",
                  "Couldn't allocate MR with error=12", "--ulimit memlock=-1", "capabilities.add: [IPC_LOCK]",
                  "LimitMEMLOCK=infinity", "/etc/security/limits.conf", "non-root"):
        assert words in finding.message
    assert finding.evidence == {"pids": [3127], "soft_bytes": 64 * KIB, "devices": ["uverbs0"]}


def test_own_limit_message_in_human_units():
    (finding,) = judge(facts(limit(8 * MIB), devices=("uverbs0", "uverbs1")))
    assert "8 MiB (ulimit -l 8192)" in finding.message and "16 GiB" in finding.message
    assert "2 RDMA devices" in finding.message
    assert finding.evidence["soft_bytes"] == 8 * MIB


def test_processes_of_one_command_are_one_finding():
    procs = [proc(pid, memlock_limit=limit(soft)) for pid, soft in ((10, 8 * MIB), (11, 64 * KIB), (12, 8 * MIB))]
    (finding,) = judge(facts(processes=procs))
    assert "3 python3 processes (pids 10, 11, 12)" in finding.message
    assert "64 KiB" in finding.message  # the smallest limit among them
    assert finding.evidence["pids"] == [10, 11, 12]


def test_many_processes_are_summarized():
    (finding,) = judge(facts(processes=[proc(pid) for pid in range(100, 110)]))
    assert "and 2 more" in finding.message and "109" not in finding.message


@pytest.mark.parametrize("n, text", [
    (0, "0 bytes"), (512, "512 bytes"), (64 * KIB, "64 KiB"), (8 * MIB, "8 MiB"), (16 * GIB, "16 GiB"),
    (3 * GIB // 2, "1.5 GiB"), (1 << 40, "1 TiB"),
])
def test_human_bytes(n, text):
    assert memlock.human_bytes(n) == text


def test_module_contract():
    assert memlock.NAME == "memlock" and memlock.NEEDS == ("limits",) and memlock.DEBOUNCE is False
    assert memlock.DEFAULTS == {"min_bytes": 16 * GIB, "expect_unlimited_on_rdma": True}
