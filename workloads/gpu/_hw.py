"""Helpers the per-GPU hardware workloads share: start together, cache size, memory, dtypes.

Per-GPU figures are measured on every GPU of a node at once (that is how they run in training,
and it exposes power, thermal and host-link limits), so each workload starts with one barrier.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from workloads.clocks import ClockSampler
from workloads.common import place, time_runs

T = TypeVar("T")

DEFAULT_L2_BYTES = 64 << 20
"""Used when torch cannot say (CPU builds): at least H100's 50 MB and H200's 60 MB."""


def start_together() -> None:
    """One barrier so every rank measures at the same time.

    It is the workload's only collective, at its very start: after it a rank may raise without
    leaving its peers blocked in a collective.
    """
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def each_at_once(items: Iterable[T], measure: Callable[[T, torch.Generator], dict[str, Any]], device: torch.device,
                 seed: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """(``measure(item, gen)`` for each item, the clock summary): every rank starts together, the clocks are
    sampled throughout, and device memory is released after, also on an error. ``gen`` is seeded per rank
    (seed + rank): different random data on every GPU."""
    gen = torch.Generator(device=device).manual_seed(seed + place().rank)
    start_together()
    try:
        with ClockSampler(device) as clocks:
            figures = [measure(item, gen) for item in items]
    finally:
        release(device)
    return figures, clocks.summary()


def timed(fn: Callable[[], object], device: torch.device, warmup: int, seconds: float, most: int) -> list[float]:
    """Times of ``fn`` after ``warmup`` runs: as many runs as fill about ``seconds`` (at least 5, at most ``most``),
    from the quicker of two trial runs."""
    one = min(time_runs(fn, device, warmup=1, repeats=2))
    return time_runs(fn, device, warmup=warmup, repeats=min(most, max(5, round(seconds / one))))


def l2_cache_bytes(device: torch.device) -> int:
    """Last-level cache of a GPU as CUDA reports it (``DEFAULT_L2_BYTES`` on CPU or when unknown)."""
    if device.type == "cuda":
        size = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0)
        if size:
            return int(size)
    return DEFAULT_L2_BYTES


def free_bytes(device: torch.device) -> int | None:
    """Free device memory, or None on CPU (host memory is not budgeted here)."""
    if device.type != "cuda":
        return None
    free, _total = torch.cuda.mem_get_info(device)
    return int(free)


def release(device: torch.device) -> None:
    """Give cached device memory back, so the next test starts with the GPU's memory free."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        if hasattr(torch._C, "_host_emptyCache"):  # pinned host buffers are cached too
            torch._C._host_emptyCache()


def capability(device: torch.device) -> tuple[int, int] | None:
    return torch.cuda.get_device_capability(device) if device.type == "cuda" else None


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return "CPU"
