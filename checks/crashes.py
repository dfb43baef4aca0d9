"""Kernel crashes and stalls from the kernel log: BUG/Oops/general protection fault/panic (with the
function and module of the first RIP line) and RCU stalls (docs/sources.md, "Host hardware severities")."""
from __future__ import annotations

from nodehealth.checks.host_log import Rating, judge_events
from nodehealth.collectors.kernel_events import KERNEL_CRASH, RCU_STALL, KernelEvent
from nodehealth.model import Action, Finding, Observed, Reason, Severity

NAME = "crashes"
NEEDS = ("kmsg",)
SUBSYSTEM = "kernel"
DEBOUNCE = False
DEFAULTS: dict = {
    # RCU stalls older than this no longer count; crashes count all boot (the kernel's state stays suspect).
    "window_seconds": 86400.0,
    # RCU stall reports (the kernel repeats them while the CPU stays stuck) that make it persistent: fatal.
    "rcu_stall_repeat": 3,
}

MEANINGS = {  # what each key means, in docs/configuration.md
    "window_seconds": "RCU stalls older than this no longer count; crashes count all boot",
    "rcu_stall_repeat": "RCU stall reports in the window that make the stall fatal",
}
SOURCE = "kernel log"
FINDS = ("kernel crashes (`BUG:`, `Oops`, general protection fault, `kernel BUG at`, `Kernel panic`) with the "
         "function and module of the first `RIP:` line, RCU stalls")
REASONS = {
    "KernelCrash": Reason(Severity.FATAL, Action.REBOOT,
                          "the kernel crashed (BUG, Oops, GPF, panic); the finding names the function and module. "
                          "Counts all boot"),
    "RcuStall": Reason((Severity.DEGRADED, Severity.FATAL), Action.REBOOT,
                       "an RCU stall: a CPU stopped making progress in the kernel; fatal at `rcu_stall_repeat` (3) "
                       "reports"),
}


def judge(obs: Observed, cfg: dict) -> list[Finding]:
    cfg = dict(DEFAULTS, **cfg)
    repeat = int(cfg["rcu_stall_repeat"])
    return judge_events(NAME, obs, cfg, (KERNEL_CRASH, RCU_STALL), lambda e: rate(e, repeat))


def rate(e: KernelEvent, repeat: int) -> Rating | None:
    if e.kind == KERNEL_CRASH:
        fn, module = e.detail.get("function"), e.detail.get("module")
        where = f" in {fn}" if fn else ""
        where += f" of module {module}" if module else (" of the core kernel" if fn else "")
        return Rating("KernelCrash", Severity.FATAL, Action.REBOOT, f"The kernel crashed{where}",
                      "the kernel's state is undefined after a crash: drain the node and reboot it, and report "
                      "the call trace to the module's owner", True)
    if e.kind == RCU_STALL:
        return Rating("RcuStall", Severity.DEGRADED, Action.REBOOT, f"An RCU stall ({e.device}) was detected",
                      "a CPU stopped making progress in the kernel; drain the node and reboot it if it persists",
                      repeat=repeat, repeated=Severity.FATAL, repeated_action=Action.REBOOT)
    return None
