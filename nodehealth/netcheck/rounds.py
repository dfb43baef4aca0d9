"""netcheck rounds: which pairs of a job's nodes test each other, and what their results prove.

Pure functions over results (no sockets): `nodehealth netcheck` runs the tests, this module plans
the rounds and judges. The model is DLRover's: a faulty node fails every test it is in, a test of
two sound nodes passes, and a slow node makes its pair slow. DLRover's two rounds ("failed twice,
with different partners") stop being exact when more than a quarter of the nodes are faulty: two
faulty nodes re-paired together both fail twice and a sound node paired with two faulty ones is
blamed. Here a verdict needs proof instead:

- a node that passed a test is sound;
- a node that failed (or was slow) with a partner proven sound is faulty (or slow);
- every round pairs the open suspects with proven-sound nodes; when the sound ones are too few,
  one member of each failed pair goes first (its partner is judged by the same test), and the
  suspects left over test each other with partners they have not had yet, so a pass proves two.

This is exact whenever at least two nodes are sound (with fewer, every test fails and no method
can tell which nodes are at fault): the result then names those nodes "unresolved".
"""
from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

PASS, SLOW, FAIL = "pass", "slow", "fail"
SOUND, FAULTY, STRAGGLER, UNRESOLVED = "sound", "faulty", "slow", "unresolved"


@dataclass(frozen=True)
class PairResult:
    """One pair's result in one round. bandwidth_gbps is None when the test failed."""

    round: int
    a: str
    b: str
    ok: bool
    bandwidth_gbps: float | None = None
    error: str = ""
    outcome: str = ""  # PASS, SLOW or FAIL, set when recorded (slow is relative to the median)

    def partner(self, node: str) -> str:
        return self.b if node == self.a else self.a


@dataclass
class Result:
    """Each node's verdict with the tests that prove it."""

    status: dict[str, str]
    evidence: dict[str, list[PairResult]]
    rounds: int
    median_gbps: float | None
    tests: list[PairResult] = field(default_factory=list)

    def named(self, status: str) -> list[str]:
        return sorted(n for n, s in self.status.items() if s == status)


class Netcheck:
    """The rounds of one netcheck: next_round() gives pairs, record() takes their results."""

    def __init__(self, nodes: Sequence[str], leaves: Mapping[str, str] | None = None,
                 slow_fraction: float = 0.5, max_rounds: int = 10):
        if len(set(nodes)) != len(nodes):
            raise ValueError("netcheck: a node is listed twice")
        if len(nodes) < 2:
            raise ValueError("netcheck needs at least two nodes")
        if not 0 < slow_fraction <= 1:
            raise ValueError("netcheck: the slow fraction must be in (0, 1]")
        self.nodes = list(nodes)
        self.leaves = dict(leaves or {})
        self.slow_fraction = slow_fraction
        self.max_rounds = max_rounds
        self.tests: list[PairResult] = []
        self.round = 0
        self._sound: set[str] = set()
        self._judged: dict[str, str] = {}  # node -> FAULTY or STRAGGLER, with proof
        self._bandwidths: list[float] = []
        self._blame: dict[str, list[PairResult]] = {}  # node -> its failed or slow tests
        self._classified_with: float | None = None

    # -- planning --------------------------------------------------------------------------------
    def next_round(self) -> list[tuple[str, str]]:
        """The pairs of the next round; empty when every node is judged or no round can help."""
        if self.round >= self.max_rounds:
            return []
        if self.round == 0:
            return first_round(self.nodes, self.leaves)
        open_ = [n for n in self.nodes if n not in self._sound and n not in self._judged]
        if not open_:
            return []
        if not self._sound:  # every test failed so far: try pairs not met yet until one passes
            return circle_round(self.nodes, self.round - 1)
        return self._pair_open(open_)

    def _pair_open(self, open_: list[str]) -> list[tuple[str, str]]:
        sound = sorted(self._sound)
        if len(sound) >= len(open_):
            return list(zip(open_, sound))
        # Too few sound nodes: first one member of each failed pair whose partner is also open
        # (testing it judges both), then the rest.
        first: list[str] = []
        seen: set[str] = set()
        is_open = set(open_)
        for t in self.tests:
            if t.outcome != PASS and t.a in is_open and t.b in is_open and t.a not in seen and t.b not in seen:
                first.append(t.a)
                seen.update((t.a, t.b))
        chosen = set(first)
        order = first + [n for n in open_ if n not in chosen]
        pairs = list(zip(order, sound))
        rest = order[len(sound):]
        met = {frozenset((t.a, t.b)) for t in self.tests}
        while len(rest) > 1:  # each left-over suspect meets one it has not met yet
            a = rest.pop()
            b = next((x for x in reversed(rest) if frozenset((a, x)) not in met), None)
            if b is not None:
                rest.remove(b)
                pairs.append((a, b))
        return pairs

    # -- recording -------------------------------------------------------------------------------
    def record(self, results: Iterable[PairResult]) -> None:
        """Take one round's results (tests of pairs not planned are taken as they are)."""
        batch = [PairResult(self.round, t.a, t.b, t.ok, t.bandwidth_gbps if t.ok else None, t.error)
                 for t in results]
        self.round += 1
        # A node counts once a round in the median: the odd node's second test in round 0 would
        # otherwise count its partner twice, and a slow partner would drag the median down with it.
        counted: set[str] = set()
        for t in batch:
            if t.a not in counted and t.b not in counted and t.ok and t.bandwidth_gbps is not None:
                self._bandwidths.append(t.bandwidth_gbps)
                counted.update((t.a, t.b))
        median = self.median()
        if median != self._classified_with:  # a new median may turn past passes slow or back
            self.tests = [_classify(t, median, self.slow_fraction) for t in self.tests + batch]
            self._classified_with = median
            self._sound, self._blame, self._judged = set(), {}, {}
            new = self.tests
        else:
            new = [_classify(t, median, self.slow_fraction) for t in batch]
            self.tests.extend(new)
        self._infer(new)

    def median(self) -> float | None:
        return statistics.median(self._bandwidths) if self._bandwidths else None

    def _infer(self, new: list[PairResult]) -> None:
        """Add what the new tests prove: passes make nodes sound, and a sound partner turns every
        failed or slow test of the other node, old or new, into proof against it."""
        fresh = {n for t in new if t.outcome == PASS for n in (t.a, t.b)} - self._sound
        self._sound |= fresh
        for t in new:
            if t.outcome != PASS:
                for node in (t.a, t.b):
                    self._blame.setdefault(node, []).append(t)
        # Proof comes from a test whose partner is sound: the fresh sound nodes' old tests, and new ones.
        proofs = [t for n in fresh for t in self._blame.get(n, ())] + [t for t in new if t.outcome != PASS]
        for t in proofs:
            for node in (t.a, t.b):
                if t.partner(node) in self._sound and node not in self._sound and self._judged.get(node) != FAULTY:
                    self._judged[node] = FAULTY if t.outcome == FAIL else STRAGGLER
        for node in fresh:
            self._judged.pop(node, None)

    def result(self) -> Result:
        status = {n: SOUND if n in self._sound else self._judged.get(n, UNRESOLVED) for n in self.nodes}
        evidence = {n: [t for t in self.tests if n in (t.a, t.b)] for n in self.nodes}
        return Result(status, evidence, self.round, self.median(), list(self.tests))


def first_round(nodes: Sequence[str], leaves: Mapping[str, str]) -> list[tuple[str, str]]:
    """Adjacent pairs, under the same leaf first (leaf order as given); an odd node out joins the
    last pair's first node in a second test of the same round, as DLRover's group of three."""
    by_leaf: dict[str, list[str]] = {}
    for n in nodes:
        by_leaf.setdefault(leaves.get(n, ""), []).append(n)
    pairs: list[tuple[str, str]] = []
    left: list[str] = []
    for members in by_leaf.values():
        for i in range(0, len(members) - 1, 2):
            pairs.append((members[i], members[i + 1]))
        if len(members) % 2:
            left.append(members[-1])
    for i in range(0, len(left) - 1, 2):
        pairs.append((left[i], left[i + 1]))
    if len(left) % 2:
        pairs.append((left[-1], pairs[-1][0]))
    return pairs


def circle_round(nodes: Sequence[str], r: int) -> list[tuple[str, str]]:
    """Round r of a round-robin tournament (circle method): n - 1 rounds (n odd: n) meet every pair once."""
    ring: list[str | None] = list(nodes) + ([None] if len(nodes) % 2 else [])
    m = len(ring)
    rest = ring[1:]
    shift = r % (m - 1)
    arr = [ring[0]] + rest[shift:] + rest[:shift]
    return [(arr[i], arr[m - 1 - i]) for i in range(m // 2) if arr[i] is not None and arr[m - 1 - i] is not None]


def waves(pairs: Sequence[tuple[str, str]]) -> list[list[tuple[str, str]]]:
    """Split a round into waves in which no node is in two tests (only an odd round 0 needs two)."""
    out: list[list[tuple[str, str]]] = []
    for pair in pairs:
        for wave in out:
            if not any(n in p for p in wave for n in pair):
                wave.append(pair)
                break
        else:
            out.append([pair])
    return out


def _classify(t: PairResult, median: float | None, fraction: float) -> PairResult:
    if not t.ok:
        outcome = FAIL
    elif median and t.bandwidth_gbps is not None and t.bandwidth_gbps < fraction * median:
        outcome = SLOW
    else:
        outcome = PASS
    return PairResult(t.round, t.a, t.b, t.ok, t.bandwidth_gbps, t.error, outcome)


def to_dict(result: Result, method: str) -> dict:
    """The JSON report: the verdict per node, the faulty and slow ones named with their tests."""
    return {
        "method": method,
        "rounds": result.rounds,
        "median_gbps": result.median_gbps,
        "faulty": result.named(FAULTY),
        "slow": result.named(STRAGGLER),
        "unresolved": result.named(UNRESOLVED),
        "nodes": {n: {"status": s, "tests": [_test_dict(t, n) for t in result.evidence[n]]}
                  for n, s in sorted(result.status.items())},
    }


def _test_dict(t: PairResult, node: str) -> dict:
    d = {"round": t.round, "partner": t.partner(node), "outcome": t.outcome, "bandwidth_gbps": t.bandwidth_gbps}
    if t.error:
        d["error"] = t.error
    return d
