"""Helpers every workload shares: where am I, which device, how to time honestly.

Inside the acceptance suite the plugin has already initialised torch.distributed; a workload run
alone (``torchrun -m workloads.AREA.NAME``) runs its ``main()`` inside ``distributed()``.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

LEVELS = ("quick", "standard", "extended")


@dataclass(frozen=True, slots=True)
class Place:
    """This process's place in the job, read from torchrun's environment."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    device: torch.device


def place() -> Place:
    """Where this process runs. Device = LOCAL_RANK % device count, never RANK."""
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank % torch.cuda.device_count())
    else:
        device = torch.device("cpu")
    rank = dist.get_rank() if dist.is_initialized() else int(os.environ.get("RANK", "0"))
    world = dist.get_world_size() if dist.is_initialized() else int(os.environ.get("WORLD_SIZE", "1"))
    return Place(
        rank=rank,
        world_size=world,
        local_rank=local_rank,
        local_world_size=int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
        node_rank=int(os.environ.get("GROUP_RANK", "0")),
        device=device,
    )


def start_process_group(backend: str, **kwargs: Any) -> None:
    """``dist.init_process_group``, with torch._dynamo imported first so the group can be ended.

    Why: torch._dynamo, imported for the first time while a process group exists (DDP's
    constructor and torch.compile import it), keeps references to that group, and then
    ``destroy_process_group()`` cannot free it. A gloo backend that is never freed keeps its worker
    threads into interpreter shutdown, where a worker that drops the last collective's tensors must
    take the GIL: Python ends that thread inside C++ and the process aborts ("terminate called
    without an active exception", SIGABRT). Imported first, dynamo holds nothing of the group.
    """
    import torch._dynamo  # noqa: F401  (the import is the point: see above)

    dist.init_process_group(backend, **kwargs)


def end_process_groups() -> None:
    """Destroy every process group and join gloo's worker threads: the clean path's last step.

    Only where every rank has finished its collectives: with a peer still mid-collective this can
    block until the group's timeout.
    """
    if dist.is_initialized():
        dist.destroy_process_group()


def ensure_distributed(timeout_s: float = 600.0) -> Place:
    """The default process group for a workload run alone under torchrun (or alone): one is started
    if none exists. ``distributed()`` also ends it; use that in a ``main()``."""
    if not dist.is_initialized():
        here = place()
        if torch.cuda.is_available():
            torch.cuda.set_device(here.device)
        backend = "nccl" if here.device.type == "cuda" else "gloo"
        if "RANK" in os.environ:
            start_process_group(backend, timeout=timedelta(seconds=timeout_s))
        else:
            start_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    return place()


@contextmanager
def distributed(timeout_s: float = 600.0) -> Iterator[Place]:
    """A workload's ``main()`` runs inside this: the default group is started if none exists, and a
    group started here is ended when the body finishes. Not on an exception: peers may still be in a
    collective, and the process is failing anyway."""
    started = not dist.is_initialized()
    here = ensure_distributed(timeout_s)
    yield here
    if started:
        end_process_groups()


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_runs(fn: Callable[[], object], device: torch.device, warmup: int, repeats: int) -> list[float]:
    """Seconds per call of ``fn``, each timed on its own, after ``warmup`` untimed calls.

    CUDA work is asynchronous: on a GPU each call is bracketed by CUDA events; on the CPU by a
    monotonic clock (the CPU work is synchronous).
    """
    for _ in range(warmup):
        fn()
    synchronize(device)
    times: list[float] = []
    if device.type == "cuda":
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
        for start, end in zip(starts, ends, strict=True):
            start.record()
            fn()
            end.record()
        torch.cuda.synchronize(device)
        times = [s.elapsed_time(e) / 1e3 for s, e in zip(starts, ends, strict=True)]
    else:
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return times


def summarize(times: Sequence[float]) -> dict[str, float]:
    """Median, min and max of a list of timings (seconds)."""
    return {"median_s": statistics.median(times), "min_s": min(times), "max_s": max(times)}


def check_level(level: str) -> str:
    if level not in LEVELS:
        raise ValueError(f"level {level!r} is not one of {', '.join(LEVELS)}")
    return level
