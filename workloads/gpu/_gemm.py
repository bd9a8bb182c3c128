"""One GEMM of the matmul workloads: its operands, its product per dtype, its FLOP count and its check
against float64. Shared by the MAMF sweep (matmul.py) and the sustained run (burn_in.py).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from workloads.result import WorkloadError

Shape = tuple[int, int, int]
DTYPES = ("bf16", "fp16", "tf32", "fp8")
RTOL = {"bf16": 1e-2, "fp16": 5e-3, "tf32": 2e-3, "fp8": 1e-2}
"""Allowed |C - ref| / (|ref| + rms(ref)) per element against float64 from the same inputs.
bf16/fp16/fp8 (bf16 output): output rounding 2^-9 / 2^-11. tf32: the tensor cores round or
truncate fp32 inputs to 10 mantissa bits, up to ~1e-3 here. A wrong result is O(1)."""


def flops(shape: Shape) -> int:
    m, n, k = shape
    return 2 * m * n * k


def tflops(shape: Shape, seconds: float, products: int = 1) -> float:
    return flops(shape) * products / seconds / 1e12


@dataclass(frozen=True, slots=True)
class Loop:
    """One shape's calls: each timed call's seconds on the device, each untimed refresh's (cache flush and
    fresh C before a call), and the host's wall clock over the whole loop, from a synchronized device to
    the synchronize after the last call. ``products``: the calls inside that wall clock, warm-up calls
    queued ahead of the timed ones included (None: the timed calls alone); each had one refresh."""

    calls: list[float]
    refreshes: list[float]
    wall_s: float
    products: int | None = None


def wallclock_figures(shape: Shape, loop: Loop) -> dict[str, float]:
    """The per-call figure (2*M*N*K / the median call, the judged MAMF figure) beside the same calls' figure
    by the host's clock: every call's FLOPs over the loop's wall time less the refreshes (each at their median,
    so a refresh that a time slice of another process fell into is not subtracted whole).

    Each call timed alone mostly runs inside this process's time slices, so a GPU shared with another job
    keeps its per-call figure; the host's clock counts the other job's slices too. On a GPU the job has to
    itself the two agree within the calls' spread (the mean call is a little slower than the median)."""
    n = loop.products or len(loop.calls)
    median_call = statistics.median(loop.calls)
    median_refresh = statistics.median(loop.refreshes) if loop.refreshes else 0.0
    busy = max(loop.wall_s - n * median_refresh, 1e-12)
    per_call = tflops(shape, median_call)
    wall = tflops(shape, busy, n)
    return {"per_call_tflops": per_call, "wallclock_tflops": wall, "wallclock_ratio": wall / per_call,
            "wall_s": loop.wall_s, "median_refresh_s": median_refresh}


def wallclock_problem(figures: dict[str, float], fraction: float | None, what: str) -> str | None:
    """Why the host's clock disagrees with the per-call figure (below ``fraction`` of it), or None."""
    if fraction is None or figures["wallclock_ratio"] >= fraction:
        return None
    return (f"{what}: {figures['per_call_tflops']:.1f} TFLOPS a call (median, each call timed alone on the device) "
            f"but {figures['wallclock_tflops']:.1f} TFLOPS by the host's clock over the same calls "
            f"({figures['wall_s'] * 1e3:.1f} ms less their cache flushes): "
            f"{figures['wallclock_ratio']:.2f} of it, below the profile's matmul_wallclock_fraction {fraction:g}. "
            "The GPU's time went elsewhere between the timed calls: another process on the GPU (nvidia-smi; "
            "test_no_foreign_gpu_processes), MPS or vGPU time slicing, or a host too busy to keep the GPU fed")


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
