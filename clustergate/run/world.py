"""The job as torchrun describes it: process groups, this rank's place, and the control group.

Two groups: the default group (NCCL where CUDA is present, gloo otherwise) belongs to the
workloads; a separate gloo group carries the plugin's own traffic (outcomes, metrics, verdicts)
with a longer timeout, so a workload's broken NCCL state never blocks the verdict.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from workloads.common import PlacementError, end_process_groups, rank_device, start_process_group
from workloads.node.name import node_name

TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


class WorldError(RuntimeError):
    """The launch environment is inconsistent; the message says what to set."""


class StartupLost(WorldError):
    """Ranks that did not come to the start of the run in time: the process groups cannot form without them."""

    def __init__(self, message: str, missing: list[int]) -> None:
        super().__init__(message)
        self.missing = missing


@dataclass(slots=True)
class World:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    host: str
    device: torch.device
    backend: str
    control: dist.ProcessGroup | None
    """gloo group for the plugin's traffic; None at world size 1 (nothing to exchange)."""

    @property
    def is_leader(self) -> bool:
        return self.rank == 0

    @property
    def launched(self) -> bool:
        return self.world_size > 1


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None:
        return default
    try:
        return int(raw)
    except ValueError:
        raise WorldError(f"{name}={raw!r} is not an integer; torchrun sets it, do not set it by hand") from None


def meet_at_start(store: dist.Store, rank: int, world_size: int, local_world_size: int, host: str,
                  wait_s: float) -> None:
    """Every rank says it has come to the start of the run and waits up to ``wait_s`` for all the others, through
    the rendezvous store, before the process groups form: StartupLost naming the ranks that did not come (a
    conftest, an import or a plugin's configure that hangs), where the groups' own creation would wait their
    whole timeout and end in a traceback naming no one."""
    def key(r: int) -> str:
        return f"clustergate/start/{r}"

    store.set(key(rank), json.dumps({"host": host, "node": rank // max(local_world_size, 1)}))
    try:
        store.wait([key(r) for r in range(world_size)], timedelta(seconds=wait_s))
        return
    except Exception:  # the store's own timeout error; which ranks are missing says more
        missing = [r for r in range(world_size) if not store.check([key(r)])]
    if not missing:
        return
    here = [json.loads(store.get(key(r))) for r in range(world_size) if r not in missing]
    hosts = {h["node"]: h["host"] for h in here}

    def who(r: int) -> str:
        node = hosts.get(r // max(local_world_size, 1))
        return f"rank {r} ({node})" if node else f"rank {r}"

    names = ", ".join(who(r) for r in missing[:8]) + (f" and {len(missing) - 8} more" if len(missing) > 8 else "")
    raise StartupLost(f"{names} did not reach the start of the run within {wait_s:.0f} s of rank {rank} ({host}): "
                      "stuck before the process groups form (in a conftest, an import or a plugin's configure), or "
                      "started that much later than the others", missing)


def init_world(collective_timeout_s: float, control_timeout_s: float, want_cuda: bool, startup_s: float) -> World:
    """Initialise process groups from torchrun's environment (world size 1 without torchrun); every rank must
    come to the start within ``startup_s`` of the others (``meet_at_start``)."""
    rank = _env_int("RANK", 0)
    world_size = _env_int("WORLD_SIZE", 1)
    local_rank = _env_int("LOCAL_RANK", 0)
    if world_size > 1:
        missing = [v for v in TORCHRUN_VARS if v not in os.environ]
        if missing:
            raise WorldError(f"WORLD_SIZE={world_size} but {', '.join(missing)} unset: launch with torchrun")
    try:
        device = rank_device(local_rank, want_cuda)
    except PlacementError as exc:
        raise WorldError(str(exc)) from None
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        timeout = timedelta(seconds=collective_timeout_s)
        kwargs = {"device_id": device} if backend == "nccl" else {}
        if world_size > 1:
            store, _, _ = next(dist.rendezvous("env://", rank=rank, world_size=world_size, timeout=timeout))
            meet_at_start(store, rank, world_size, _env_int("LOCAL_WORLD_SIZE", 1), node_name(), startup_s)
            # As init_process_group's own env:// rendezvous would: the agent's store, under the group's prefix.
            start_process_group(backend, store=dist.PrefixStore("default_pg", store), rank=rank,
                                world_size=world_size, timeout=timeout, **kwargs)
        else:
            start_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout, **kwargs)
    control = None
    if world_size > 1:
        control = dist.new_group(backend="gloo", timeout=timedelta(seconds=control_timeout_s))
    return World(
        rank=rank, world_size=world_size, local_rank=local_rank,
        local_world_size=_env_int("LOCAL_WORLD_SIZE", 1), node_rank=_env_int("GROUP_RANK", 0),
        host=node_name(), device=device, backend=backend, control=control,
    )


def shutdown(world: World) -> None:
    """Destroy the process groups. Call only on a clean path: with peers mid-collective it can hang."""
    end_process_groups()
