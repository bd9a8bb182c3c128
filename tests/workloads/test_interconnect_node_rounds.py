"""Rounds of node pairs (workloads.interconnect.node_rounds): suspects re-paired with known-good nodes.

Pure logic over simulated fleets: a node's links run at its speed, a pair at its slower end. The
rounds are fixed whatever the node count, every round is disjoint, a slow node is excluded with the
evidence of a known-good partner, and its healthy partners are not.
"""

from __future__ import annotations

import random

import pytest

from clustergate.criteria.criterion import Criterion
from workloads.interconnect.node_rounds import EXCLUDED, GOOD, NodeRounds, PairResult, no_floor, simulate

FLOOR = Criterion.of(min=0.001, outlier_fraction=0.7).floor


def fleet(n: int, slow: list[int], rng: random.Random | None = None) -> list[float]:
    rng = rng or random.Random(0)
    return [rng.uniform(0.1, 0.4) if i in slow else rng.uniform(0.85, 1.15) for i in range(n)]


@pytest.mark.parametrize("n", [2, 3, 4, 5, 16, 33, 1000])
def test_rounds_are_fixed_and_disjoint(n: int) -> None:
    state = simulate(fleet(n, []), 3, FLOOR)
    assert len(state.plans) == 3
    for plan in state.plans:
        nodes = [x for pair in plan for x in pair]
        assert len(nodes) == len(set(nodes)) and len(plan) == n // 2  # every node busy but an odd one out
    assert state.excluded() == [] and all(s == GOOD for s in state.status)
    if n >= 4:  # a healthy fleet meets new partners each round
        pairs = [p for plan in state.plans for p in plan]
        assert len(pairs) == len(set(pairs))


def test_slow_node_excluded_with_a_known_good_partner_and_its_first_partner_cleared() -> None:
    state = simulate(fleet(4, [3]), 3, FLOOR)
    assert state.excluded() == [3]
    first = next(a for a, b in state.plans[0] if b == 3)
    assert state.status[first] == GOOD
    assert state.evidence[first][0].endswith("below the floor: suspect")
    assert state.evidence[first][1].endswith("passed, cleared") and "(known good)" in state.evidence[first][1]
    assert "(known good)" in state.evidence[3][1] and state.evidence[3][1].endswith("excluded")
    # Round 2 paired each suspect with a node that passed round 1.
    round1_good = {x for pair in state.plans[0] for x in pair} - {3, first}
    assert all(({s, *p} - {s}) <= round1_good for s in (3, first) for p in state.plans[1] if s in p)


def test_many_slow_nodes_in_a_large_fleet_in_three_rounds() -> None:
    rng = random.Random(3)
    for trial in range(20):
        n = rng.choice([8, 50, 200, 1000])
        slow = rng.sample(range(n), max(1, n // 20))
        state = simulate(fleet(n, slow, rng), 3, FLOOR)
        assert sorted(state.excluded()) == sorted(slow), (trial, n)


def test_two_nodes_cannot_tell_which_end_is_slow() -> None:
    """One pair, no known-good node: both stay suspects and are excluded as unresolved (the min decides)."""
    state = simulate([0.0005, 1.0], 3, FLOOR)
    assert state.excluded() == [0, 1]
    assert all(ev[-1].startswith("unresolved after 3 rounds") for ev in state.evidence)
    assert simulate([0.9, 1.0], 3, FLOOR).excluded() == []


def test_the_floor_is_the_criterion() -> None:
    assert Criterion.of(min=40).floor([48, 47, 10]) == 40
    assert Criterion.of(min=40, outlier_fraction=0.9).floor([50, 50, 10]) == 45
    assert Criterion().floor([1.0]) == 0.0 == no_floor([1.0])
    assert Criterion.of(outlier_fraction=0.9).floor([]) == 0.0  # nothing measured yet: no peers to compare with


def test_a_missing_figure_fails_the_pair_and_json_records_the_rounds() -> None:
    state = NodeRounds(2, 1, FLOOR, labels=["a", "b"])
    assert state.plan() == [(0, 1)]
    state.update([PairResult(0, 0, 1, [None, 5.0])])
    state.finish()
    out = state.as_json()
    assert out["rounds"] == 1 and out["plans"] == [[[0, 1]]]
    assert out["pairs"][0]["slowest_gbps"] == 5.0 and out["pairs"][0]["slowest_rail"] == 1
    state2 = NodeRounds(2, 1, FLOOR)
    state2.plan()
    state2.update([PairResult(0, 0, 1, [None])])
    state2.finish()
    assert state2.status == [EXCLUDED, EXCLUDED] and "no figure" in state2.evidence[0][0]


def test_rounds_must_be_positive() -> None:
    with pytest.raises(ValueError, match="at least one round"):
        NodeRounds(4, 0)
