"""Small-message collective latency timed as nccl-tests times it.

nccl-tests (src/common.cu) launches ``iters`` collectives back to back on one stream, synchronizes
the stream, and reports the host's wall clock divided by ``iters`` (then averaged over ranks): the
host's cost of a launch counts, a wait between calls does not exist. The suite times the same way:
rounds of back-to-back ``async_op=True`` calls, one wait (the current stream on the last call's
completion) and one synchronize per round, host wall clock per call. The device's span of each
round (CUDA events) is kept beside it.

Why not ``dist.all_reduce(t)`` call after call, as the suite did (24-45 us on 2 H200, 112 us on 8,
against nccl-tests' 17-21 us): a synchronous call makes torch's current stream wait for the NCCL
stream after every call, and the next call's NCCL stream wait for the current stream again, a
two-stream ping-pong per call on the device, plus the host work of that wait. With async calls the
only per-call costs left are the ones any PyTorch user pays (the dispatcher, c10d's work object and
events, NCCL's own enqueue); ``benchmarks/latency_diag.py`` measures each of those apart on a GPU.

On a GPU the same calls are also captured in one CUDA graph and replayed (``time_graph``), timed on the
device as nccl-tests -G times them: what the GPUs and their links take for a call with no host in the way.
That is the judged figure there: the host's share (the dispatcher, c10d's work object and events, NCCL's
enqueue) is software, the same on a healthy node and a broken one, and it is most of the call (on two H200s,
25-52 us a call through c10d against 10-15 us for NCCL called directly, ``benchmarks/latency_diag.py``, run
R10 of docs/reference-figures.md); its jitter would blur the links' figure. The host-clock figure stays
beside it in the curve (``host_time_us``).

The warm-up runs for a time, not a count: NCCL connects an algorithm and protocol at its first use
(NCCL_RUNTIME_CONNECT) and a GPU that was idle raises its clocks only under load, so a few calls
after an idle spell time the GPU waking up.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from workloads.common import reduce_int, synchronize, wait_for_collectives

WARMUP_S = 0.2
"""Seconds of back-to-back calls before any is timed (and at least the configured warm-up count)."""
WARMUP_BATCHES = 8
"""Most warm-up batches (the same on every rank, so they stay in step); two or three suffice at a steady pace."""


def issue_all_reduce(tensor: torch.Tensor, group: Any) -> Callable[[], Any]:
    """One all_reduce launched without waiting; returns its Work."""
    return lambda: dist.all_reduce(tensor, group=group, async_op=True)


def finish(work: Any) -> None:
    """The current stream waits for ``work`` (on a GPU nothing blocks the host here; gloo completes it)."""
    if work is not None:
        work.wait()


def time_rounds(issue: Callable[[], Any], device: torch.device, warmup: int, calls: int, rounds: int,
                warmup_s: float = WARMUP_S, agree: Callable[[int], int] = lambda n: n) -> dict[str, list[float]]:
    """Seconds per call of ``issue`` (launches one collective, returns its Work), one figure per round of
    ``calls`` back-to-back launches: ``host`` by the host's wall clock (nccl-tests' figure), ``device`` by
    CUDA events around the round (the host clock on CPU).

    Every rank must launch the same number of collectives. The warm-up runs in batches: first ``warmup``
    calls, then as many as the last batch's pace says fill what is left of ``warmup_s``, the count agreed
    before each batch (``agree``: the largest count of any rank; a collective over the group), until every
    rank has had its seconds. One estimate from the first calls is not enough: they are the slow ones
    (NCCL connecting, clocks rising, a busy host), so it undercounts and the warm-up ends early."""
    t0 = time.perf_counter()
    batch = warmup
    for _ in range(WARMUP_BATCHES):
        b0 = time.perf_counter()
        for _ in range(batch):
            finish(issue())
        synchronize(device)
        now = time.perf_counter()
        left = warmup_s - (now - t0)
        pace = max((now - b0) / max(1, batch), 1e-7)
        batch = agree(min(math.ceil(left / pace), 100_000) if left > 0 else 0)
        if batch == 0:
            break
    host: list[float] = []
    span: list[float] = []
    cuda = device.type == "cuda"
    for _ in range(rounds):
        start = end = None
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        h0 = time.perf_counter()
        if start is not None:
            start.record()
        work = None
        for _ in range(calls):
            work = issue()
        finish(work)
        if end is not None:
            end.record()
        synchronize(device)
        host.append((time.perf_counter() - h0) / calls)
        span.append(start.elapsed_time(end) / 1e3 / calls if start is not None and end is not None else host[-1])
    return {"host": host, "device": span}


def time_graph(issue: Callable[[], Any], device: torch.device, calls: int, rounds: int,
               group: Any = None) -> tuple[list[float], str]:
    """Device seconds per call of ``calls`` launches of ``issue`` captured in one CUDA graph, one figure per
    replay of ``rounds`` (nccl-tests -G: its graph of -G launches replayed, timed by CUDA events), and ''
    or why the graph could not be made.

    The collectives run only at replay, and only once every rank of ``group`` (the collectives' own group) has
    captured its graph, by a vote that names a rank whose capture failed: a rank whose capture failed must not leave
    the others replaying a collective it never joins. Capture is thread-local: c10d's watchdog and the
    suite's clock sampler keep calling CUDA from their own threads meanwhile, which a global capture would
    refuse. The host waits for the replayed collectives in ``wait_for_collectives``, where the plugin's
    blocked-collective check sees a rank waiting for a peer that is gone (c10d's watchdog does not watch
    a graph's collectives)."""
    if device.type != "cuda":
        return [], "no GPU: CUDA graphs need one"
    graph, why = torch.cuda.CUDAGraph(), ""
    torch.cuda.synchronize(device)
    try:
        # The stream context gives the current stream back even when the capture fails (torch.cuda.graph
        # would leave its capture stream current).
        with torch.cuda.stream(torch.cuda.Stream(device)):
            graph.capture_begin(capture_error_mode="thread_local")
            try:
                work = None
                for _ in range(calls):
                    work = issue()
                finish(work)
            finally:
                graph.capture_end()
    except Exception as exc:  # noqa: BLE001 - any failed capture: the host-clock figure stands, said why
        why = f"CUDA graph capture failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
    failed = reduce_int(dist.get_rank() + 1 if why else 0, "max", group)  # the highest rank that failed, + 1
    if failed:
        return [], why or f"CUDA graph capture failed on rank {failed - 1} (its row says why)"
    for _ in range(3):  # the replay's own first launch, and the clocks, settle
        graph.replay()
    wait_for_collectives(lambda: torch.cuda.synchronize(device))
    span: list[float] = []
    for _ in range(rounds):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        wait_for_collectives(end.synchronize)
        span.append(start.elapsed_time(end) / 1e3 / calls)
    return span, ""


def summary_us(times: dict[str, list[float]]) -> dict[str, float]:
    """Median per-call microseconds of each clock, and the spread of the host figure over rounds."""
    return {"host_us": statistics.median(times["host"]) * 1e6, "device_us": statistics.median(times["device"]) * 1e6,
            "host_min_us": min(times["host"]) * 1e6, "host_max_us": max(times["host"]) * 1e6}
