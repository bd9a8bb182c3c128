"""workloads.node.rendezvous: names that do not resolve and a store nobody serves are named."""

from __future__ import annotations

import socket

from workloads.node import rendezvous

from torchrun_job import free_port


def test_a_name_that_resolves_neither_way_is_named() -> None:
    here = (socket.gethostname(), socket.getfqdn())
    assert rendezvous.name_problems([here, here]) == []
    [problem] = rendezvous.name_problems([here, ("no-such-node.invalid", "no-such-node.invalid")])
    assert problem.startswith("cannot resolve 'no-such-node.invalid' (nor 'no-such-node.invalid'): ")


def test_a_store_nobody_serves_is_a_problem_not_a_hang() -> None:
    problem = rendezvous.store_problem("127.0.0.1", free_port(), rank=0, world_size=2, timeout_s=2)
    assert problem is not None and problem.startswith("rendezvous store 127.0.0.1:")


def test_one_rank_job_has_nothing_to_reach(gloo_world: None) -> None:
    result = rendezvous.run(rendezvous.Config())
    assert result.details["problems"] == [] and result.details["hosts"]
