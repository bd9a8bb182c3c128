"""The job as torchrun describes it: process groups, this rank's place, and the control group.

Two groups: the default group (NCCL where CUDA is present, gloo otherwise) belongs to the
workloads; a separate gloo group carries the plugin's own traffic (outcomes, metrics, verdicts)
with a longer timeout, so a workload's broken NCCL state never blocks the verdict.
"""

from __future__ import annotations

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


def init_world(collective_timeout_s: float, control_timeout_s: float, want_cuda: bool) -> World:
    """Initialise process groups from torchrun's environment (world size 1 without torchrun)."""
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
            start_process_group(backend, timeout=timeout, **kwargs)
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
