"""Pair schedules: round-robin tournament rounds are disjoint, complete, and few; rails pair like with like."""

from __future__ import annotations

import itertools

import pytest

from workloads.interconnect.pairs import intranode_schedule, partner, rail_pairs, tournament


@pytest.mark.parametrize("n", range(1, 18))
def test_tournament_meets_every_pair_once_in_disjoint_rounds(n: int) -> None:
    rounds = tournament(n)
    if n > 1:
        assert len(rounds) == (n - 1 if n % 2 == 0 else n)
    seen = [p for rnd in rounds for p in rnd]
    assert sorted(seen) == list(itertools.combinations(range(n), 2))  # every pair exactly once
    for rnd in rounds:
        players = [x for p in rnd for x in p]
        assert len(players) == len(set(players))  # nobody plays twice in a round
        assert len(rnd) == n // 2  # as many pairs at once as possible


def test_intranode_rounds_run_every_node_at_once() -> None:
    nodes = [[0, 1, 2, 3], [4, 5, 6, 7]]
    rounds = intranode_schedule(nodes)
    assert len(rounds) == 3 and all(len(r) == 4 for r in rounds)
    pairs = {p for r in rounds for p in r}
    assert pairs == set(itertools.combinations(range(4), 2)) | set(itertools.combinations(range(4, 8), 2))
    assert all(a // 4 == b // 4 for a, b in pairs)  # never across nodes


def test_rail_pairs_pair_every_local_rank_with_the_same_on_the_partner_node() -> None:
    nodes = [[8 * i + lr for lr in range(8)] for i in range(4)]
    pairs = rail_pairs(nodes, [(0, 3), (1, 2)])
    ranks = [x for p in pairs for x in p]
    assert len(ranks) == len(set(ranks)) == 32  # every GPU busy, once
    assert all(a % 8 == b % 8 and a // 8 != b // 8 for a, b in pairs)  # same rail, other node
    assert {(a // 8, b // 8) for a, b in pairs} == {(0, 3), (1, 2)}


def test_partner_lookup() -> None:
    rnd = [(0, 3), (1, 2)]
    assert (partner(rnd, 3), partner(rnd, 1), partner(rnd, 7)) == (0, 2, None)


def test_nodes_of_unequal_size_pair_only_shared_rails() -> None:
    assert rail_pairs([[0, 1, 2], [3, 4]], [(0, 1)]) == [(0, 3), (1, 4)]
