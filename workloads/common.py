"""Helpers every workload shares: where am I, which device, how to agree across ranks, how to time.

Inside the acceptance suite the plugin has already initialised torch.distributed; a workload run
alone (``torchrun -m workloads.AREA.NAME``) runs its ``main()`` inside ``distributed()``.

Agreeing: a workload must never raise on some ranks while the others wait in a collective. Every
check that can fail on one rank goes through ``agree`` (or ``agree_on``), a collective after which
every rank raises the same ``WorkloadError``, naming the node, host and ranks that saw each problem.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from workloads.node.name import node_name
from workloads.result import WorkloadError

LEVELS = ("quick", "standard", "extended")
T = TypeVar("T")


class PlacementError(RuntimeError):
    """This process cannot be given a device of its own; the message says what to change."""


@dataclass(frozen=True, slots=True)
class Place:
    """This process's place in the job, read from torchrun's environment."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    device: torch.device


def rank_device(local_rank: int, want_cuda: bool = True) -> torch.device:
    """This rank's device: ``cuda:LOCAL_RANK`` where CUDA is wanted and present, else the CPU; never RANK.

    LOCAL_RANK beyond the visible devices would put two ranks on one GPU (a modulo would hide it):
    refused. Every rank sees every GPU of its node (test_world checks that devices per node match
    the profile), so a process given one GPU of its own through CUDA_VISIBLE_DEVICES is refused too.
    """
    if not want_cuda or not torch.cuda.is_available():
        return torch.device("cpu")
    count = torch.cuda.device_count()
    if local_rank >= count:
        raise PlacementError(
            f"LOCAL_RANK={local_rank} but only {count} CUDA devices are visible: two ranks would share a GPU; "
            f"start --nproc-per-node={count} (or 'gpu') and let every rank see every GPU of its node "
            "(do not narrow CUDA_VISIBLE_DEVICES per process)"
        )
    return torch.device("cuda", local_rank)


def place() -> Place:
    """Where this process runs (device: ``rank_device``)."""
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = rank_device(local_rank)
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


FLIGHT_RECORDER = {
    "TORCH_FR_BUFFER_SIZE": "2000",
    "TORCH_NCCL_ENABLE_TIMING": "1",
}
"""torch's records of every collective, read back by the plugin to see which collective each rank waits in and which
rank never entered or started it (clustergate.run.hang.flight): NCCL's and gloo's flight recorders (their last 2000
collectives; each keeps, per process group, the last collective enqueued and completed; TORCH_FR_BUFFER_SIZE is
both backends' since torch replaced TORCH_NCCL_TRACE_BUFFER_SIZE, which it now warns about), and NCCL's start events,
which tell a collective the device started (peers wait in it) from one queued behind other work (a kernel that
spins). Set where the process group is made, unless the site set them: each is read when a group is made. NCCL's
own watchdog and heartbeat monitor (TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC) are left as torch sets them: they act at
the collective timeout and minutes later, where the plugin's peers name a stuck rank within a minute."""


def flight_recorder() -> None:
    """``FLIGHT_RECORDER`` in the environment, where the site has not set them (before any process group)."""
    for name, value in FLIGHT_RECORDER.items():
        os.environ.setdefault(name, value)


def start_process_group(backend: str, *, destroyed_later: bool = True, **kwargs: Any) -> None:
    """``dist.init_process_group``, with torch._dynamo imported first so the group can be ended, and torch's
    flight recorders on (``flight_recorder``).
    ``destroyed_later=False``: the caller never destroys the group (a clustergate run leaves through
    ``os._exit``), and the import, 1.3 s of CPU per rank, is left out.

    Why: torch._dynamo, imported for the first time while a process group exists (DDP's
    constructor and torch.compile import it), keeps references to that group, and then
    ``destroy_process_group()`` cannot free it. A gloo backend that is never freed keeps its worker
    threads into interpreter shutdown, where a worker that drops the last collective's tensors must
    take the GIL: Python ends that thread inside C++ and the process aborts ("terminate called
    without an active exception", SIGABRT). Imported first, dynamo holds nothing of the group.
    """
    if destroyed_later:
        import torch._dynamo  # noqa: F401  (the import is the point: see above)

    flight_recorder()
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


# ---- agreeing across ranks --------------------------------------------------------------------

def backend_device(group: dist.ProcessGroup | None = None) -> torch.device:
    """Where tensors of ``group`` (default: the default group) live: this rank's GPU under NCCL, else the CPU."""
    return place().device if "nccl" in str(dist.get_backend(group)) else torch.device("cpu")


def reduce_int(value: int, op: str = "max", group: dist.ProcessGroup | None = None) -> int:
    """``value`` reduced over every rank of ``group`` (``"max"`` or ``"sum"``): a vote every rank sees."""
    ops = {"max": dist.ReduceOp.MAX, "sum": dist.ReduceOp.SUM}
    t = torch.tensor([int(value)], dtype=torch.int64, device=backend_device(group))
    dist.all_reduce(t, op=ops[op], group=group)
    return int(t.item())


def gather_numbers(values: Sequence[float], group: dist.ProcessGroup | None = None) -> list[list[float]]:
    """Every rank's ``values`` (the same count on every rank) as float64, in group rank order."""
    mine = torch.tensor(list(values), dtype=torch.float64, device=backend_device(group))
    out = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
    dist.all_gather(out, mine, group=group)
    return [t.tolist() for t in out]


def gather_objects(obj: Any, group: dist.ProcessGroup | None = None) -> list[Any]:
    """Every rank's ``obj``, in group rank order, exchanged as JSON.

    Never pickled: unpickling another process's bytes runs whatever code they name, and a collective's
    peer is only as trustworthy as the network it came over. ``obj`` is JSON: tuples come back as lists,
    mapping keys must be strings (a TypeError, not a silent conversion), NaN and infinities pass."""
    _check_keys(obj)
    raw = json.dumps(obj).encode()
    lengths = [int(n) for [n] in gather_numbers([len(raw)], group)]
    mine = torch.zeros(max(lengths), dtype=torch.uint8)
    mine[:len(raw)] = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
    mine = mine.to(backend_device(group))
    out = [torch.empty_like(mine) for _ in lengths]
    dist.all_gather(out, mine, group=group)
    return [json.loads(t[:length].cpu().numpy().tobytes()) for t, length in zip(out, lengths, strict=True)]


def broadcast_object(obj: Any, src: int = 0) -> Any:
    """Rank ``src``'s ``obj`` on every rank of the default group, as JSON (``gather_objects``' rules)."""
    return gather_objects(obj if dist.get_rank() == src else None)[src]


def _check_keys(obj: Any) -> None:
    if isinstance(obj, dict):
        for key, value in obj.items():
            if not isinstance(key, str):
                raise TypeError(f"gather_objects: mapping key {key!r} is not a string (JSON would turn it into one)")
            _check_keys(value)
    elif isinstance(obj, (list, tuple)):
        for value in obj:
            _check_keys(value)


MAX_PROBLEM_LINES = 32
"""Lines of distinct (node, problem) pairs an agreed error names; the count covers every rank."""


def agree(problem: str | None, what: str, hint: str = "", group: dist.ProcessGroup | None = None) -> None:
    """Raise the same WorkloadError on every rank of ``group`` when any rank has a ``problem``.

    A collective: every rank calls it, with None where all is well. The error reads
    ``{what} on k/N ranks (hint):`` and then one line per node and problem with the ranks that saw it.
    """
    if reduce_int(1 if problem else 0, "max", group) == 0:
        return
    here = place()
    everyone = gather_objects((problem, here.node_rank, node_name()), group)
    ranks = dist.get_process_group_ranks(group) if group is not None else list(range(len(everyone)))
    bad: dict[tuple[int, str, str], list[int]] = {}
    for rank, (said, node, host) in zip(ranks, everyone, strict=True):
        if said:
            bad.setdefault((node, host, said), []).append(rank)
    count = sum(len(r) for r in bad.values())
    lines = [f"{what} on {count}/{len(everyone)} ranks{' (' + hint + ')' if hint else ''}:"]
    lines += [f"  node {node} ({host}) rank{'s' if len(rs) > 1 else ''} {','.join(map(str, rs))}: {said}"
              for (node, host, said), rs in sorted(bad.items())[:MAX_PROBLEM_LINES]]
    if len(bad) > MAX_PROBLEM_LINES:
        lines.append(f"  ... and {len(bad) - MAX_PROBLEM_LINES} more")
    raise WorkloadError("\n".join(lines))


def agree_on(step: Callable[[], T], what: str, catch: tuple[type[BaseException], ...] = (WorkloadError,),
             hint: str = "", group: dist.ProcessGroup | None = None) -> T:
    """Run ``step`` on every rank; when it raises one of ``catch`` on any rank, every rank raises the
    same WorkloadError (``agree``) instead of some ranks raising while the others wait."""
    problem, value = None, None
    try:
        value = step()
    except catch as exc:
        problem = str(exc)
    agree(problem, what, hint, group)
    return value  # type: ignore[return-value]  # set: no rank had a problem


# ---- working alone -----------------------------------------------------------------------------

_ALONE: list[tuple[str, float]] = []
"""What this rank works at alone, and until when (time.monotonic()), innermost last."""


@contextmanager
def working_alone(what: str, most_s: float) -> Iterator[None]:
    """This rank works alone for up to ``most_s`` while its peers may wait for it in a collective (one rank per node
    writing the shared directory, a rank compiling what another found cached). The plugin's liveness names a live
    rank its peers have waited for as stuck after NO_PROGRESS_S (clustergate.run.hang.liveness); a rank inside this
    block is named only once ``most_s`` has passed. ``what`` says what it does, for the message that names it."""
    _ALONE.append((what, time.monotonic() + most_s))
    try:
        yield
    finally:
        _ALONE.pop()


def alone_now() -> tuple[str, float] | None:
    """What this rank works at alone (``working_alone``) and the seconds left of its bound; None when it is not."""
    if not _ALONE:
        return None
    what, until = _ALONE[-1]
    return what, until - time.monotonic()


# ---- timing -----------------------------------------------------------------------------------

class Phases:
    """Where a workload's wall time goes, phase by phase (host clock): ``mark(phase)`` records the seconds since the
    last mark (or the start) under ``phase``. A phase that runs the device should end synchronised."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._last = time.perf_counter()

    def mark(self, phase: str) -> None:
        now = time.perf_counter()
        self.seconds[phase] = round(now - self._last, 3)
        self._last = now


def wait_for_collectives(wait: Callable[[], object]) -> None:
    """The host waits (``wait``) for collectives the GPU already runs, e.g. replayed from a CUDA graph, where no
    torch.distributed call is on the stack: the plugin counts a rank waiting here as blocked in a collective
    (clustergate.run.ranks.peers.main_thread_collective), so a peer gone ends the run instead of the test's limit."""
    wait()


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
