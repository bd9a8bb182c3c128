"""Dense matmul TFLOPS per device: a small shape sweep, correctness against float64 first.

TFLOPS = 2*M*N*K / t at the median time of each shape; the metric is the best shape (the median
over shapes is kept in details). B is stored (N, K) and used transposed, as nn.Linear does (and as
fp8's torch._scaled_mm requires). Operand sets rotate so their total is past the L2 cache; clocks
and clock event reasons are sampled during the run. Every rank measures at once.

Run alone: torchrun --nproc-per-node=8 -m workloads.gpu.matmul --dtype bf16 [--sweep wide]
"""

from __future__ import annotations

import argparse
import math
import statistics
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from workloads.common import check_level, distributed, time_runs
from workloads.gpu import _hw as hw
from workloads.result import Metric, Result, WorkloadError

Shape = tuple[int, int, int]
DTYPES = ("bf16", "fp16", "tf32", "fp8")
RTOL = {"bf16": 1e-2, "fp16": 5e-3, "tf32": 2e-3, "fp8": 1e-2}
"""Allowed |C - ref| / (|ref| + rms(ref)) per element against float64 from the same inputs.
bf16/fp16/fp8 (bf16 output): output rounding 2^-9 / 2^-11. tf32: the tensor cores round or
truncate fp32 inputs to 10 mantissa bits, up to ~1e-3 here. A wrong result is O(1)."""

SQUARE = ((4096, 4096, 4096), (8192, 8192, 8192), (16384, 16384, 16384))
# Long-K shapes: where wide sweeps find H100's best bf16 (ml-engineering MAMF table, ~795 TFLOPS).
LONG_K = ((2048, 2048, 13312), (6144, 2816, 17920))
GPU_SHAPES: dict[str, tuple[Shape, ...]] = {
    "quick": ((8192, 8192, 8192), (2048, 2048, 13312)),
    "standard": SQUARE + LONG_K,
    "extended": SQUARE + LONG_K + ((8192, 8192, 16384), (16384, 8192, 4096), (1024, 15360, 4096)),
}
FP8_SHAPES = ((1024, 9216, 14336),)  # best fp8 shape of the same table (~1400 TFLOPS on H100)
CPU_SHAPES: dict[str, tuple[Shape, ...]] = {
    "quick": ((256, 256, 256), (512, 512, 512)),
    "standard": ((256, 256, 256), (512, 512, 512), (384, 512, 256)),
    "extended": ((256, 256, 256), (512, 512, 512), (384, 512, 256), (768, 768, 768)),
}
WIDE_SIDES, WIDE_K = (1024, 2048, 4096, 6144, 8192, 16384), (4096, 8192, 13312, 16384)


def wide_sweep() -> tuple[Shape, ...]:
    """The fidelity reference: 144 shapes, to compare the standard sweep's best with."""
    return tuple((m, n, k) for m in WIDE_SIDES for n in WIDE_SIDES for k in WIDE_K)


@dataclass(frozen=True, kw_only=True, slots=True)
class Config:
    dtype: str = "bf16"
    """bf16 | fp16 | tf32 (fp32 inputs on tensor cores; plain fp32 on CPU) | fp8 (e4m3, bf16 out)."""
    shapes: tuple[Shape, ...] = CPU_SHAPES["standard"]
    """(M, N, K) triples to sweep."""
    seconds_per_shape: float = 0.3
    """Timed seconds per shape (after warm-up): sets the number of timed runs."""
    warmup_s: float = 0.1
    rotate_bytes: int = 3 * hw.DEFAULT_L2_BYTES
    """Operand sets rotate until their total passes this (3x L2), so L2 never holds the inputs."""
    sample: int = 64
    """Rows and columns of C checked against the float64 reference (before and after timing)."""
    rtol: float | None = None
    """Allowed error (see RTOL); None: the dtype's default."""
    peak_tflops: float | None = None
    """The profile's dense peak for this dtype, for the efficiency in details (never judged here)."""
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

    @property
    def tolerance(self) -> float:
        return self.rtol if self.rtol is not None else RTOL[self.dtype]

    @classmethod
    def for_level(cls, level: str, device: torch.device, dtype: str = "bf16",
                  peak_tflops: float | None = None) -> Config:
        check_level(level)
        if device.type == "cpu":
            # Past the per-core L2 (the L3 would need hundreds of sets of these small shapes).
            return cls(dtype=dtype, shapes=CPU_SHAPES[level], device=str(device), peak_tflops=peak_tflops,
                       seconds_per_shape={"quick": 0.1, "standard": 0.2, "extended": 1.0}[level], warmup_s=0.05,
                       rotate_bytes=8 << 20)
        shapes = GPU_SHAPES[level] + (FP8_SHAPES if dtype == "fp8" else ())
        return cls(dtype=dtype, shapes=shapes, device=str(device), peak_tflops=peak_tflops,
                   seconds_per_shape={"quick": 0.5, "standard": 1.0, "extended": 3.0}[level],
                   warmup_s=0.3, rotate_bytes=3 * hw.l2_cache_bytes(device))


def flops(shape: Shape) -> int:
    m, n, k = shape
    return 2 * m * n * k


def tflops(shape: Shape, seconds: float, products: int = 1) -> float:
    return flops(shape) * products / seconds / 1e12


def element_bytes(dtype: str) -> tuple[int, int]:
    """(input, output) bytes per element."""
    return {"bf16": (2, 2), "fp16": (2, 2), "tf32": (4, 4), "fp8": (1, 2)}[dtype]


def sets_needed(shape: Shape, dtype: str, rotate_bytes: int) -> int:
    """Operand sets (A, B, C) whose total passes ``rotate_bytes``."""
    m, n, k = shape
    inp, out = element_bytes(dtype)
    return max(1, math.ceil(rotate_bytes / ((m * k + n * k) * inp + m * n * out)))


def fp8_unsupported(device: torch.device) -> str | None:
    """Why fp8 matmul cannot run here, or None."""
    if device.type != "cuda":
        return "fp8 matmul needs a GPU with fp8 tensor cores (compute capability 8.9+), not a CPU"
    if not hasattr(torch, "_scaled_mm") or not hasattr(torch, "float8_e4m3fn"):
        return f"torch {torch.__version__} has no torch._scaled_mm / float8_e4m3fn"
    cap = torch.cuda.get_device_capability(device)
    if cap < (8, 9):
        return f"{torch.cuda.get_device_name(device)} (sm_{cap[0]}{cap[1]}) has no fp8 tensor cores (needs 8.9+)"
    return None


def sample_error(a: torch.Tensor, b_t: torch.Tensor, c: torch.Tensor, rows: torch.Tensor,
                 cols: torch.Tensor) -> dict[str, float]:
    """Error of C = A @ B_t.T on rows x cols against float64 computed from the same inputs."""
    ref = a[rows].float().double() @ b_t[cols].float().double().t()
    got = c[rows][:, cols].float().double()
    rms = ref.pow(2).mean().sqrt()
    diff = (got - ref).abs()
    return {"max_rel_err": float((diff / (ref.abs() + rms)).max()),
            "norm_rel_err": float(diff.norm() / ref.norm()), "finite": bool(torch.isfinite(got).all())}


def check_error(err: dict[str, float], tolerance: float, what: str) -> None:
    """Raise WorkloadError when a sample is wrong (correctness before speed)."""
    if not err["finite"] or not err["max_rel_err"] <= tolerance:
        raise WorkloadError(
            f"{what}: wrong result: max |C - ref| / (|ref| + rms) = {err['max_rel_err']:.3g} "
            f"(norm-wise {err['norm_rel_err']:.3g}, finite={err['finite']}), allowed {tolerance:g}; "
            "a GPU computing wrong answers must be drained: rerun, then run dcgmi diag -r 3 / field diagnostics")


def operands(shape: Shape, dtype: str, device: torch.device, gen: torch.Generator) -> list[torch.Tensor]:
    """[A (M, K), B_t (N, K), C (M, N)]: random inputs in the dtype, C uninitialised."""
    m, n, k = shape
    torch_in = {"bf16": torch.bfloat16, "fp16": torch.float16, "tf32": torch.float32}.get(dtype)
    if torch_in is None:
        torch_in = torch.float8_e4m3fn
    a = torch.randn(m, k, device=device, generator=gen).to(torch_in)
    b_t = torch.randn(n, k, device=device, generator=gen).to(torch_in)
    c = torch.empty(m, n, device=device, dtype=torch.bfloat16 if dtype == "fp8" else torch_in)
    return [a, b_t, c]


def product_fn(dtype: str, device: torch.device) -> Callable[[list[torch.Tensor]], None]:
    """C = A @ B_t.T for one operand set, in place (fp8: the set's C is replaced by the output)."""
    if dtype != "fp8":
        def mm(s: list[torch.Tensor]) -> None:
            torch.mm(s[0], s[1].t(), out=s[2])
        return mm
    one = torch.ones((), device=device, dtype=torch.float32)

    def scaled(s: list[torch.Tensor]) -> None:
        out = torch._scaled_mm(s[0], s[1].t(), one, one, out_dtype=torch.bfloat16)
        s[2] = out[0] if isinstance(out, tuple) else out  # torch < 2.5 returned (out, amax)
    return scaled


@contextmanager
def precision(dtype: str) -> Iterator[None]:
    """tf32 on: fp32 matmuls use the tensor cores (no effect on CPU). Restored afterwards."""
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high" if dtype == "tf32" else "highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)


def measure_shape(shape: Shape, cfg: Config, device: torch.device, gen: torch.Generator) -> dict[str, Any]:
    """Check, warm up and time one shape; the figures of its timed runs."""
    sets = [operands(shape, cfg.dtype, device, gen) for _ in range(sets_needed(shape, cfg.dtype, cfg.rotate_bytes))]
    product = product_fn(cfg.dtype, device)
    m, n, _ = shape
    rows = torch.randperm(m, device=device, generator=gen)[: cfg.sample]
    cols = torch.randperm(n, device=device, generator=gen)[: cfg.sample]
    what = f"{cfg.dtype} matmul {m}x{n}x{shape[2]} on {device} ({hw.device_name(device)})"
    product(sets[0])
    before = sample_error(*sets[0], rows, cols)
    check_error(before, cfg.tolerance, what)

    def one_pass() -> None:
        for s in sets:
            product(s)
    t_pass = min(time_runs(one_pass, device, warmup=1, repeats=2))
    inner = max(1, round(0.02 / t_pass))  # ~20 ms per timed run: event overhead negligible

    def timed() -> None:
        for _ in range(inner):
            one_pass()
    t_run = inner * t_pass
    times = time_runs(timed, device, warmup=max(1, math.ceil(cfg.warmup_s / t_run)),
                      repeats=min(1000, max(3, round(cfg.seconds_per_shape / t_run))))
    after = sample_error(*sets[-1], rows, cols)  # a product from the end of the timed runs
    check_error(after, cfg.tolerance, what + " after the timed runs")
    products = inner * len(sets)
    return {"shape": list(shape), "tflops": tflops(shape, statistics.median(times), products),
            "tflops_min": tflops(shape, max(times), products), "tflops_max": tflops(shape, min(times), products),
            "runs": len(times), "products_per_run": products, "operand_sets": len(sets),
            "max_rel_err": max(before["max_rel_err"], after["max_rel_err"])}


def run(cfg: Config) -> Result:
    """Sweep the shapes on this rank's device (every rank at once); the best shape is the metric."""
    device = torch.device(cfg.device)
    if cfg.dtype == "fp8" and (why := fp8_unsupported(device)):
        raise WorkloadError(f"fp8 matmul cannot run: {why}")
    with precision(cfg.dtype):
        shapes, clocks = hw.each_at_once(cfg.shapes, lambda s, gen: measure_shape(s, cfg, device, gen), device,
                                         cfg.seed)
    best = max(shapes, key=lambda s: s["tflops"])
    median = statistics.median(s["tflops"] for s in shapes)
    details: dict[str, Any] = {
        "dtype": cfg.dtype, "device": hw.device_name(device), "tolerance": cfg.tolerance, "shapes": shapes,
        "best_shape": best["shape"], "best_tflops": best["tflops"], "median_over_shapes_tflops": median,
        "clocks": clocks,
    }
    if cfg.peak_tflops:
        details["efficiency"] = best["tflops"] / cfg.peak_tflops
    desc = (f"{cfg.dtype} matmul, best of {len(shapes)} shapes (2*M*N*K / median time), every device at once"
            + (" (tf32 is plain fp32 on CPU)" if cfg.dtype == "tf32" and device.type == "cpu" else ""))
    return Result(metrics=(Metric(f"matmul_{cfg.dtype}_tflops", best["tflops"], "TFLOPS", "gpu", desc),),
                  details=details)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--level", default="standard", choices=("quick", "standard", "extended"))
    parser.add_argument("--dtype", default="bf16", choices=DTYPES)
    parser.add_argument("--sweep", default="level", choices=("level", "wide"),
                        help="wide: 144 shapes, the reference the level's sweep is compared with")
    parser.add_argument("--seconds-per-shape", type=float, default=None)
    args = parser.parse_args()
    with distributed() as here:
        cfg = Config.for_level(args.level, here.device, args.dtype)
        if args.sweep == "wide" or args.seconds_per_shape:
            shapes = wide_sweep() if args.sweep == "wide" and here.device.type == "cuda" else cfg.shapes
            seconds = args.seconds_per_shape or (0.3 if args.sweep == "wide" else cfg.seconds_per_shape)
            cfg = Config(dtype=cfg.dtype, shapes=shapes, device=cfg.device, warmup_s=cfg.warmup_s,
                         seconds_per_shape=seconds, rotate_bytes=cfg.rotate_bytes)
        result = run(cfg)
        d = result.details
        print(f"rank {here.rank} {d['device']}: {cfg.dtype} best {d['best_tflops']:.4g} TFLOPS at "
              f"{'x'.join(map(str, d['best_shape']))}, median over {len(d['shapes'])} shapes "
              f"{d['median_over_shapes_tflops']:.4g}; clocks {d['clocks']}")


if __name__ == "__main__":
    main()
