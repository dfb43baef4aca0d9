"""scontrol, the one way nodehealth talks to Slurm: a node's state and reason, a drain, a resume.

scontrol runs only here, always from an argv list: no shell ever sees a reason built from a finding.
Whose drain it is lives in the reason, as LBNL's NHC does it: nodehealth writes reasons that start
with `nodehealth:` (PREFIX) and resumes only those, so an administrator's drain is never undone.
"""
from __future__ import annotations

import logging
import os
import re
import shlex
import socket
import subprocess
import time
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("nodehealth.slurm")
PREFIX = "nodehealth:"
_REASON_TAIL = re.compile(r" \[[^\]]*@[^\]]*\]$")  # scontrol appends "[user@time]" to the reason
# scontrol's words when slurmctld is not there (down, restarting, failing over, overloaded); any other
# error is an answer (an unknown node, a refused update) that waiting does not change.
_UNREACHABLE = re.compile(r"Unable to contact|timed out|Zero Bytes|standby|Connection refused|connection failure",
                          re.IGNORECASE)


class SlurmError(Exception):
    """slurmctld could not be reached after the configured attempts, or refused the command."""


@dataclass(frozen=True)
class NodeState:
    state: str  # e.g. IDLE+DRAIN
    reason: str  # "" when none

    @property
    def drained(self) -> bool:
        return "DRAIN" in self.state.split("+")

    @property
    def ours(self) -> bool:
        return self.drained and self.reason.startswith(PREFIX)


def parse_node(text: str) -> NodeState:
    """State and Reason from `scontrol show node NAME` (multi-line form: Reason has its own line)."""
    state = reason = ""
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("Reason="):
            reason = _REASON_TAIL.sub("", line[len("Reason="):]).strip()
        for token in line.split():
            if token.startswith("State="):
                state = token[len("State="):]
    if not state:
        raise SlurmError(f"scontrol printed no State for the node: {text.strip()[:200]!r}")
    return NodeState(state, reason)


def _text(data: bytes | str | None) -> str:
    """A timed-out run's partial output, which subprocess hands back as bytes."""
    return data.decode(errors="replace") if isinstance(data, bytes) else data or ""


class Scontrol:
    """scontrol with bounded retries: slurmctld may be restarting. In dry-run (`slurm.dry_run`, NHC's
    MARK_OFFLINE=0) it reads the node but only logs the update it would run."""

    def __init__(self, cfg: dict[str, Any], sleep=time.sleep):
        self.cfg = cfg
        self.sleep = sleep
        self.dry_run = bool(cfg.get("dry_run"))

    def run(self, *args: str) -> str:
        cfg = self.cfg
        last = ""
        for attempt in range(cfg["attempts"]):
            if attempt:
                self.sleep(cfg["retry_delay_seconds"])
            try:
                done = subprocess.run([cfg["scontrol"], *args], capture_output=True, text=True, errors="replace",
                                      timeout=cfg["timeout_seconds"], stdin=subprocess.DEVNULL)
            except FileNotFoundError:
                raise SlurmError(f"{cfg['scontrol']} not found: install slurm-client or set slurm.scontrol") from None
            except OSError as e:  # not executable, say
                raise SlurmError(f"cannot run {cfg['scontrol']}: {e.strerror or e}") from None
            except subprocess.TimeoutExpired as e:
                said = " ".join(_text(e.stderr).split())[:300]
                if said and not _UNREACHABLE.search(said):  # e.g. no slurm.conf: scontrol waits 60 s for it
                    raise SlurmError(f"`scontrol {' '.join(args)}` gave no answer in {cfg['timeout_seconds']:g} s: "
                                     f"{said}") from None
                last = f"no answer in {cfg['timeout_seconds']:g} s"
                continue
            if done.returncode == 0:
                return done.stdout
            last = " ".join((done.stderr or done.stdout).split())[:300] or f"exit {done.returncode}"
            if not _UNREACHABLE.search(last):
                raise SlurmError(f"slurmctld refused `scontrol {' '.join(args)}`: {last}")
        raise SlurmError(f"slurmctld did not answer `scontrol {args[0]} {args[1]}` in {cfg['attempts']} attempt(s): "
                         f"{last}")

    def node(self, name: str) -> NodeState:
        return parse_node(self.run("show", "node", name))

    def drain(self, name: str, reason: str) -> str | None:
        return self._update(f"NodeName={name}", "State=DRAIN", f"Reason={reason}")

    def resume(self, name: str) -> str | None:
        return self._update(f"NodeName={name}", "State=RESUME")

    def _update(self, *args: str) -> str | None:
        """Run `scontrol update ARGS`; in dry-run, log it instead and return it as a shell would show it."""
        if not self.dry_run:
            self.run("update", *args)
            return None
        shown = shlex.join([self.cfg["scontrol"], "update", *args])
        log.info("dry-run: would run: %s", shown)
        return shown


def slurm_node_name(given: str | None) -> str:
    """Slurm's name for this node: --node-name, else $SLURMD_NODENAME (set for Prolog), else the short hostname."""
    return given or os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
