"""Who talks to whom: the job's nodes, the interconnect scopes and their process groups.

Scopes (the metric name says which, see workloads.interconnect.collectives):
- ``node``: one group per node, every node at once (NVLink/PCIe/SHM inside a node);
- ``world``: every rank (the fabric as training uses it);
- ``net``: one rank per node, every "rail" at once (rail l = the ranks with the l-th local rank of
  every node): the network alone, each NIC under load together.

``new_group`` must be called by every rank for every group, in the same order: groups are created
through ``new_subgroups_by_enumeration`` (which does exactly that) once per (scope, NCCL_ALGO) and
cached for the job. Each is created inside an ``nccl_log.Capture``, so NCCL's own log of the new
communicator (its channels, transports, graph) is kept; NCCL_ALGO, when pinned, is set only while
the communicator initialises (NCCL reads it then).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from workloads.common import backend_device, gather_objects, synchronize
from workloads.interconnect.nccl_log import Capture, NcclLog
from workloads.node.name import node_name

SCOPES = ("node", "world", "net")


@dataclass(frozen=True, slots=True)
class Layout:
    """Node index and host of every global rank (from torchrun's GROUP_RANK)."""

    node_of: tuple[int, ...]
    host_of: tuple[str, ...]

    def nodes(self) -> list[list[int]]:
        """Ranks of each node, nodes in node-index order, ranks ascending."""
        by_node: dict[int, list[int]] = {}
        for rank, node in enumerate(self.node_of):
            by_node.setdefault(node, []).append(rank)
        return [by_node[k] for k in sorted(by_node)]

    def rails(self) -> list[list[int]]:
        """Rail l: the l-th rank of every node that has one; rails with one rank are left out."""
        nodes = self.nodes()
        width = max(len(n) for n in nodes)
        rails = [[n[lr] for n in nodes if len(n) > lr] for lr in range(width)]
        return [r for r in rails if len(r) > 1]

    def members(self, scope: str) -> list[list[int]]:
        if scope == "node":
            return self.nodes()
        if scope == "world":
            return [list(range(len(self.node_of)))]
        if scope == "net":
            return self.rails()
        raise ValueError(f"scope {scope!r} is not one of {', '.join(SCOPES)}")

    def hosts(self, ranks: Iterable[int]) -> int:
        """Distinct hosts among ``ranks`` (two torchrun agents on one host are two nodes, one host)."""
        return len({self.host_of[r] for r in ranks})

    def label(self, scope: str, ranks: tuple[int, ...]) -> str:
        if scope == "node":
            return f"node {self.node_of[ranks[0]]} ({self.host_of[ranks[0]]})"
        if scope == "net":
            return f"rail {self.nodes()[self.node_of[ranks[0]]].index(ranks[0])} ({len(ranks)} nodes)"
        return f"whole job ({len(ranks)} ranks)"


_LAYOUT: list[Layout] = []


def is_nccl() -> bool:
    """The default group runs on NCCL (a CUDA run); otherwise gloo (a CPU run)."""
    return "nccl" in str(dist.get_backend())


def layout() -> Layout:
    """The job's layout, exchanged once over the default group (every rank must call it)."""
    if not _LAYOUT:
        mine = (int(os.environ.get("GROUP_RANK", "0")), node_name())
        everyone = gather_objects(mine)
        # Node indices as torchrun numbers them; nodes compacted to 0..N-1 in that order.
        order = {node: i for i, node in enumerate(sorted({n for n, _ in everyone}))}
        _LAYOUT.append(Layout(node_of=tuple(order[n] for n, _ in everyone), host_of=tuple(h for _, h in everyone)))
    return _LAYOUT[0]


@dataclass(slots=True)
class ScopeComm:
    """This rank's group in one scope, and what NCCL logged about it."""

    scope: str
    nccl_algo: str
    group: Any
    """This rank's ProcessGroup; None when the rank is in no group of the scope."""
    members: tuple[int, ...]
    label: str
    all_members: list[list[int]]
    log: NcclLog = field(default_factory=NcclLog)
    capture: dict[str, Any] = field(default_factory=dict)

    @property
    def active(self) -> bool:
        """The rank is in a group of two or more: it has traffic to measure."""
        return self.group is not None and len(self.members) > 1

    @property
    def size(self) -> int:
        return len(self.members)

    @property
    def group_rank(self) -> int:
        return self.members.index(dist.get_rank())

    @contextmanager
    def window(self) -> Iterator[None]:
        """NCCL's log of what happens inside (first use of a size, a peer, an algorithm) joins ``log``."""
        with Capture(enabled=is_nccl()) as cap:
            yield
            synchronize(backend_device())
        self.log.merge(cap.log())
        self.capture = cap.describe()


_COMMS: dict[tuple[str, str], ScopeComm] = {}


def scope_comm(scope: str, nccl_algo: str = "") -> ScopeComm:
    """This rank's group of ``scope``; created on first use on every rank (a collective call)."""
    key = (scope, nccl_algo)
    if key in _COMMS:
        return _COMMS[key]
    lay = layout()
    lists = lay.members(scope)
    env = {"NCCL_ALGO": nccl_algo} if nccl_algo else {}
    nccl = is_nccl()
    me = dist.get_rank()
    with Capture(enabled=nccl, env=env) as cap:
        if lists:
            mine, _ = dist.new_subgroups_by_enumeration(lists, group_desc=f"clustergate_{scope}_{nccl_algo or 'auto'}")
        else:
            mine = None
        members = tuple(next((r for r in lists if me in r), []))
        if mine is not None and len(members) > 1:
            # A lazily created communicator is made by its first collective: make it here, in the capture.
            dist.all_reduce(torch.ones(1, device=backend_device()), group=mine)
        synchronize(backend_device())
    comm = ScopeComm(scope=scope, nccl_algo=nccl_algo, group=mine, members=members,
                     label=lay.label(scope, members) if members else "no group", all_members=lists,
                     log=cap.log(), capture=cap.describe())
    if nccl_algo and nccl and cap.mode != "off" and comm.active and "NCCL_ALGO" not in comm.log.env:
        comm.capture["algo_pin"] = f"NCCL did not log 'NCCL_ALGO set by environment to {nccl_algo}'"
    _COMMS[key] = comm
    return comm
