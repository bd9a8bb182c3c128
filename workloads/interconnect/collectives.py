"""NCCL collectives measured as nccl-tests measures them, swept over message sizes, in one scope.

Definitions (nccl-tests doc/PERFORMANCE.md; S = bytes of the size column, t = time, n = ranks):
  algbw = S / t;  busbw = algbw * factor;  factor = 2(n-1)/n for all_reduce; (n-1)/n for
  all_gather and reduce_scatter (S = per-rank bytes * n) and all_to_all (S = bytes one rank sends to
  all peers together); 1 for broadcast and send/recv (each rank sends S to the next, ring-wise).
Time: each rank times every call with CUDA events; t = the largest per-rank median (a collective
ends when its slowest rank does). nccl-tests averages, over ranks, the mean of a back-to-back batch:
that figure is kept too (``busbw_mean_gbps`` in the curve). Small-message latency is timed as
nccl-tests times it (``workloads.interconnect.latency``): rounds of back-to-back launches, on a GPU
captured in a CUDA graph and timed on the device (-G), on the host's clock elsewhere, on a communicator
created with NCCL's own algorithm choice (never the bandwidth sweeps' pinned NCCL_ALGO).
Correctness first: the first call of every size is checked, element by element on every rank,
against exact integer data (random non-zero integers whose partial sums stay exact in the dtype);
a wrong element fails the run on every rank before any timing counts.

Run alone: torchrun --nproc-per-node=8 -m workloads.interconnect.collectives --collective all_reduce --scope node
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from workloads.common import agree, check_level, distributed, gather_objects, reduce_int, synchronize, time_runs
from workloads.interconnect import comm_groups as cgroups
from workloads.interconnect import latency as lat
from workloads.interconnect._data import amplitude, chunked, expected, inputs, make_tile, mismatch, shape, size_bytes
from workloads.interconnect.nccl_log import nccl_environment
from workloads.result import Metric, Result, WorkloadError

# torch 2.13 renamed the one-tensor collectives (the old names now warn, FutureWarning); the torch
# builds GPU nodes carry (>= 2.4) may have only the old names. The same NCCL/gloo call either way.
ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
REDUCE_SCATTER = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "sendrecv")
_BASE = {"all_reduce": "allreduce_busbw_gbps", "all_gather": "allgather_busbw_gbps",
         "reduce_scatter": "reducescatter_busbw_gbps", "all_to_all": "alltoall_busbw_gbps",
         "broadcast": "broadcast_busbw_gbps", "sendrecv": "sendrecv_bw_gbps"}
_PREFIX = {"node": "intranode_", "world": "", "net": "net_"}
_METRIC_SCOPE = {"node": "node", "world": "world", "net": "gpu"}
"""A node's figure is judged per node; a rail's (net scope) per rank, so a slow rail names its GPUs."""
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
LATENCY_SIZES = (8, 64, 512, 4096, 32768, 65536)
LATENCY_ROUNDS = {"quick": (10, 20, 100), "standard": (10, 20, 100), "extended": (20, 50, 100)}
"""Latency mode per level: rounds, back-to-back calls a round (nccl-tests' -n 20), warm-up calls (and WARMUP_S).
Quick takes as many rounds as standard: a round costs a few hundred microseconds, and quick's median of 3 read
8.1-11.3 us on healthy 2-H200 nodes (standard's median of 10 read 8.7 there): more rounds, a steadier median."""
KiB, MiB = 1 << 10, 1 << 20


def metric_name(collective: str, scope: str) -> str:
    return _PREFIX[scope] + _BASE[collective]


def latency_metric(scope: str) -> str:
    return _PREFIX[scope] + "allreduce_latency_us"


def bus_factor(collective: str, n: int) -> float:
    if collective == "all_reduce":
        return 2 * (n - 1) / n
    return (n - 1) / n if chunked(collective) else 1.0


def bandwidth(collective: str, size_bytes: int, seconds: float, n: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s (1e9 bytes/s, as nccl-tests)."""
    algbw = size_bytes / seconds / 1e9
    return algbw, algbw * bus_factor(collective, n)


def judged_index(requested: list[int], judge_bytes: int) -> int:
    """The step judged: the largest size not above ``judge_bytes``; the smallest when all are above."""
    return max((i for i, s in enumerate(requested) if s <= judge_bytes), default=0)


def geometric(lo: int, hi: int, factor: int) -> tuple[int, ...]:
    sizes, s = [], lo
    while s <= hi:
        sizes.append(s)
        s *= factor
    return tuple(sizes)


# ---- configuration -----------------------------------------------------------------------------

@dataclass(frozen=True, kw_only=True, slots=True)
class Config:
    collective: str = "all_reduce"
    """One of COLLECTIVES."""
    scope: str = "world"
    """node | world | net (see workloads.interconnect.comm_groups)."""
    sizes: tuple[int, ...] = (MiB, 16 * MiB)
    """Size column S of each step, bytes (rounded down so every rank holds whole tiles)."""
    dtype: str = "fp32"
    """fp32 (nccl-tests' default) or bf16."""
    warmup: int = 3
    repeats: int = 10
    judge_bytes: int = 1 << 30
    """The metric is the curve at the largest swept size not above this (the smallest if none is)."""
    latency: bool = False
    """Record the time of the smallest size (allreduce_latency_us) instead of busbw."""
    rounds: int = 5
    """Latency mode: the timed calls are ``rounds`` rounds of repeats // rounds back-to-back calls."""
    nccl_algo: str = ""
    """NCCL_ALGO while the scope's communicator is created ('Ring' for fabric tests); '' = NCCL's choice."""
    device: str = "cpu"
    seed: int = 1234

    def __post_init__(self) -> None:
        if self.collective not in COLLECTIVES:
            raise ValueError(f"collective={self.collective!r}; choose one of {', '.join(COLLECTIVES)}")
        if self.scope not in cgroups.SCOPES:
            raise ValueError(f"scope={self.scope!r}; choose one of {', '.join(cgroups.SCOPES)}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype={self.dtype!r}; choose one of {', '.join(DTYPES)}")
        if self.latency and self.collective != "all_reduce":
            raise ValueError("latency is measured with all_reduce only")
        bad_rounds = self.latency and not 1 <= self.rounds <= self.repeats
        if not self.sizes or self.repeats < 1 or self.warmup < 0 or bad_rounds:
            raise ValueError(f"sizes={self.sizes}, repeats={self.repeats}, warmup={self.warmup}, rounds={self.rounds}: "
                             "need sizes, repeats >= 1, warmup >= 0, and in latency mode 1 <= rounds <= repeats")

    @classmethod
    def for_level(cls, level: str, device: torch.device, *, collective: str, scope: str, judge_bytes: int,
                  max_bytes: int, dtype: str = "fp32", nccl_algo: str = "") -> Config:
        """1 MiB..max_bytes by 4 (standard), by 2 (extended), four sizes to the judged one (quick);
        on the CPU 4 KiB..max_bytes by 4."""
        check_level(level)
        top = min(judge_bytes, max_bytes)
        if device.type == "cpu":
            sizes, warmup, repeats = geometric(4 * KiB, max_bytes, 4), 1, 5
        elif level == "quick":
            sizes, warmup, repeats = geometric(MiB, min(256 * MiB, max_bytes), 16) + (top,), 2, 5
        elif level == "standard":
            sizes, warmup, repeats = geometric(MiB, max_bytes, 4) + (top,), 3, 10
        else:
            sizes, warmup, repeats = geometric(MiB, max_bytes, 2) + (top,), 5, 20
        return cls(collective=collective, scope=scope, sizes=tuple(sorted(set(sizes))), dtype=dtype, warmup=warmup,
                   repeats=repeats, judge_bytes=judge_bytes, nccl_algo=nccl_algo, device=str(device))

    @classmethod
    def for_latency(cls, level: str, device: torch.device, *, scope: str, dtype: str = "fp32") -> Config:
        """all_reduce of 8 B..64 KiB in rounds of back-to-back calls; NCCL's own algorithm choice (what users get)."""
        check_level(level)
        rounds, calls, warmup = (3, 10, 5) if device.type == "cpu" else LATENCY_ROUNDS[level]
        return cls(collective="all_reduce", scope=scope, sizes=LATENCY_SIZES, dtype=dtype, warmup=warmup,
                   repeats=rounds * calls, rounds=rounds, judge_bytes=LATENCY_SIZES[0], latency=True,
                   device=str(device))


def unsupported_reason(collective: str) -> str | None:
    """Why the backend cannot run ``collective`` (gloo lacks some in older torch), else None.
    A collective: every rank calls it, every rank gets the same answer."""
    problem = None
    if not cgroups.is_nccl():
        n = dist.get_world_size()
        try:
            x = torch.ones(2 * n)
            {"all_gather": lambda: ALL_GATHER(torch.empty(2 * n), x[:2]),
             "reduce_scatter": lambda: REDUCE_SCATTER(torch.empty(2), x),
             "all_to_all": lambda: dist.all_to_all_single(torch.empty(2 * n), x)}.get(collective, lambda: None)()
        except (RuntimeError, NotImplementedError, ValueError) as exc:
            problem = f"{dist.get_backend()} in torch {torch.__version__} cannot run {collective}: {exc}"
    reasons = [p for p in gather_objects(problem) if p]
    return reasons[0] if reasons else None


# ---- the sweep --------------------------------------------------------------------------------

def _operation(cfg: Config, comm: cgroups.ScopeComm, send: torch.Tensor, out: torch.Tensor) -> Callable[[], None]:
    g, m, n, me = comm.group, comm.members, comm.size, comm.group_rank
    if cfg.collective == "all_reduce":
        return lambda: dist.all_reduce(send, group=g)
    if cfg.collective == "all_gather":
        return lambda: ALL_GATHER(out, send, group=g)
    if cfg.collective == "reduce_scatter":
        return lambda: REDUCE_SCATTER(out, send, group=g)
    if cfg.collective == "all_to_all":
        return lambda: dist.all_to_all_single(out, send, group=g)
    if cfg.collective == "broadcast":
        return lambda: dist.broadcast(send, src=m[0], group=g)

    def ring_shift() -> None:
        ops = [dist.P2POp(dist.isend, send, m[(me + 1) % n], g), dist.P2POp(dist.irecv, out, m[(me - 1) % n], g)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
    return ring_shift


def _sweep(cfg: Config, comm: cgroups.ScopeComm, device: torch.device) -> list[dict[str, Any]]:
    """Every size: buffers, one checked call, timed calls. Every rank of the job walks the same steps."""
    dtype, elt = DTYPES[cfg.dtype], torch.tensor([], dtype=DTYPES[cfg.dtype]).element_size()
    n = comm.size
    stats, rows = [], []
    for i, size in enumerate(cfg.sizes):
        where = f"{cfg.collective} of {size} B, {cfg.dtype}, {n} ranks of {comm.label}"
        problem, fn, out, send, unit = None, None, None, None, 0
        if comm.active:
            try:
                unit, tile = shape(cfg.collective, size, n, elt)
                base = make_tile(tile, amplitude(cfg.collective, cfg.dtype, n), cfg.seed + i)
                send, out = inputs(cfg.collective, base, n, comm.group_rank, unit, dtype, device)
                fn = _operation(cfg, comm, send, out)
            except (torch.OutOfMemoryError, WorkloadError) as exc:
                problem = f"{where}: {exc}"
        agree(problem, f"{cfg.collective} ({cfg.scope}): preparing {size} B failed")
        algo = ""
        if fn is not None and out is not None:
            seen = len(comm.log.algorithms)
            with comm.window():
                fn()
            algo = ", ".join(sorted({f"{a['algo']}/{a['proto']}" for a in comm.log.algorithms[seen:]}))
            bad = mismatch(out, expected(cfg.collective, base, n, comm.group_rank))
            problem = f"{where}: {bad} (rank {dist.get_rank()}); a wrong result is data corruption on a link " \
                      "or in NCCL: check dmesg for Xid errors, rerun with NCCL_ALGO=Ring NCCL_PROTO=Simple" \
                      if bad else None
        agree(problem, f"{cfg.collective} ({cfg.scope}): correctness at {size} B failed")
        if fn is not None and send is not None:
            # Small messages: rounds of back-to-back launches on the host clock (nccl-tests); large ones:
            # each call on its own, CUDA events.
            graph_note = ""
            if cfg.latency:
                issue, calls = lat.issue_all_reduce(send, comm.group), cfg.repeats // cfg.rounds
                rounds = lat.time_rounds(issue, device, cfg.warmup, calls, cfg.rounds,
                                         agree=lambda n: reduce_int(n, "max", comm.group))
                times, host = rounds["host"], statistics.median(rounds["host"])
                span = statistics.median(rounds["device"])
                # On a GPU the judged time is the CUDA graph's (nccl-tests -G); the host clock's stays beside it.
                graphed, graph_note = lat.time_graph(issue, device, calls, cfg.rounds, comm.group)
                if graphed:
                    times = graphed
                    span = statistics.median(graphed)
            else:
                times = time_runs(fn, device, cfg.warmup, cfg.repeats)
                span = host = statistics.median(times)
            stats.append([statistics.median(times), max(times), -min(times), span, host, statistics.fmean(times)])
            rows.append({"bytes": size_bytes(cfg.collective, unit, n, elt), "requested_bytes": size, "algo": algo})
            if cfg.latency:
                rows[-1]["timing"] = "host clock" if graph_note else "CUDA graph"
                if graph_note and device.type == "cuda":  # on a GPU a graph was expected: say why not
                    rows[-1]["graph_note"] = graph_note
        del fn, out, send  # free this size's buffers before the next, larger one
    if not comm.active:
        return []
    t = torch.tensor(stats, dtype=torch.float64, device=device)
    worst = t[:, :5].clone()
    dist.all_reduce(worst, op=dist.ReduceOp.MAX, group=comm.group)
    mean = t[:, 5].clone()
    dist.all_reduce(mean, group=comm.group)
    for row, (med, mx, neg_min, span, host), avg in zip(rows, worst.tolist(), (mean / n).tolist(), strict=True):
        algbw, busbw = bandwidth(cfg.collective, row["bytes"], med, n)
        row.update(time_us=med * 1e6, time_min_us=-neg_min * 1e6, time_max_us=mx * 1e6, time_mean_us=avg * 1e6,
                   device_time_us=span * 1e6, host_time_us=host * 1e6,
                   algbw_gbps=algbw, busbw_gbps=busbw,
                   busbw_mean_gbps=bandwidth(cfg.collective, row["bytes"], avg, n)[1])
    return rows


def run(cfg: Config) -> Result:
    """Sweep one collective in one scope; every rank of the job must call it (groups, agreements)."""
    device = torch.device(cfg.device)
    comm = cgroups.scope_comm(cfg.scope, "" if cfg.latency else cfg.nccl_algo)
    rows = _sweep(cfg, comm, device)
    gathered = gather_objects((comm.label, rows) if comm.active and comm.group_rank == 0 else None)
    curves = dict(x for x in gathered if x is not None)
    details: dict[str, Any] = {
        "collective": cfg.collective, "scope": cfg.scope, "group": comm.label, "ranks": comm.size,
        "dtype": cfg.dtype, "nccl_algo": cfg.nccl_algo or "NCCL's choice", "curves": curves,
        "timing": (f"t = slowest rank's median of {cfg.rounds} rounds of {cfg.repeats // cfg.rounds} back-to-back "
                   "calls: on a GPU one CUDA graph of them replayed a round, by CUDA events (nccl-tests -G); where "
                   "no graph (a row's timing says) async calls on the host clock (nccl-tests without -G); "
                   "host_time_us: the host-clock rounds, always; device_time_us: the graph's figure where the row "
                   "was timed from a graph, else CUDA events around the host-clock rounds"
                   if cfg.latency else f"t = slowest rank's median of {cfg.repeats} calls")
                  + f" after {cfg.warmup} warm-up, {'CUDA events' if device.type == 'cuda' else 'host clock'}; "
                  "busbw_mean_gbps: mean over ranks of each rank's mean (nccl-tests' convention)",
        "nccl": comm.log.summary(), "nccl_capture": comm.capture, "nccl_env": nccl_environment(),
    }
    if device.type == "cuda":
        details["nccl_version"] = ".".join(map(str, torch.cuda.nccl.version()))
    if not rows:
        return Result(metrics=(), details=details)
    row = rows[judged_index([r["requested_bytes"] for r in rows], cfg.judge_bytes)]
    details["judged_bytes"] = row["bytes"]
    scope = _METRIC_SCOPE[cfg.scope]
    if cfg.latency:
        how = ("device time per call, rounds of {} calls in a CUDA graph (nccl-tests -G; host clock: {:.1f} us)"
               if row["timing"] == "CUDA graph" else "host time per call over rounds of {} back-to-back calls, as "
               "nccl-tests").format(cfg.repeats // cfg.rounds, row["host_time_us"])
        metric = Metric(latency_metric(cfg.scope), row["time_us"], "us", scope=scope,
                        description=f"all_reduce of {row['bytes']} B, {comm.size} ranks ({comm.label}): {how}; "
                                    "slowest rank's median round")
    else:
        factor = {"all_reduce": "2(n-1)/n", "broadcast": "1", "sendrecv": "1"}.get(cfg.collective, "(n-1)/n")
        metric = Metric(metric_name(cfg.collective, cfg.scope), row["busbw_gbps"], "GB/s", scope=scope,
                        description=f"nccl-tests busbw = S/t x {factor} of {cfg.collective} at S = {row['bytes']} B, "
                                    f"{cfg.dtype}, {comm.size} ranks ({comm.label}); t = slowest rank's median")
    return Result(metrics=(metric,), details=details)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--collective", default="all", choices=(*COLLECTIVES, "all"))
    parser.add_argument("--scope", default="world", choices=cgroups.SCOPES)
    parser.add_argument("--level", default="standard", choices=("quick", "standard", "extended"))
    parser.add_argument("--dtype", default="fp32", choices=tuple(DTYPES))
    parser.add_argument("--nccl-algo", default="", help="NCCL_ALGO for the scope's communicator, e.g. Ring")
    parser.add_argument("--judge-bytes", type=int, default=1 << 30)
    parser.add_argument("--max-bytes", type=int, default=None, help="default: 4 GiB on GPU, 4 MiB on CPU")
    parser.add_argument("--latency", action="store_true", help="small-message all_reduce latency instead")
    args = parser.parse_args()
    with distributed() as here:
        max_bytes = args.max_bytes or (4 << 30 if here.device.type == "cuda" else 4 * MiB)
        todo = COLLECTIVES if args.collective == "all" else (args.collective,)
        for coll in ("all_reduce",) if args.latency else todo:
            cfg = Config.for_latency(args.level, here.device, scope=args.scope, dtype=args.dtype) if args.latency \
                else Config.for_level(args.level, here.device, collective=coll, scope=args.scope, dtype=args.dtype,
                                      judge_bytes=args.judge_bytes, max_bytes=max_bytes, nccl_algo=args.nccl_algo)
            result = run(cfg)
            synchronize(here.device)
            if here.rank == 0:
                print(f"# {coll} ({args.scope}, {args.dtype}) {result.details['group']}")
                for r in result.details["curves"].get(result.details["group"], []):
                    print(f"{r['bytes']:>12} B {r['time_us']:>11.1f} us (device {r['device_time_us']:.1f})  algbw "
                          f"{r['algbw_gbps']:8.2f}  busbw {r['busbw_gbps']:8.2f} GB/s  {r['algo']}")
                for m in result.metrics:
                    print(f"{m.name} = {m.value:.4g} {m.unit}")


if __name__ == "__main__":
    main()
