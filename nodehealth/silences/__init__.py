"""Silences: an operator says a finding is known (a repair is scheduled) without turning a check off.

A silenced finding is still judged, reported and exported (as silenced), but it counts in no verdict:
no taint, no drain, no alert, no remediation hook. Every silence expires by itself, and a fatal
finding is silenced only by a silence that says so (`--allow-fatal`).

silence (the rule, its validation, applying silences to findings), store (the file in the state
directory that `nodehealth silence` writes), tracker (the daemon's side: the file, the Node
annotation, logs and counts), defaults, cli (`nodehealth silence add|list|remove`).
"""

FILE = "silences.json"  # in the state directory; named here so that a pass without one imports nothing more
