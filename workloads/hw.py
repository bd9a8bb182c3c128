"""Helpers the per-GPU hardware workloads share: start together, cache size, memory, dtypes.

Per-GPU figures are measured on every GPU of a node at once (that is how they run in training,
and it exposes power, thermal and host-link limits), so each workload starts with one barrier.
"""

from __future__ import annotations

import gc

import torch
import torch.distributed as dist

DEFAULT_L2_BYTES = 64 << 20
"""Used when torch cannot say (CPU builds): at least H100's 50 MB and H200's 60 MB."""


def start_together() -> None:
    """One barrier so every rank measures at the same time.

    It is the workload's only collective, at its very start: after it a rank may raise without
    leaving its peers blocked in a collective.
    """
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


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
