"""Dense matmul TFLOPS per device, the MAMF way; each product checked against float64 before it counts.

MAMF (Maximum Achievable Matmul FLOPS, stas00/ml-engineering's mamf-finder), shape by shape as
mamf-finder times it: the shape's operands are made, its first call runs (its kernel chosen and loaded),
then its other warm-up calls (mamf-finder's 50 in all) and its timed calls (about 100) are queued back to
back with no wait between, each call preceded, untimed, by a write of a buffer past the L2 cache (A and B
then come from HBM, as in training) and a fresh copy into C (the output really changes), each timed call
bracketed by its own CUDA events; one synchronize ends the shape, and the product the last timed call left
in C is checked against float64 before any figure of the shape counts. A shape's figure is 2*M*N*K / its
median call time; the metric is the best shape's figure, the shape recorded. Before the sweep the device
runs the first shape until it has been under load for ``warm_s`` (mamf-finder's 30 s at the standard
level; load that ended moments ago counts, a sweep's or the sustained hold's: ``_hw.loaded``) and its
throughput stops drifting: a GPU fresh from idle is cool, and under its power cap a cool GPU holds higher
clocks (an H100 read 807 TFLOPS after a 3 s warm-up where mamf-finder, after its 30 s, read 737 on the same
GPU in the same session). B is stored (N, K) and used transposed, as nn.Linear does (and as fp8's
torch._scaled_mm requires). Every rank measures at once.

Why each shape straight after its operands are made, as mamf-finder does, and not after a second of
untimed calls: under its power cap a 700 W H100 lets its clocks rise in the short pause between shapes,
and mamf-finder's figure, the one the field quotes, is taken in that state. A second of calls before the
timed ones held the suite to the settled clock instead: the same sweep on one H100 read 743 TFLOPS that
way and 805 timed as mamf-finder times, on another 729 against 774 and 769 (benchmarks/matmul_diag.py,
SM clock 1380 MHz settled against 1470-1755), and the suite read 0.95-0.97 of mamf-finder's best median in
sessions where mamf-finder's pauses met high clocks. What the GPU holds with no pause at all is the
sustained figure, measured and judged apart (workloads.gpu.burn_in).

Run alone: torchrun --nproc-per-node=8 -m workloads.gpu.matmul --dtype bf16 [--sweep wide]
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import statistics
import time
from dataclasses import dataclass
from typing import Any

import torch

from workloads.common import check_level, distributed, synchronize
from workloads.gpu import _hw as hw
from workloads.gpu._gemm import (  # noqa: F401  (part of this module's interface: benchmarks and tests)
    DTYPES,
    RTOL,
    Loop,
    Shape,
    check_error,
    flops,
    fp8_unsupported,
    operands,
    precision,
    product_fn,
    sample_error,
    tflops,
    wallclock_figures,
    wallclock_problem,
)
from workloads.result import Metric, Result, WorkloadError

SWEEPS: dict[str, tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]] = {
    "quick": ((4096, 8192), (4096, 8192), (8192,)),
    "standard": ((4096, 8192), (4096, 8192), (4096, 8192, 16384)),
    "extended": ((4096, 8192, 12288, 16384),) * 3,
}
"""(M values, N values, K values) per level: every combination is swept, as mamf-finder's --m/--n/--k do,
so it can run the very same shapes. Each holds 4096x4096x8192 (the best bf16/fp16 shape of H200 sweeps)
and the 8192 cube."""
GPU_SHAPES: dict[str, tuple[Shape, ...]] = {
    level: tuple((m, n, k) for m in ms for n in ns for k in ks) for level, (ms, ns, ks) in SWEEPS.items()}
FP8_SHAPES = ((1024, 9216, 14336),)  # best fp8 shape of ml-engineering's MAMF table (~1400 TFLOPS on H100)
CPU_SHAPES: dict[str, tuple[Shape, ...]] = {
    "quick": ((256, 256, 256), (512, 512, 512)),
    "standard": ((256, 256, 256), (512, 512, 512), (384, 512, 256)),
    "extended": ((256, 256, 256), (512, 512, 512), (384, 512, 256), (768, 768, 768)),
}
GPU_CALLS = {"quick": (20, 30, 2.0), "standard": (50, 100, 30.0), "extended": (50, 200, 45.0)}
"""Per level: warm-up calls per shape, timed calls per shape (mamf-finder's defaults: 50 and 100), seconds of
load before the sweep (``warm_s``, mamf-finder's 30). Quick keeps the load short to stay a half-minute check:
its figure comes from a cooler GPU and reads higher."""
SECOND_PASS_SHAPES = 2
"""The best shapes of the sweep timed once more, each shape's figure the better of its two medians: one
pass's figure moves by 1-2% with the power controller's state (2 H200s: 692.7 once, 708-736 otherwise), so
a best shape that met a dip is not judged on it. The passes' difference is recorded as the run's spread."""
CPU_CALLS = {"quick": (1, 5, 0.0), "standard": (2, 10, 0.0), "extended": (2, 30, 0.0)}
FLUSH_BYTES = 256 << 20
"""Written before every call on a GPU: mamf-finder's 256 MiB (4x H200's L2), so the gap between calls
(and with it the power the GPU draws) is the same as in the figure this one is compared with."""
WIDE_SIDES, WIDE_K = (1024, 2048, 4096, 6144, 8192, 16384), (4096, 8192, 13312, 16384)


def wide_sweep() -> tuple[Shape, ...]:
    """A wider reference: 144 shapes, to compare the level's sweep's best with."""
    return tuple((m, n, k) for m in WIDE_SIDES for n in WIDE_SIDES for k in WIDE_K)


@dataclass(frozen=True, kw_only=True, slots=True)
class Config:
    dtype: str = "bf16"
    """bf16 | fp16 | tf32 (fp32 inputs on tensor cores; plain fp32 on CPU) | fp8 (e4m3, bf16 out)."""
    shapes: tuple[Shape, ...] = CPU_SHAPES["standard"]
    """(M, N, K) triples to sweep; the device settles on the first."""
    calls: int = 10
    """Timed calls per shape; a shape's figure is their median (MAMF: 100)."""
    warmup_calls: int = 2
    """Untimed calls per shape, queued right before its timed calls (cuBLAS picks and loads its kernel)."""
    warm_s: float = 0.0
    """Seconds of load the device must have had before anything is timed (the first shape runs until then,
    and then until its throughput stops drifting, at most twice as long)."""
    flush_bytes: int = 8 << 20
    """Bytes written before every call to evict the inputs from the cache (GPU: FLUSH_BYTES)."""
    sample: int = 64
    """Rows and columns of C checked against the float64 reference (before and after timing)."""
    rtol: float | None = None
    """Allowed error (see RTOL); None: the dtype's default."""
    peak_tflops: float | None = None
    """The profile's dense peak for this dtype, for the efficiency in details (never judged here)."""
    wallclock_fraction: float | None = None
    """Least share of the best shape's per-call figure its timed calls must reach by the host's clock (the
    profile's matmul_wallclock_fraction); below it the run fails naming both (a GPU shared with another job).
    None: both figures recorded, not judged."""
    device: str = "cpu"
    seed: int = 1234
    """Per-rank data: seed + rank."""

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype {self.dtype!r} is not one of {', '.join(DTYPES)}")
        if not self.shapes or any(len(s) != 3 or min(s) <= 0 for s in self.shapes):
            raise ValueError(f"shapes must be non-empty (M, N, K) triples of positive ints, got {self.shapes}")
        if self.dtype == "fp8" and any(d % 16 for s in self.shapes for d in s):
            raise ValueError(f"fp8 (torch._scaled_mm) needs every dimension a multiple of 16, got {self.shapes}")
        if self.calls < 1 or self.warmup_calls < 0 or self.warm_s < 0 or self.flush_bytes < 4:
            raise ValueError(f"calls >= 1, warmup_calls >= 0, warm_s >= 0 and flush_bytes >= 4 needed, got {self}")
        if self.wallclock_fraction is not None and not 0 < self.wallclock_fraction <= 1:
            raise ValueError(f"wallclock_fraction must lie in (0, 1], got {self.wallclock_fraction}")

    @property
    def tolerance(self) -> float:
        return self.rtol if self.rtol is not None else RTOL[self.dtype]

    @classmethod
    def for_level(cls, level: str, device: torch.device, dtype: str = "bf16",
                  peak_tflops: float | None = None, wallclock_fraction: float | None = None) -> Config:
        check_level(level)
        if device.type == "cpu":
            warmup, calls, warm_s = CPU_CALLS[level]
            return cls(dtype=dtype, shapes=CPU_SHAPES[level], device=str(device), peak_tflops=peak_tflops,
                       calls=calls, warmup_calls=warmup, warm_s=warm_s, wallclock_fraction=wallclock_fraction)
        warmup, calls, warm_s = GPU_CALLS[level]
        shapes = GPU_SHAPES[level] + (FP8_SHAPES if dtype == "fp8" else ())
        return cls(dtype=dtype, shapes=shapes, device=str(device), peak_tflops=peak_tflops, calls=calls,
                   warmup_calls=warmup, warm_s=warm_s, wallclock_fraction=wallclock_fraction,
                   flush_bytes=max(FLUSH_BYTES, 2 * hw.l2_cache_bytes(device)))


class Bench:
    """One shape's operands and the MAMF call pattern: ``refresh()`` untimed before each ``call()``."""

    def __init__(self, shape: Shape, cfg: Config, device: torch.device, gen: torch.Generator,
                 flush: torch.Tensor) -> None:
        self.shape, self.cfg, self.flush = shape, cfg, flush
        self.set = operands(shape, cfg.dtype, device, gen)
        self.fresh = torch.randn(self.set[2].shape, device=device, generator=gen).to(self.set[2].dtype)
        self.product = product_fn(cfg.dtype, device)
        m, n, k = shape
        self.rows = torch.randperm(m, device=device, generator=gen)[: cfg.sample]
        self.cols = torch.randperm(n, device=device, generator=gen)[: cfg.sample]
        self.what = f"{cfg.dtype} matmul {m}x{n}x{k} on {device} ({hw.device_name(device)})"
        self.device = device

    def refresh(self) -> None:
        """Evict the cache (the inputs come from memory) and give C new contents (its write really changes it)."""
        self.flush.zero_()
        self.set[2].copy_(self.fresh)

    def call(self) -> None:
        self.product(self.set)

    def check(self, when: str) -> float:
        """The product in C against float64 (raises when wrong); its largest relative error."""
        err = sample_error(*self.set, self.rows, self.cols)
        check_error(err, self.cfg.tolerance, self.what + when)
        return err["max_rel_err"]

    def times(self, calls: int) -> list[float]:
        return hw.time_calls(self.call, self.device, calls, before=self.refresh)

    def loop(self, calls: int, warmup: int = 0) -> Loop:
        """``warmup`` untimed calls, then ``calls`` timed ones (as ``times``: each alone, the refresh untimed
        before it), queued back to back with nothing waiting between them, as mamf-finder queues its shape;
        with each refresh's time and the host's wall clock over the calls after the first, from a synchronized
        device to the last call's end.

        The shape's first call runs before the host's clock starts: choosing and loading its kernel is the
        host's work (on one H100 a dtype's first product took about 100 ms, and the clock that counted it read
        0.13-0.24 of the per-call figure on a GPU of the job's own). On a GPU every call after it records three
        events (refresh start, call start, call end), the other warm-up calls too (their times count in the
        wall-clock figure, not in the median), and nothing waits until the one synchronize at the end, as in
        ``hw.time_calls``: the timed call's own pair is the same."""
        device = self.device
        if warmup:
            self.refresh()
            self.call()
        rest = max(warmup - 1, 0)
        clocked = rest + calls
        if device.type == "cuda":
            marks = [[torch.cuda.Event(enable_timing=True) for _ in range(3)] for _ in range(clocked)]
            # The first call (and the operands' random fill) must not count in the host's clock: wait for it.
            # The wait is microseconds of an idle GPU, not a pause that lets the clocks rise.
            synchronize(device)
            t0 = time.perf_counter()
            for before, start, end in marks:
                before.record()
                self.refresh()
                start.record()
                self.call()
                end.record()
            torch.cuda.synchronize(device)
            wall = time.perf_counter() - t0
            return Loop([s.elapsed_time(e) / 1e3 for _, s, e in marks[rest:]],
                        [b.elapsed_time(s) / 1e3 for b, s, _ in marks], wall, clocked)
        refreshes, times = [], []
        t0 = time.perf_counter()
        for _ in range(clocked):
            r0 = time.perf_counter()
            self.refresh()
            c0 = time.perf_counter()
            self.call()
            c1 = time.perf_counter()
            refreshes.append(c0 - r0)
            times.append(c1 - c0)
        return Loop(times[rest:], refreshes, time.perf_counter() - t0, clocked)

    def burst_tflops(self, seconds: float = 0.2) -> float:
        """TFLOPS of one ~``seconds`` burst in the measured pattern (for settling the device)."""
        one = statistics.median(self.times(3))
        return tflops(self.shape, statistics.median(self.times(max(3, math.ceil(seconds / one)))))


def measure_shape(bench: Bench) -> dict[str, Any]:
    """Time one shape as mamf-finder does, then check it: its warm-up and timed calls queued straight after
    its operands were made (``Bench.loop``), then the product the last timed call left in C against float64.
    A wrong product fails the shape before any figure of it counts."""
    cfg = bench.cfg
    loop = bench.loop(cfg.calls, cfg.warmup_calls)
    times = loop.calls
    err = bench.check(" after the timed calls")  # C holds the last timed product
    shape = bench.shape
    wall = wallclock_figures(shape, loop)
    return {"shape": list(shape), "tflops": tflops(shape, statistics.median(times)),
            "tflops_min": tflops(shape, max(times)), "tflops_max": tflops(shape, min(times)),
            "tflops_mean": tflops(shape, statistics.fmean(times)), "calls": len(times),
            "max_rel_err": err, "wallclock_tflops": wall["wallclock_tflops"],
            "wallclock_ratio": wall["wallclock_ratio"], "wall_s": wall["wall_s"],
            "median_refresh_s": wall["median_refresh_s"]}


def second_pass(shapes: list[dict[str, Any]], top: list[int], again: list[dict[str, Any]]) -> dict[str, Any]:
    """Each re-timed shape keeps the better of its two passes (in place in ``shapes``); what both passes read
    and their spread: (larger - smaller) / larger, in %, per shape and at most."""
    rows = []
    for i, second in zip(top, again, strict=True):
        first = shapes[i]
        spread = abs(first["tflops"] - second["tflops"]) / max(first["tflops"], second["tflops"]) * 100
        rows.append({"shape": "x".join(map(str, first["shape"])), "first_tflops": round(first["tflops"], 1),
                     "second_tflops": round(second["tflops"], 1), "spread_pct": round(spread, 2)})
        if second["tflops"] > first["tflops"]:
            shapes[i] = {**second, "pass": 2}
    return {"rows": rows, "max_spread_pct": max((r["spread_pct"] for r in rows), default=0.0)}


_BEST: dict[tuple[str, str], Shape] = {}


def best_shape(device: torch.device, dtype: str) -> Shape | None:
    """The best shape the last sweep in this process found for ``dtype`` on ``device`` (None before one):
    the shape the sustained measurement holds where it follows the sweep (``--level extended``)."""
    return _BEST.get((str(device), dtype))


def run(cfg: Config) -> Result:
    """Sweep the shapes on this rank's device (every rank at once); the best shape's median is the metric."""
    device = torch.device(cfg.device)
    if cfg.dtype == "fp8" and (why := fp8_unsupported(device)):
        raise WorkloadError(f"fp8 matmul cannot run: {why}")
    flush = torch.empty(cfg.flush_bytes // 4, dtype=torch.int32, device=device)
    settled: dict[str, Any] = {}

    def measure(shape: Shape, gen: torch.Generator) -> dict[str, Any]:
        bench = Bench(shape, cfg, device, gen, flush)
        if not settled:  # the first shape warms the device before anything is timed
            already = hw.warmed_for(cfg.device)
            needed = max(cfg.warm_s - already, 0.0)
            settled.update(hw.settle(bench.burst_tflops, 2 * needed, least_s=needed),
                           warm_s=cfg.warm_s, already_warm_s=round(already, 1))
        return measure_shape(bench)

    began = time.monotonic()
    with precision(cfg.dtype):
        shapes, clocks = hw.each_at_once(cfg.shapes, measure, device, cfg.seed)
        top = sorted(range(len(shapes)), key=lambda i: -shapes[i]["tflops"])[:SECOND_PASS_SHAPES]
        again, _ = hw.measure_each([cfg.shapes[i] for i in top], measure, device, cfg.seed + 1)
    passes = second_pass(shapes, top, again)
    hw.loaded(cfg.device, began)
    best = max(shapes, key=lambda s: s["tflops"])
    what = f"{cfg.dtype} matmul {'x'.join(map(str, best['shape']))} on {device} ({hw.device_name(device)})"
    problem = wallclock_problem({"per_call_tflops": best["tflops"], **best}, cfg.wallclock_fraction, what)
    if problem:
        short = [s for s in shapes if s["wallclock_ratio"] < (cfg.wallclock_fraction or 0)]
        raise WorkloadError(f"{problem} ({len(short)} of {len(shapes)} shapes short of it)")
    _BEST[(str(device), cfg.dtype)] = tuple(best["shape"])  # type: ignore[assignment]
    median = statistics.median(s["tflops"] for s in shapes)
    details: dict[str, Any] = {
        "dtype": cfg.dtype, "device": hw.device_name(device), "tolerance": cfg.tolerance,
        "method": f"MAMF, as mamf-finder times it: per shape {cfg.warmup_calls} warm-up calls and {cfg.calls} timed "
                  f"ones queued straight after its operands were made, each timed alone, a {cfg.flush_bytes >> 20} "
                  "MiB cache flush and a fresh C before each (untimed); the median",
        "settle": settled, "shapes": shapes, "best_shape": best["shape"], "best_tflops": best["tflops"],
        "second_pass": passes, "tables": {"second pass over the best shapes": passes["rows"]},
        "wallclock": {"tflops": best["wallclock_tflops"], "ratio": best["wallclock_ratio"],
                      "least_ratio": cfg.wallclock_fraction,
                      "method": "the best shape's calls after its first, warm-up ones included, by the host's "
                                "clock (synchronize, loop, synchronize), less their refreshes at the median "
                                "refresh time"},
        "median_over_shapes_tflops": median, "clocks": clocks,
    }
    if cfg.peak_tflops:
        details["efficiency"] = best["tflops"] / cfg.peak_tflops
    desc = (f"{cfg.dtype} matmul, MAMF: best of {len(shapes)} shapes (the best {len(top)} timed twice, the better "
            f"pass kept), 2*M*N*K / median of {cfg.calls} calls (cache flushed before each), every device at once"
            + (" (tf32 is plain fp32 on CPU)" if cfg.dtype == "tf32" and device.type == "cpu" else ""))
    return Result(metrics=(Metric(f"matmul_{cfg.dtype}_tflops", best["tflops"], "TFLOPS", "gpu", desc),),
                  details=details)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--level", default="standard", choices=("quick", "standard", "extended"))
    parser.add_argument("--dtype", default="bf16", choices=DTYPES)
    parser.add_argument("--sweep", default="level", choices=("level", "wide"),
                        help="wide: 144 shapes, the reference the level's sweep is compared with")
    parser.add_argument("--shapes", nargs="*", default=None, metavar="MxNxK", help="shapes to sweep instead")
    parser.add_argument("--calls", type=int, default=None, help="timed calls per shape")
    parser.add_argument("--warmup-calls", type=int, default=None,
                        help="untimed calls queued right before each shape's timed calls (default: the level's)")
    args = parser.parse_args()
    with distributed() as here:
        cfg = Config.for_level(args.level, here.device, args.dtype)
        shapes = cfg.shapes
        if args.shapes:
            shapes = tuple(tuple(int(d) for d in s.lower().split("x")) for s in args.shapes)  # type: ignore[misc]
        elif args.sweep == "wide" and here.device.type == "cuda":
            shapes = wide_sweep()
        cfg = dataclasses.replace(cfg, shapes=shapes, calls=args.calls or cfg.calls,
                                  warmup_calls=cfg.warmup_calls if args.warmup_calls is None else args.warmup_calls)
        result = run(cfg)
        d = result.details
        for s in d["shapes"]:
            print(f"rank {here.rank} {cfg.dtype} {'x'.join(map(str, s['shape'])):>18}: median {s['tflops']:7.1f} "
                  f"max {s['tflops_max']:7.1f} mean {s['tflops_mean']:7.1f} TFLOPS, host clock "
                  f"{s['wallclock_tflops']:7.1f} ({s['wallclock_ratio']:.3f} of the median)")
        print(f"rank {here.rank} {d['device']}: {cfg.dtype} best {d['best_tflops']:.4g} TFLOPS at "
              f"{'x'.join(map(str, d['best_shape']))}, median over {len(d['shapes'])} shapes "
              f"{d['median_over_shapes_tflops']:.4g}; settle {d['settle']}; clocks {d['clocks']}")


if __name__ == "__main__":
    main()
