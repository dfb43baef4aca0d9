"""netcheck rounds: which pairs of a job's nodes test each other, and what their results prove.

Pure functions over results (no sockets): `nodehealth netcheck` runs the tests, this module plans
the rounds and judges. The model is DLRover's: a faulty node fails every test it is in, a test of
two sound nodes passes, and a slow node makes its pair slow. DLRover's two rounds ("failed twice,
with different partners") stop being exact when more than a quarter of the nodes are faulty: two
faulty nodes re-paired together both fail twice and a sound node paired with two faulty ones is
blamed. Here a verdict needs proof instead:

- a node that passed a test is sound;
- a node that failed with a partner proven sound is faulty;
- a node that was slow with two different partners proven sound is slow: one slow test may be a
  loaded host or a noisy moment, so a node slow once with a sound partner is tested again with
  another (its partner may have been the loaded one);
- every round pairs the open suspects with proven-sound nodes; when the sound ones are too few,
  one member of each failed pair goes first (its partner is judged by the same test), and the
  suspects left over test each other with partners they have not had yet, so a pass proves two.

This is exact whenever at least two nodes are sound (with fewer, every test fails and no method
can tell which nodes are at fault): the result then names those nodes "unresolved".

"Slow" is relative to the other nodes: a test is slow below `slow_fraction` of the median of the
best bandwidth of every node but its two. A median that included the test itself (or its nodes'
other tests) would sink with it in a small job: with four nodes, half the tests are a slow node's.

A node whose agent the coordinator cannot reach is "unreachable": its failed tests measured nothing
about its partners, so they are proof against nobody.
"""
from __future__ import annotations

import statistics
from bisect import bisect_left
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

PASS, SLOW, FAIL = "pass", "slow", "fail"
SOUND, FAULTY, STRAGGLER, UNRESOLVED, UNREACHABLE = "sound", "faulty", "slow", "unresolved", "unreachable"
SLOW_PROOFS = 2  # slow tests, with this many different sound partners, before a node is named slow


@dataclass(frozen=True)
class PairResult:
    """One pair's result in one round: `a` sent to `b`. bandwidth_gbps is None when the test failed."""

    round: int
    a: str
    b: str
    ok: bool
    bandwidth_gbps: float | None = None
    error: str = ""
    outcome: str = ""  # PASS, SLOW or FAIL, set when recorded (slow is relative to reference_gbps)
    method: str = ""  # tcp or rdma
    retransmitted: float | None = None  # TCP: the fraction of the segments the sender sent again
    reference_gbps: float | None = None  # the median of the other nodes' best bandwidths, when recorded

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
    unreachable: dict[str, str] = field(default_factory=dict)  # node -> why the coordinator cannot reach it

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
        self.unreachable: dict[str, str] = {}
        self._best: dict[str, float] = {}  # node -> its best bandwidth in any test
        self._sound: set[str] = set()
        self._judged: dict[str, str] = {}  # node -> FAULTY or STRAGGLER, with proof
        self._blame: dict[str, list[PairResult]] = {}  # node -> its failed or slow tests
        self._slow_with: dict[str, set[str]] = {}  # node -> the sound partners it was slow with
        self._met: set[frozenset[str]] = set()  # the pairs tested so far

    # -- planning --------------------------------------------------------------------------------
    def next_round(self) -> list[tuple[str, str]]:
        """The pairs of the next round; empty when every node is judged or no round can help."""
        if self.round >= self.max_rounds:
            return []
        if self.round == 0:
            return first_round(self.nodes, self.leaves)
        open_ = [n for n in self.nodes if n not in self._sound and n not in self._judged and n not in self.unreachable]
        if not open_:
            return []
        if not self._sound:  # every test failed so far: try pairs not met yet until one passes
            reachable = [n for n in self.nodes if n not in self.unreachable]
            return circle_round(reachable, self.round - 1) if len(reachable) > 1 else []
        return self._pair_open(open_)

    def _pair_open(self, open_: list[str]) -> list[tuple[str, str]]:
        sound = sorted(self._sound)
        order = open_
        if len(sound) < len(open_):
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
        met = self._met
        pairs = []
        free = list(sound)
        for node in order[:len(sound)]:  # a sound partner it has not met: a node slow once is retested with another
            partner = next((s for s in free if frozenset((node, s)) not in met), free[0])
            free.remove(partner)
            pairs.append((node, partner))
        rest = order[len(sound):]
        while len(rest) > 1:  # each left-over suspect meets one it has not met yet
            a = rest.pop()
            b = next((x for x in reversed(rest) if frozenset((a, x)) not in met), None)
            if b is not None:
                rest.remove(b)
                pairs.append((a, b))
        return pairs

    # -- recording -------------------------------------------------------------------------------
    def record(self, results: Iterable[PairResult], unreachable: Mapping[str, str] | None = None) -> None:
        """Take one round's results (tests of pairs not planned are taken as they are) and the
        nodes whose agents the coordinator could not reach after them, with the reason."""
        batch = [_stamped(t, self.round, "", None) for t in results]
        self.round += 1
        self._met.update(frozenset((t.a, t.b)) for t in batch)
        changed = False
        for t in batch:
            if t.ok and t.bandwidth_gbps is not None:
                for node in (t.a, t.b):
                    if t.bandwidth_gbps > self._best.get(node, -1.0):
                        self._best[node] = t.bandwidth_gbps
                        changed = True
        lost = {n: why for n, why in (unreachable or {}).items() if n in self.nodes and n not in self.unreachable}
        self.unreachable.update(lost)
        bests = sorted(self._best.values())
        if changed or lost:  # other nodes' new bests may turn past tests slow or back; start over
            self.tests = [self._classify(t, bests) for t in self.tests + batch]
            self._sound, self._blame, self._judged, self._slow_with = set(), {}, {}, {}
            new = self.tests
        else:
            new = [self._classify(t, bests) for t in batch]
            self.tests.extend(new)
        self._infer(new)

    def median(self) -> float | None:
        """The median of the nodes' best bandwidths."""
        return statistics.median(self._best.values()) if self._best else None

    def _classify(self, t: PairResult, bests: list[float]) -> PairResult:
        """Slow below the fraction of the others' median: the median of every other node's best."""
        if not t.ok or t.bandwidth_gbps is None:
            return _stamped(t, t.round, FAIL, None)
        reference = median_without(bests, [self._best[n] for n in {t.a, t.b} if n in self._best])
        slow = reference is not None and t.bandwidth_gbps < self.slow_fraction * reference
        return _stamped(t, t.round, SLOW if slow else PASS, reference)

    def _infer(self, new: list[PairResult]) -> None:
        """Add what the new tests prove: passes make nodes sound, and a sound partner turns every
        failed or slow test of the other node, old or new, into proof against it. Tests with an
        unreachable node prove nothing but a pass of its partner."""
        fresh = {n for t in new if t.outcome == PASS for n in (t.a, t.b)} - self._sound - set(self.unreachable)
        self._sound |= fresh
        telling = [t for t in new if t.outcome != PASS and t.a not in self.unreachable and t.b not in self.unreachable]
        for t in telling:
            for node in (t.a, t.b):
                self._blame.setdefault(node, []).append(t)
        # Proof comes from a test whose partner is sound: the fresh sound nodes' old tests, and new ones.
        for t in [t for n in fresh for t in self._blame.get(n, ())] + telling:
            for node in (t.a, t.b):
                partner = t.partner(node)
                if partner not in self._sound or node in self._sound or self._judged.get(node) == FAULTY:
                    continue
                if t.outcome == FAIL:
                    self._judged[node] = FAULTY
                else:
                    self._slow_with.setdefault(node, set()).add(partner)
                    if len(self._slow_with[node]) >= SLOW_PROOFS:
                        self._judged[node] = STRAGGLER
        for node in fresh:
            self._judged.pop(node, None)

    def result(self) -> Result:
        status = {n: UNREACHABLE if n in self.unreachable else SOUND if n in self._sound
                  else self._judged.get(n, UNRESOLVED) for n in self.nodes}
        evidence: dict[str, list[PairResult]] = {n: [] for n in self.nodes}
        for t in self.tests:
            for node in {t.a, t.b}:
                evidence[node].append(t)
        return Result(status, evidence, self.round, self.median(), list(self.tests), dict(self.unreachable))


def _stamped(t: PairResult, round_: int, outcome: str, reference: float | None) -> PairResult:
    """`t` as recorded (dataclasses.replace costs ten times more, and a 1000-node check makes many)."""
    return PairResult(round_, t.a, t.b, t.ok, t.bandwidth_gbps if t.ok else None, t.error, outcome, t.method,
                      t.retransmitted, reference)


def median_without(ordered: list[float], drop: list[float]) -> float | None:
    """The median of the sorted `ordered` with one occurrence of each value in `drop` left out
    (each is in it); None when nothing is left."""
    positions: list[int] = []
    for value in sorted(drop):
        lo = positions[-1] + 1 if positions and ordered[positions[-1]] == value else 0
        positions.append(bisect_left(ordered, value, lo))
    left = len(ordered) - len(positions)
    if left <= 0:
        return None

    def kth(i: int) -> float:
        for p in positions:
            if p <= i:
                i += 1
        return ordered[i]
    return kth(left // 2) if left % 2 else (kth(left // 2 - 1) + kth(left // 2)) / 2


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
                  | ({"error": result.unreachable[n]} if n in result.unreachable else {})
                  for n, s in sorted(result.status.items())},
    }


TEST_NAMES = {"tcp": "TCP stream", "rdma": "RDMA WRITE"}


def describe(t: PairResult) -> str:
    """What a test measured between which nodes, in one line: the evidence."""
    if not t.ok:
        return t.error or f"{TEST_NAMES.get(t.method, 'test')} {t.a} -> {t.b}: failed"
    text = f"{TEST_NAMES.get(t.method, 'test')} {t.a} -> {t.b}: {t.bandwidth_gbps:.3g} Gb/s"
    if t.reference_gbps:
        text += f", {t.bandwidth_gbps / t.reference_gbps:.2g} x the other nodes' median {t.reference_gbps:.3g} Gb/s"
    if t.retransmitted:
        text += f", {100 * t.retransmitted:.2g} % of segments sent again (loss)"
    return text


def _test_dict(t: PairResult, node: str) -> dict:
    d = {"round": t.round, "partner": t.partner(node), "role": "sender" if node == t.a else "receiver",
         "method": t.method, "outcome": t.outcome, "bandwidth_gbps": t.bandwidth_gbps,
         "reference_gbps": t.reference_gbps, "retransmitted": t.retransmitted, "evidence": describe(t)}
    if t.error:
        d["error"] = t.error
    return d
