"""RDMA rails between two nodes: HCA i of one node against HCA i of the other (pure logic, no torch).

The fabric phase's node pairs (``workloads.interconnect.node_rounds``, the schedule the NCCL pair rounds use) say
which nodes meet in a round; here each met pair is split into its rails. A node's rails are its ACTIVE InfiniBand
or RoCE ports in the order of their names (mlx5_2 before mlx5_10, as a rail-optimised fabric cables them), so rail
i is the i-th port of each node. A round runs rail by rail: in step s every pair that has a rail s measures it,
one perftest server and one client per node at a time, the lower node of the pair as the server.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from workloads.interconnect.node_rounds import NodePair


def natural_key(name: str) -> tuple[tuple[int, int | str], ...]:
    """Sort key of a port label ('mlx5_10/1'): its numbers as numbers, so a node's ports sort in rail order."""
    return tuple((0, int(part)) if part.isdigit() else (1, part) for part in re.split(r"(\d+)", name) if part)


@dataclass(frozen=True, slots=True)
class Rail:
    """One rail of one node pair in one step: the server node, the client node, the rail's index."""

    server: int
    client: int
    index: int


def steps(node_pairs: list[NodePair], rails: dict[int, int]) -> list[list[Rail]]:
    """The steps of one round: step s holds rail s of every pair whose nodes both have an s-th port
    (``rails``: each node's count of ports). No node is in two rails of one step."""
    width = {pair: min(rails.get(pair[0], 0), rails.get(pair[1], 0)) for pair in node_pairs}
    depth = max(width.values(), default=0)
    return [[Rail(a, b, s) for (a, b) in node_pairs if s < width[(a, b)]] for s in range(depth)]


def role(step: list[Rail], node: int) -> tuple[str, Rail] | None:
    """What ``node`` does in ``step``: ('server' or 'client', its rail), or None when it rests."""
    for rail in step:
        if node == rail.server:
            return "server", rail
        if node == rail.client:
            return "client", rail
    return None
