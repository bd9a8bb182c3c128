"""Burn-in: sustained matmul for a set time, every product compared with a reference (gpu-burn style).

One product C_ref = A @ B is checked against float64 first; then the same product is computed
into several output buffers again and again, and every one is compared with C_ref. A GEMM with the
same inputs on the same GPU repeats bit for bit (cuBLAS's reproducibility guarantee on one stream),
so any difference is a computing fault. Clocks and clock event reasons are sampled throughout:
a thermal, power-brake or hardware slowdown under sustained load fails the burn-in too.

Run alone: torchrun --nproc-per-node=8 -m workloads.gpu.burn_in --seconds 60
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass
from typing import Any

import torch

from workloads.clocks import ClockSampler
from workloads.common import check_level, distributed, place, synchronize
from workloads.gpu import _hw as hw
from workloads.gpu.matmul import RTOL, Shape, check_error, operands, precision, product_fn, sample_error, tflops
from workloads.result import Metric, Result, WorkloadError


@dataclass(frozen=True, kw_only=True, slots=True)
class Config:
    duration_s: float = 10.0
    """Seconds of sustained matmul (the profile's burn_in_s)."""
    dtype: str = "bf16"
    shape: Shape = (256, 256, 256)
    outputs: int = 4
    """Output buffers per iteration; every product is compared with the reference."""
    interval_s: float = 1.0
    """Seconds per reported interval (throughput curve, error counts read back)."""
    exact: bool = True
    """Compare bit for bit (deterministic GEMM); False: count elements beyond the dtype's RTOL."""
    device: str = "cpu"
    seed: int = 99

    def __post_init__(self) -> None:
        if self.duration_s <= 0 or self.outputs < 1 or self.interval_s <= 0:
            raise ValueError(f"duration_s, outputs and interval_s must be positive, got {self}")
        if self.dtype not in RTOL or self.dtype == "fp8":
            raise ValueError(f"burn-in dtype must be bf16, fp16 or tf32, got {self.dtype!r}")

    @classmethod
    def for_level(cls, level: str, device: torch.device, duration_s: float, dtype: str = "bf16") -> Config:
        """The suite runs it at extended only; the level sets nothing else (duration_s is the profile's)."""
        check_level(level)
        shape = (8192, 8192, 8192) if device.type == "cuda" else (256, 256, 256)
        return cls(duration_s=float(duration_s), dtype=dtype, shape=shape, device=str(device))


def _counter(cfg: Config, ref: torch.Tensor) -> Any:
    """Per-output comparison returning a device-side count of wrong elements (no host sync)."""
    if cfg.exact:
        return lambda c: torch.count_nonzero(c != ref)
    ref_f = ref.float()
    limit = RTOL[cfg.dtype] * (ref_f.abs() + ref_f.pow(2).mean().sqrt())
    return lambda c: torch.count_nonzero((c.float() - ref_f).abs() > limit)


def run(cfg: Config) -> Result:
    device = torch.device(cfg.device)
    gen = torch.Generator(device=device).manual_seed(cfg.seed + place().rank)
    what = f"burn-in {cfg.dtype} {'x'.join(map(str, cfg.shape))} on {device} ({hw.device_name(device)})"
    hw.start_together()
    try:
        with precision(cfg.dtype):
            a, b_t, ref = operands(cfg.shape, cfg.dtype, device, gen)
            product = product_fn(cfg.dtype, device)
            product([a, b_t, ref])
            m, n, _ = cfg.shape
            rows = torch.randperm(m, device=device, generator=gen)[:64]
            cols = torch.randperm(n, device=device, generator=gen)[:64]
            check_error(sample_error(a, b_t, ref, rows, cols), RTOL[cfg.dtype], what)
            outs = [torch.empty_like(ref) for _ in range(cfg.outputs)]
            count = _counter(cfg, ref)
            with ClockSampler(device) as clocks:
                intervals = _sustain(cfg, device, a, b_t, outs, product, count)
    finally:
        hw.release(device)
    summary = clocks.summary()
    rates = [i["tflops"] for i in intervals]
    details = {"dtype": cfg.dtype, "shape": list(cfg.shape), "device": hw.device_name(device),
               "duration_s": cfg.duration_s, "products": sum(i["products"] for i in intervals),
               "wrong_elements": sum(i["wrong_elements"] for i in intervals),
               "wrong_intervals": [k for k, i in enumerate(intervals) if i["wrong_elements"]][:20],
               "comparison": "bitwise" if cfg.exact else f"rtol {RTOL[cfg.dtype]}",
               "tflops_min": min(rates), "tflops_max": max(rates), "intervals": intervals, "clocks": summary}
    problems = burn_in_problems(details, device.type == "cuda")
    if problems:
        raise WorkloadError(f"{what}: " + "; ".join(problems) + f" (over {details['products']} products, "
                            f"{cfg.duration_s:.0f} s)")
    desc = f"sustained {cfg.dtype} matmul {'x'.join(map(str, cfg.shape))}, median over {len(intervals)} intervals"
    return Result(metrics=(Metric("burn_in_tflops", statistics.median(rates), "TFLOPS", "gpu", desc),),
                  details=details)


def _sustain(cfg: Config, device: torch.device, a: torch.Tensor, b_t: torch.Tensor, outs: list[torch.Tensor],
             product: Any, count: Any) -> list[dict[str, Any]]:
    """Run for cfg.duration_s; per interval the matmul-only throughput and wrong elements found."""
    cuda = device.type == "cuda"
    wrong = torch.zeros((), dtype=torch.int64, device=device)
    t0 = time.monotonic()
    per_interval = 1
    intervals: list[dict[str, Any]] = []
    while time.monotonic() - t0 < cfg.duration_s:
        marks: list[Any] = []
        busy = 0.0
        for _ in range(per_interval):
            start = _mark(cuda)
            for c in outs:
                product([a, b_t, c])
            end = _mark(cuda)
            if cuda:
                marks.append((start, end))
            else:
                busy += end - start
            for c in outs:  # compares stay out of the timed span
                wrong += count(c)
        synchronize(device)
        busy += sum(s.elapsed_time(e) / 1e3 for s, e in marks)
        products = per_interval * len(outs)
        intervals.append({"t_s": round(time.monotonic() - t0, 2), "products": products,
                          "tflops": tflops(cfg.shape, busy, products), "wrong_elements": int(wrong)})
        wrong.zero_()
        per_interval = max(1, round(cfg.interval_s / (busy / per_interval)))
    return intervals


def _mark(cuda: bool) -> Any:
    if cuda:
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event
    return time.perf_counter()


def burn_in_problems(details: dict[str, Any], on_gpu: bool) -> list[str]:
    """What makes a burn-in fail: wrong products, slowdowns, or clocks nobody could watch on a GPU."""
    problems: list[str] = []
    if details["wrong_elements"]:
        problems.append(f"{details['wrong_elements']} wrong elements ({details['comparison']} against the "
                        f"reference) in intervals {details['wrong_intervals']}: the GPU computes wrong results "
                        "under load; drain it and run dcgmi diag -r 3 / field diagnostics")
    clocks = details["clocks"]
    if clocks.get("bad_clock_events"):
        seen = {k: clocks["clock_event_reasons"][k] for k in clocks["bad_clock_events"]}
        problems.append(f"clock slowdown under sustained load: {seen} (share of samples); max temperature "
                        f"{clocks['temperature_c']['max']} C: check cooling and power delivery")
    if on_gpu and clocks.get("status") != "sampled":
        problems.append(f"clocks could not be watched ({clocks.get('status')}): install nvidia-ml-py")
    return problems


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--dtype", default="bf16", choices=("bf16", "fp16", "tf32"))
    args = parser.parse_args()
    with distributed() as here:
        result = run(Config.for_level("extended", here.device, args.seconds, args.dtype))
        d = result.details
        print(f"rank {here.rank}: {d['products']} products, no wrong element, {result.metrics[0].value:.4g} TFLOPS "
              f"sustained (min {d['tflops_min']:.4g}), clocks {d['clocks']}")


if __name__ == "__main__":
    main()
