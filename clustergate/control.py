"""The plugin's own collectives, over the gloo control group.

Every exchange goes through here so that a lost peer (a rank that died, a collective that timed
out) becomes one ``ControlLost`` with a clear message instead of an obscure traceback.
"""

from __future__ import annotations

from typing import Any, TypeVar

import torch
import torch.distributed as dist

from clustergate.world import World

T = TypeVar("T")


class ControlLost(RuntimeError):
    """A control collective failed: a peer rank died or stopped answering."""


def _guard(what: str, exc: BaseException) -> ControlLost:
    return ControlLost(f"control exchange '{what}' failed: a peer rank died or stopped answering "
                       f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})")


def gather_to_leader(world: World, obj: T, what: str) -> list[T] | None:
    """Every rank's ``obj``, in rank order, on rank 0; None on other ranks."""
    if world.control is None:
        return [obj]
    out: list[Any] | None = [None] * world.world_size if world.is_leader else None
    try:
        dist.gather_object(obj, out, dst=0, group=world.control)
    except Exception as exc:  # gloo raises RuntimeError/DistError subclasses on a lost peer
        raise _guard(what, exc) from exc
    return out


def broadcast_from_leader(world: World, obj: T | None, what: str) -> T:
    """Rank 0's ``obj`` on every rank."""
    if world.control is None:
        return obj  # type: ignore[return-value]
    box = [obj]
    try:
        dist.broadcast_object_list(box, src=0, group=world.control)
    except Exception as exc:
        raise _guard(what, exc) from exc
    return box[0]  # type: ignore[return-value]


def all_gather(world: World, obj: T, what: str) -> list[T]:
    """Every rank's ``obj`` on every rank, in rank order."""
    if world.control is None:
        return [obj]
    out: list[Any] = [None] * world.world_size
    try:
        dist.all_gather_object(out, obj, group=world.control)
    except Exception as exc:
        raise _guard(what, exc) from exc
    return out


def max_int(world: World, value: int, what: str) -> int:
    """The largest ``value`` over all ranks (for one exit status everywhere)."""
    if world.control is None:
        return value
    t = torch.tensor([value], dtype=torch.int64)
    try:
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=world.control)
    except Exception as exc:
        raise _guard(what, exc) from exc
    return int(t.item())
