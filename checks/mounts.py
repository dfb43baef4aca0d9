"""Network and FUSE mounts that hang, fail, or are missing.

A hung mount puts every process that touches it in uninterruptible sleep: the job stalls in its
data loader or checkpoint with no error of its own. A stale or dead mount fails every access.
"""
from __future__ import annotations

import errno
import os

from nodehealth.model import Action, Finding, Observed, Reason, Severity

NAME = "mounts"
NEEDS = ("mounts",)
SUBSYSTEM = "storage"
DEFAULTS: dict = {}
DEBOUNCE = True

SOURCE = ("`/proc/self/mountinfo` (in a pod with `--root /host`: the host's, `/host/proc/1/mountinfo`, probed "
          "through `/host/proc/1/root`, which needs `SYS_PTRACE`)")
FINDS = "network and FUSE mounts (and configured paths) that do not answer a bounded `stat`, are stale or missing"
REASONS = {
    "MountUnresponsive": Reason(Severity.DEGRADED, Action.FIX_CONFIG,
                                "a mount did not answer a `stat` within `collectors.mounts.timeout_seconds` (5 s): "
                                "processes touching it hang in D state"),
    "MountBroken": Reason(Severity.DEGRADED, Action.FIX_CONFIG,
                          "a mount fails a `stat` (ESTALE, ENOTCONN, EIO, ...): every access fails; restore the "
                          "server or daemon and remount"),
    "MountMissing": Reason(Severity.WARNING, Action.FIX_CONFIG, "a path in `collectors.mounts.paths` is not mounted"),
    "MountTableLinesSkipped": Reason(Severity.INFO, Action.NONE,
                                     "lines of the mount table could not be parsed; their mounts were not probed"),
    "MountsUnreachable": Reason(Severity.UNKNOWN, Action.NONE,
                                "no mount could be probed: the host's root, reached through its init process, was "
                                "refused (the agent lacks SYS_PTRACE)"),
    "MountNotReached": Reason(Severity.UNKNOWN, Action.NONE,
                              "a mount could not be probed: a directory on the way refused the agent its search "
                              "(DAC_READ_SEARCH, or root with its capabilities)"),
}

# The remedy is an operator's action on the node's mounts (remount, restore the server or the
# FUSE daemon, fix fstab/autofs), not on a GPU or the application: fix-config is the closest
# action. Rebooting a node whose processes are stuck in D state is the operator's last resort.
ACTION = Action.FIX_CONFIG

# The file system answered, it just refuses us (e.g. a FUSE mount without allow_other refuses root).
ANSWERED = frozenset(("EACCES", "EPERM"))
HINTS = {
    "ESTALE": "the server no longer knows this export, after a re-export, a failover or a deletion",
    "ENOTCONN": "the FUSE daemon or network session serving it is gone",
    "EIO": "the client gave up on the server (a soft mount timing out, or a failed server)",
}


def judge(obs: Observed, cfg: dict) -> list[Finding]:
    facts = obs.facts["mounts"]
    if facts.unreachable is not None:
        return [_unreachable(facts)]
    findings = []
    for m in facts.mounts:
        finding = _judge_mount(m)
        if finding is not None:
            findings.append(finding)
    if facts.bad_lines:
        # Info, not unknown: every other mount was judged; the skipped one may still be a network mount.
        findings.append(Finding(
            NAME, Severity.INFO, "MountTableLinesSkipped",
            f"{facts.bad_lines} line(s) of the mount table could not be parsed and their mounts were not probed "
            f"(the first: {facts.first_bad_line}); every other mount was checked.",
            evidence={"lines": facts.bad_lines, "first": facts.first_bad_line}))
    return findings


def _judge_mount(m) -> Finding | None:
    if not m.reached:
        return _not_reached(m)
    if m.responsive is None:  # not probed this pass: every probe slot is held by a stuck stat
        return None
    if not m.responsive:
        return _unresponsive(m)
    if m.configured and not m.mounted:
        return _missing(m)
    if m.error is not None and m.error not in ANSWERED:
        return _broken(m)
    return None


def _what(m) -> str:
    if not m.mounted:
        return f"path {m.mountpoint}"
    return f"{m.fstype} mount {m.mountpoint} (from {m.source})"


def _unresponsive(m) -> Finding:
    return Finding(
        NAME, Severity.DEGRADED, "MountUnresponsive",
        f"The {_what(m)} has not answered a stat for {m.latency_seconds:.1f} s: every process that touches it "
        f"hangs in uninterruptible sleep (D state), so jobs reading data or writing checkpoints there stall; "
        f"check the server and the network path to it, then remount it (umount -l {m.mountpoint}; "
        f"mount {m.mountpoint}).",
        device=m.mountpoint, action=ACTION,
        evidence={"fstype": m.fstype, "source": m.source, "waited_seconds": round(m.latency_seconds, 3)})


def _broken(m) -> Finding:
    number = getattr(errno, m.error, None)
    reason_text = os.strerror(number) if isinstance(number, int) else m.error
    hint = HINTS.get(m.error)
    return Finding(
        NAME, Severity.DEGRADED, "MountBroken",
        f"The {_what(m)} fails a stat with {m.error} ({reason_text}"
        f"{': ' + hint if hint else ''}), so every access to it fails; restore the server or the daemon "
        f"behind it and remount it (umount -l {m.mountpoint}; mount {m.mountpoint}).",
        device=m.mountpoint, action=ACTION,
        evidence={"fstype": m.fstype, "source": m.source, "error": m.error})


def _unreachable(facts) -> Finding:
    return Finding(
        NAME, Severity.UNKNOWN, "MountsUnreachable",
        f"The {len(facts.mounts)} network or FUSE mounts (and required paths) of this host could not be probed: "
        f"its mount points are reached through its init process's root, and the kernel refused that "
        f"({facts.unreachable}) before any mount was reached, so a hung NFS or Lustre mount would go unseen. "
        "The agent needs to be allowed to ptrace the host's init: give it the SYS_PTRACE capability (the base "
        "DaemonSet has it; deploy/README.md, \"Privileges of the agent\").",
        evidence={"error": facts.unreachable, "mounts": [m.mountpoint for m in facts.mounts][:20]})


def _not_reached(m) -> Finding:
    parent = os.path.dirname(m.mountpoint.rstrip("/")) or "/"
    return Finding(
        NAME, Severity.UNKNOWN, "MountNotReached",
        f"The {_what(m)} could not be probed: the stat was refused ({m.error}) in {parent} on the way, before it "
        f"reached the mount, so whether the mount answers is unknown. Give the agent the DAC_READ_SEARCH "
        f"capability (the hang component adds it) or run it as root with its capabilities, so that it may search "
        f"{parent}.",
        device=m.mountpoint, evidence={"fstype": m.fstype, "source": m.source, "error": m.error})


def _missing(m) -> Finding:
    state = "does not even exist" if m.error == "ENOENT" else "is not mounted"
    return Finding(
        NAME, Severity.WARNING, "MountMissing",
        f"{m.mountpoint} is a required mount (mounts paths setting) but {state}: jobs that expect shared data "
        f"there fail or fill the local disk instead; mount it (mount {m.mountpoint}) and find out why it was "
        f"not (its fstab entry, autofs map or systemd mount unit).",
        device=m.mountpoint, action=ACTION,
        evidence={"error": m.error})
