"""Rounds of node pairs that find the node to blame for a slow link (pure logic, no torch).

Every round pairs the nodes disjointly and all pairs are measured at once (``workloads.interconnect
.pairs`` does the measuring). A pair is judged by its slowest rail (the same local rank on both
nodes); below the floor both nodes become suspects, since a slow pair does not say which end is bad.
The next round pairs each suspect with a node already known good: a suspect that is slow again with
a known-good partner is excluded, with both figures as evidence; one that is fast is cleared. Nodes
that are not suspects meet partners they have not met yet, so a healthy fleet still gets new pairs
every round. The number of rounds is fixed by the caller, whatever the node count: a suspect still
unresolved after the last round (no known-good partner was free, e.g. in a 2-node job) is excluded as
unresolved, which the evidence says.

The floor comes from the caller as a function of the figures measured so far (each node's median pair
figure): the acceptance test passes the pair metric's criterion (``Criterion.floor`` in
clustergate/criteria/criterion.py, where a criterion's meaning lives: ``max(min, outlier_fraction x median)``),
so one slow node cannot drag the reference down much and a fleet-wide fall still meets the absolute
``min``.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

UNTESTED, GOOD, SUSPECT, EXCLUDED = "untested", "good", "suspect", "excluded"
NodePair = tuple[int, int]


FloorRule = Callable[[Sequence[float]], float]
"""What a pair must reach, given the figures it is compared with (each node's median pair figure so far)."""


def no_floor(figures: Sequence[float]) -> float:
    """Every pair passes: the rounds only measure."""
    return 0.0


@dataclass(slots=True)
class PairResult:
    """One node pair of one round: its slowest rail and every rail's figure (None: not measured)."""

    round: int
    a: int
    b: int
    rails: list[float | None]
    floor: float = 0.0
    passed: bool = True

    @property
    def slowest(self) -> float | None:
        known = [v for v in self.rails if v is not None]
        return min(known) if known else None

    @property
    def slowest_rail(self) -> int | None:
        known = [(v, i) for i, v in enumerate(self.rails) if v is not None]
        return min(known)[1] if known else None


@dataclass(slots=True)
class NodeRounds:
    """The state of the rounds: each node's status and the evidence behind it."""

    nodes: int
    rounds: int
    floor: FloorRule = no_floor
    criterion: dict[str, Any] = field(default_factory=dict)
    """The criterion the floor stands for, as recorded in the evidence (``details["node_rounds"]["floor"]``)."""
    status: list[str] = field(default_factory=list)
    evidence: list[list[str]] = field(default_factory=list)
    results: list[PairResult] = field(default_factory=list)
    plans: list[list[NodePair]] = field(default_factory=list)
    labels: list[str] = field(default_factory=list)
    """Node names for the evidence (default: node index)."""
    unit: str = "GB/s"
    """The figures' unit, as the evidence says it (the RDMA rails' are Gb/s)."""

    def __post_init__(self) -> None:
        if self.rounds < 1:
            raise ValueError(f"rounds={self.rounds}: at least one round of node pairs")
        self.status = [UNTESTED] * self.nodes
        self.evidence = [[] for _ in range(self.nodes)]
        if not self.labels:
            self.labels = [f"node {i}" for i in range(self.nodes)]

    def met(self, a: int, b: int) -> bool:
        return any({r.a, r.b} == {a, b} for r in self.results)

    def plan(self) -> list[NodePair]:
        """The next round's disjoint node pairs: suspects with known-good nodes first, then the rest
        with partners they have not met (untested nodes first, so an odd one out rests only once)."""
        used: set[int] = set()
        pairs: list[NodePair] = []
        good = [n for n in range(self.nodes) if self.status[n] == GOOD]
        for s in (n for n in range(self.nodes) if self.status[n] == SUSPECT):
            free = [g for g in good if g not in used]
            if free:
                g = next((g for g in free if not self.met(s, g)), free[0])
                pairs.append((min(s, g), max(s, g)))
                used |= {s, g}
        order = {UNTESTED: 0, SUSPECT: 1, GOOD: 2}
        rest = sorted((n for n in range(self.nodes) if n not in used and self.status[n] != EXCLUDED),
                      key=lambda n: (order[self.status[n]], n))
        while len(rest) >= 2:
            a = rest.pop(0)
            # From the far end: the first round pairs 0 with n-1 (as a tournament does), mixing racks.
            b = next((c for c in reversed(rest) if not self.met(a, c)), rest[-1])
            rest.remove(b)
            pairs.append((min(a, b), max(a, b)))
        pairs.sort()
        self.plans.append(pairs)
        return pairs

    def reference(self) -> list[float]:
        """Each node's median pair figure so far: what the floor's median is taken over. Per node, not per
        pair, so a slow node that met many partners counts once."""
        per_node: dict[int, list[float]] = {}
        for r in self.results:
            if r.slowest is not None:
                per_node.setdefault(r.a, []).append(r.slowest)
                per_node.setdefault(r.b, []).append(r.slowest)
        return [statistics.median(v) for v in per_node.values()]

    def update(self, measured: list[PairResult]) -> None:
        """Add one round's pairs and judge every round so far against the floor they now give."""
        self.results += measured
        self._judge(self.floor(self.reference()))

    def finish(self) -> None:
        """After the last round: judged once more on the final floor; a suspect never cleared is excluded
        as unresolved."""
        self._judge(self.floor(self.reference()))
        for n in range(self.nodes):
            if self.status[n] == SUSPECT:
                self.status[n] = EXCLUDED
                self.evidence[n].append(f"unresolved after {self.rounds} rounds: no known-good partner was free "
                                        "to re-test it, so it cannot be cleared")

    def _judge(self, floor: float) -> None:
        """Every node's status and evidence from all pairs measured so far, round by round, on one floor."""
        self.status = [UNTESTED] * self.nodes
        self.evidence = [[] for _ in range(self.nodes)]
        for k in sorted({r.round for r in self.results}):
            before = list(self.status)
            for r in (r for r in self.results if r.round == k):
                self._judge_pair(r, floor, before)

    def _judge_pair(self, r: PairResult, floor: float, before: list[str]) -> None:
        r.floor = floor
        slowest = r.slowest
        r.passed = slowest is not None and slowest >= floor
        rail = f" (rail {r.slowest_rail})" if len(r.rails) > 1 else ""
        said = (f"round {r.round + 1}: {slowest:.4g} {self.unit}{rail} with {{partner}}, floor {floor:.4g} {self.unit}"
                if slowest is not None else f"round {r.round + 1}: no figure with {{partner}}")
        for me, other in ((r.a, r.b), (r.b, r.a)):
            line = said.format(partner=self.labels[other] + (" (known good)" if before[other] == GOOD else ""))
            if before[me] == EXCLUDED:  # measured again only where an earlier floor had not yet excluded it
                self.evidence[me].append(f"{line}: {'passed' if r.passed else 'below the floor'} (already excluded)")
            elif r.passed:
                if before[me] in (UNTESTED, SUSPECT):
                    self.status[me] = GOOD
                    self.evidence[me].append(f"{line}: passed" + (", cleared" if before[me] == SUSPECT else ""))
            elif before[other] == GOOD and before[me] != GOOD:
                self.status[me] = EXCLUDED
                self.evidence[me].append(f"{line}: below the floor with a known-good partner: excluded")
            elif before[me] == GOOD and before[other] != GOOD:
                self.evidence[me].append(f"{line}: below the floor; the partner is to blame (this node is known good)")
            else:
                self.status[me] = SUSPECT
                self.evidence[me].append(f"{line}: below the floor: suspect")

    def excluded(self) -> list[int]:
        return [n for n in range(self.nodes) if self.status[n] == EXCLUDED]

    def as_json(self) -> dict[str, Any]:
        return {
            "rounds": self.rounds,
            "floor": self.criterion,
            "plans": [[list(p) for p in plan] for plan in self.plans],
            "pairs": [{"round": r.round + 1, "a": self.labels[r.a], "b": self.labels[r.b], "node_a": r.a,
                       "node_b": r.b, "slowest_gbps": r.slowest, "slowest_rail": r.slowest_rail,
                       "rails_gbps": r.rails, "floor_gbps": r.floor, "passed": r.passed} for r in self.results],
            "nodes": [{"node": n, "host": self.labels[n], "status": self.status[n], "evidence": self.evidence[n]}
                      for n in range(self.nodes)],
            "excluded": [{"node": n, "host": self.labels[n], "evidence": self.evidence[n]} for n in self.excluded()],
        }


def simulate(speeds: list[float], rounds: int, floor: FloorRule) -> NodeRounds:
    """The rounds over nodes whose link speed is ``speeds[n]`` (a pair runs at its slower end): for
    tests and for sizing ``rounds`` (see tests/workloads/test_interconnect_node_rounds.py)."""
    state = NodeRounds(len(speeds), rounds, floor)
    for k in range(rounds):
        pairs = state.plan()
        state.update([PairResult(k, a, b, [min(speeds[a], speeds[b])]) for a, b in pairs])
    state.finish()
    return state
