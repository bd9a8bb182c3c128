"""Helpers the per-GPU hardware workloads share: start together, take turns, time calls, cache size, memory.

Most per-GPU figures are measured on every GPU of a node at once (that is how they run in training,
and it exposes power, thermal and host-link limits), so each workload starts with one barrier. The
host link of each GPU is judged alone (``in_turns``): with every GPU copying, a shared PCIe switch or
root complex measures the node, not the GPU.
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from workloads.clocks import ClockSampler, device_handle, init_nvml
from workloads.common import place, time_runs

T = TypeVar("T")

DEFAULT_L2_BYTES = 64 << 20
"""Used when torch cannot say (CPU builds): at least H100's 50 MB and H200's 60 MB."""


def start_together() -> None:
    """One barrier so every rank measures at the same time.

    At the workload's very start: after it a rank may raise without leaving its peers blocked in a
    collective (a workload that exchanges figures afterwards, as the host link's per-node figure does,
    exchanges its errors too and raises after).
    """
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


_HOST_GROUPS: dict[int, Any] = {}


def host_group() -> Any:
    """A gloo group over every rank, for waiting on the host; None where there is nobody to wait for.

    Why not the default (NCCL) group: a rank waiting in an NCCL barrier runs a kernel that spins on
    its GPU, and over the SHM transport polls host memory across PCIe; its GPU is not idle. Created
    once per default group (every rank calls this at the same point: a collective).
    """
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return None
    if "gloo" in str(dist.get_backend()):
        return dist.group.WORLD
    key = id(dist.group.WORLD)
    if key not in _HOST_GROUPS:
        _HOST_GROUPS[key] = dist.new_group(backend="gloo")
    return _HOST_GROUPS[key]


def in_turns(measure: Callable[[], T]) -> T:
    """``measure()`` on one GPU of each node at a time (the l-th local rank of every node together; nodes
    do not share a host link), the other ranks waiting on the host. Every rank walks the same turns, and
    an error is raised only after the last of them, so a failing rank never leaves its peers waiting."""
    group = host_group()
    here = place()
    if group is None:
        return measure()
    turns = torch.tensor([here.local_world_size], dtype=torch.int64)
    dist.all_reduce(turns, op=dist.ReduceOp.MAX, group=group)
    result: T | None = None
    error: Exception | None = None
    for turn in range(int(turns.item())):
        dist.barrier(group=group)
        if turn == here.local_rank:
            try:
                result = measure()
            except Exception as exc:  # raised below, once every rank has passed every turn
                error = exc
    dist.barrier(group=group)
    if error is not None:
        raise error
    return result  # type: ignore[return-value]


def each_at_once(items: Iterable[T], measure: Callable[[T, torch.Generator], dict[str, Any]], device: torch.device,
                 seed: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """``measure_each`` with every rank starting together."""
    start_together()
    return measure_each(items, measure, device, seed)


def measure_each(items: Iterable[T], measure: Callable[[T, torch.Generator], dict[str, Any]], device: torch.device,
                 seed: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """(``measure(item, gen)`` for each item, the clock summary): the clocks are sampled throughout, and
    device memory is released after, also on an error. ``gen`` is seeded per rank (seed + rank):
    different random data on every GPU. No collective: safe inside ``in_turns``."""
    gen = torch.Generator(device=device).manual_seed(seed + place().rank)
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


def time_calls(fn: Callable[[], object], device: torch.device, calls: int,
               before: Callable[[], object] | None = None) -> list[float]:
    """Seconds of each of ``calls`` calls of ``fn``, each timed on its own; ``before`` runs untimed ahead of each.

    On a GPU every call gets its own pair of CUDA events, all recorded before one synchronize at the
    end (mamf-finder's pattern): the host never waits between calls, so the device never idles
    waiting for it, and the events time the call alone, not what ``before`` does. On the CPU, where
    work is synchronous, a monotonic clock brackets each call.
    """
    if device.type == "cuda":
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(calls)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(calls)]
        for start, end in zip(starts, ends, strict=True):
            if before is not None:
                before()
            start.record()
            fn()
            end.record()
        torch.cuda.synchronize(device)
        return [s.elapsed_time(e) / 1e3 for s, e in zip(starts, ends, strict=True)]
    times = []
    for _ in range(calls):
        if before is not None:
            before()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def settle(chunk: Callable[[], float], most_s: float, least_s: float, window: int = 4,
           tolerance: float = 0.01) -> dict[str, Any]:
    """Run ``chunk`` (one short burst of work returning its throughput) until the throughput stops drifting.

    A GPU that was idle boosts its clocks and over-reports for a second or more, until the power limit
    (and later the temperature) pulls them down; a figure measured then is not what the GPU holds.
    Settled: at least ``least_s`` seconds have passed and the median of the last ``window`` bursts is
    within ``tolerance`` of the median of the ``window`` before. At most ``most_s`` seconds either way
    (the result says whether it settled).
    """
    rates: list[float] = []
    t0 = time.monotonic()
    settled = False
    while time.monotonic() - t0 < most_s:
        rates.append(chunk())
        if time.monotonic() - t0 >= least_s and len(rates) >= 2 * window:
            last, before = statistics.median(rates[-window:]), statistics.median(rates[-2 * window:-window])
            if abs(last - before) <= tolerance * before:
                settled = True
                break
    return {"seconds": round(time.monotonic() - t0, 2), "bursts": len(rates), "settled": settled,
            "first": rates[0] if rates else None, "last": statistics.median(rates[-window:]) if rates else None}


STILL_WARM_S = 10.0
"""Load that ended less than this long ago left the device warm: it counts towards the next workload's warm-up
(the next test starts within seconds of the last one's end)."""
_LOADED: dict[str, tuple[float, float]] = {}
"""Per device: (monotonic time its current stretch of load began, time it last ended)."""


def loaded(device: str, began: float, ended: float | None = None) -> None:
    """The device was under full load from ``began`` to ``ended`` (now): a stretch that began less than
    ``STILL_WARM_S`` after the last one ended continues it."""
    since, last_end = _LOADED.get(device, (began, began))
    _LOADED[device] = (since if began - last_end < STILL_WARM_S else began,
                       time.monotonic() if ended is None else ended)


def warmed_for(device: str, now: float | None = None) -> float:
    """Seconds the device has been under load (``loaded``) in this process, counting stretches less than
    ``STILL_WARM_S`` apart as one; 0 after a longer pause (it has cooled)."""
    if device not in _LOADED:
        return 0.0
    since, last_end = _LOADED[device]
    now = time.monotonic() if now is None else now
    return last_end - since if now - last_end < STILL_WARM_S else 0.0


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


def power_limit_w(device: torch.device) -> float | None:
    """The enforced power limit of a GPU in watts (NVML), or None on CPU or where NVML cannot say."""
    if device.type != "cuda":
        return None
    try:
        nvml = init_nvml()
        return nvml.nvmlDeviceGetEnforcedPowerLimit(device_handle(nvml, device)) / 1000
    except Exception:  # ImportError or NVMLError: the power figures then say 'no limit known'
        return None


def capability(device: torch.device) -> tuple[int, int] | None:
    return torch.cuda.get_device_capability(device) if device.type == "cuda" else None


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return "CPU"
