"""Pair schedules: round-robin tournament rounds are disjoint, complete, and few."""

from __future__ import annotations

import itertools

import pytest

from workloads.interconnect.pairs import internode_schedule, intranode_schedule, partner, tournament


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


def test_internode_rounds_do_not_grow_with_the_node_count() -> None:
    for n_nodes in (4, 16, 64):
        nodes = [[8 * i + lr for lr in range(8)] for i in range(n_nodes)]
        rounds = internode_schedule(nodes, rounds=3)
        assert len(rounds) == 3
        for rnd in rounds:
            ranks = [x for p in rnd for x in p]
            assert len(ranks) == len(set(ranks)) == 8 * n_nodes  # every GPU busy, once
            assert all(a % 8 == b % 8 and a // 8 != b // 8 for a, b in rnd)  # same rail, other node
        partners = {i: {b // 8 for rnd in rounds for a, b in rnd if a == 8 * i} |
                    {a // 8 for rnd in rounds for a, b in rnd if b == 8 * i} for i in range(n_nodes)}
        assert all(len(p) == 3 for p in partners.values())  # three different partners per node


def test_internode_all_rounds_cover_every_node_pair_and_odd_counts_rest_one() -> None:
    nodes = [[2 * i, 2 * i + 1] for i in range(5)]
    rounds = internode_schedule(nodes, rounds=0)
    assert len(rounds) == 5
    node_pairs = {(a // 2, b // 2) for r in rounds for a, b in r}
    assert node_pairs == set(itertools.combinations(range(5), 2))
    assert all(len(r) == 4 for r in rounds)  # 2 node pairs x 2 rails; the fifth node rests


def test_partner_lookup() -> None:
    rnd = [(0, 3), (1, 2)]
    assert (partner(rnd, 3), partner(rnd, 1), partner(rnd, 7)) == (0, 2, None)


def test_nodes_of_unequal_size_pair_only_shared_rails() -> None:
    rounds = internode_schedule([[0, 1, 2], [3, 4]], rounds=0)
    assert rounds == [[(0, 3), (1, 4)]]
