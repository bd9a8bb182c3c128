"""Sustained matmul: the best shape held for a set time, every product compared (gpu-burn style).

The figure beside the achievable one (workloads.gpu.matmul): the same product back to back for
``duration_s``, reported per ~1 s window, with power draw, SM/memory clocks and clock event
("throttle") reasons sampled alongside. A 700 W H100/H200 settles at its power limit within a
second, so software power capping (NVML reason 0x4) at full load is normal and only shown; hardware
slowdown, thermal slowdown or power brake under load is a failure (``power_problems``).

One product C_ref = A @ B is checked against float64 first; then the same product is computed into
several output buffers again and again, and every one is compared with C_ref. A GEMM with the same
inputs on the same GPU repeats bit for bit (cuBLAS's reproducibility guarantee on one stream), so
any difference is a computing fault. The comparisons run between the timed products (a few per
cent of the device's time, in ``duty``); the throughput counts the products' own time.

Run alone: torchrun --nproc-per-node=8 -m workloads.gpu.burn_in --seconds 60
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass
from typing import Any

import torch

from workloads import heartbeat
from workloads.clocks import BAD_CLOCK_EVENTS, ClockSampler, reason_names
from workloads.common import check_level, distributed, place, synchronize
from workloads.gpu import _hw as hw
from workloads.gpu._gemm import RTOL, Shape, check_error, operands, precision, product_fn, sample_error, tflops
from workloads.result import Metric, Result, WorkloadError

DEFAULT_SHAPE: Shape = (4096, 4096, 8192)
"""Held when no sweep ran before in this process (below --level extended the hold comes first): the best bf16
and fp16 MAMF shape on H100 and H200 (docs/reference-figures.md: 795.4 TFLOPS there on an H100, 727 on an
H200), and the shape of mamf-finder's held figure."""
SECONDS = {"cuda": {"quick": 2.0, "standard": 20.0}, "cpu": {"quick": 1.0, "standard": 2.0}}
"""Seconds held below --level extended (never more than the profile's burn_in_s); extended: burn_in_s. Below
extended the hold runs before the matmul sweeps and is their warm-up (``_hw.loaded``; the acceptance suite's
order): a 700 W H100 reaches its power cap within a second, and what it holds moves little after that (one
H100: 729.7 TFLOPS held 5 s, 723.2 held 20 s; another 748-749 held 5 s, 745.5 held 10 s; within 1%). Quick
holds 2 s: the short first window and two of about 1 s. Extended holds minutes, a thermal soak: it runs after
the sweeps, which would otherwise be timed on a GPU hotter than mamf-finder's warm-up leaves it."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Config:
    duration_s: float = 10.0
    """Seconds of sustained matmul."""
    dtype: str = "bf16"
    shape: Shape = (256, 256, 256)
    shape_source: str = "given"
    """Where the shape comes from (the best shape of this run's sweep, or the default)."""
    outputs: int = 4
    """Output buffers per burst; every product is compared with the reference."""
    interval_s: float = 1.0
    """Seconds per reported window (throughput, power and clocks, errors read back)."""
    exact: bool = True
    """Compare bit for bit (deterministic GEMM); False: count elements beyond the dtype's RTOL."""
    device: str = "cpu"
    seed: int = 99
    heartbeat_s: float = heartbeat.INTERVAL_S
    """At most this often a progress line on rank 0 (seconds held, time left): extended holds it for minutes."""

    def __post_init__(self) -> None:
        if self.duration_s <= 0 or self.outputs < 1 or self.interval_s <= 0:
            raise ValueError(f"duration_s, outputs and interval_s must be positive, got {self}")
        if self.dtype not in RTOL or self.dtype == "fp8":
            raise ValueError(f"sustained matmul dtype must be bf16, fp16 or tf32, got {self.dtype!r}")

    @classmethod
    def for_level(cls, level: str, device: torch.device, burn_in_s: float, dtype: str = "bf16",
                  best: Shape | None = None) -> Config:
        """``burn_in_s`` (the profile's) at extended, a short hold below it; ``best``: the sweep's best shape."""
        check_level(level)
        kind = "cuda" if device.type == "cuda" else "cpu"
        seconds = float(burn_in_s) if level == "extended" else min(SECONDS[kind][level], float(burn_in_s))
        if best is not None:
            shape, source = best, f"best {dtype} MAMF shape of this run"
        else:
            shape, source = (DEFAULT_SHAPE, "default (no sweep ran here)") if kind == "cuda" else \
                ((256, 256, 256), "CPU size")
        return cls(duration_s=seconds, dtype=dtype, shape=shape, shape_source=source, device=str(device))


def metric_name(dtype: str) -> str:
    return f"matmul_{dtype}_sustained_tflops"


def _counter(cfg: Config, ref: torch.Tensor) -> Any:
    """Per-output comparison returning a device-side count of wrong elements (no host sync)."""
    if cfg.exact:
        return lambda c: torch.count_nonzero(c != ref)
    ref_f = ref.float()
    limit = RTOL[cfg.dtype] * (ref_f.abs() + ref_f.pow(2).mean().sqrt())
    return lambda c: torch.count_nonzero((c.float() - ref_f).abs() > limit)


_LAST: dict[str, dict[str, Any]] = {}


def last_run(device: torch.device) -> dict[str, Any] | None:
    """Power, clocks and windows of the last sustained run in this process on ``device`` (None before one):
    what the power-under-load check judges."""
    return _LAST.get(str(device))


def run(cfg: Config) -> Result:
    device = torch.device(cfg.device)
    gen = torch.Generator(device=device).manual_seed(cfg.seed + place().rank)
    what = f"sustained {cfg.dtype} {'x'.join(map(str, cfg.shape))} on {device} ({hw.device_name(device)})"
    _LAST.pop(str(device), None)
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
            limit_w = hw.power_limit_w(device)
            with ClockSampler(device) as clocks:
                began = time.monotonic()
                windows = _sustain(cfg, device, a, b_t, outs, product, count, clocks)
                hw.loaded(cfg.device, began)  # the hold warms the device for a matmul sweep after it
    finally:
        hw.release(device)
    rates = [w["tflops"] for w in windows]
    details = {"dtype": cfg.dtype, "shape": list(cfg.shape), "shape_source": cfg.shape_source,
               "device": hw.device_name(device), "duration_s": cfg.duration_s,
               "products": sum(w["products"] for w in windows),
               "wrong_elements": sum(w["wrong_elements"] for w in windows),
               "wrong_windows": [k for k, w in enumerate(windows) if w["wrong_elements"]][:20],
               "comparison": "bitwise" if cfg.exact else f"rtol {RTOL[cfg.dtype]}",
               "tflops_min": min(rates), "tflops_max": max(rates), "power_limit_w": limit_w,
               "power": power_summary(clocks.summary(), limit_w), "clocks": clocks.summary(), "intervals": windows}
    _LAST[str(device)] = {"what": what, "power": details["power"], "clocks": details["clocks"],
                          "windows": len(windows)}
    if details["wrong_elements"]:
        raise WorkloadError(f"{what}: {details['wrong_elements']} wrong elements ({details['comparison']} against "
                            f"the reference) in windows {details['wrong_windows']} over {details['products']} "
                            f"products, {cfg.duration_s:.0f} s: the GPU computes wrong results under load; drain it "
                            "and run dcgmi diag -r 3 / field diagnostics")
    desc = (f"sustained {cfg.dtype} matmul {'x'.join(map(str, cfg.shape))} ({cfg.shape_source}) for "
            f"{cfg.duration_s:g} s: median of {len(windows)} windows of ~{cfg.interval_s:g} s, every product checked")
    return Result(metrics=(Metric(metric_name(cfg.dtype), statistics.median(rates), "TFLOPS", "gpu", desc),),
                  details=details)


def _sustain(cfg: Config, device: torch.device, a: torch.Tensor, b_t: torch.Tensor, outs: list[torch.Tensor],
             product: Any, count: Any, clocks: ClockSampler) -> list[dict[str, Any]]:
    """Run for cfg.duration_s; per window the products' throughput, wrong elements, power and clocks."""
    cuda = device.type == "cuda"
    wrong = torch.zeros((), dtype=torch.int64, device=device)
    t0 = time.monotonic()
    per_window = 1
    windows: list[dict[str, Any]] = []
    beat = heartbeat.Heartbeat(f"sustained {cfg.dtype} matmul on {device}", total=cfg.duration_s, unit="s",
                               interval_s=cfg.heartbeat_s)
    while time.monotonic() - t0 < cfg.duration_s:
        start_s, first_sample = time.monotonic(), len(clocks.samples)
        marks: list[Any] = []
        busy = 0.0
        for _ in range(per_window):
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
        wall = time.monotonic() - start_s
        products = per_window * len(outs)
        windows.append({"t_s": round(time.monotonic() - t0, 2), "products": products,
                        "tflops": tflops(cfg.shape, busy, products), "duty": round(min(1.0, busy / wall), 3),
                        "wrong_elements": int(wrong), **window_clocks(clocks.samples[first_sample:])})
        wrong.zero_()
        per_window = max(1, round(cfg.interval_s / (busy / per_window)))
        held = time.monotonic() - t0
        beat(round(held), left_s=max(0.0, cfg.duration_s - held),
             note=f"{len(windows)} windows, {sum(w['wrong_elements'] for w in windows)} wrong elements")
    return windows


def _mark(cuda: bool) -> Any:
    if cuda:
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event
    return time.perf_counter()


def window_clocks(samples: list[dict[str, float]]) -> dict[str, Any]:
    """Median power and clocks of one window's samples and every clock event reason seen in it."""
    if not samples:
        return {}
    med = {k: statistics.median(s[k] for s in samples) for k in ("power_w", "sm_clock_mhz", "mem_clock_mhz")}
    mask = 0
    for s in samples:
        mask |= int(s["reasons"])
    return {**med, "reasons": reason_names(mask)}


def power_summary(clocks: dict[str, Any], limit_w: float | None) -> dict[str, Any]:
    """Power draw against the enforced limit, from a ClockSampler summary."""
    if clocks.get("status") != "sampled" or "power_w" not in clocks:
        return {"status": clocks.get("status")}
    draw = clocks["power_w"]["median"]
    return {"status": "sampled", "median_w": draw, "max_w": clocks["power_w"]["max"], "limit_w": limit_w,
            "fraction_of_limit": draw / limit_w if limit_w else None,
            "sw_power_cap_share": clocks["clock_event_reasons"].get("sw_power_cap", 0.0)}


def power_problems(run: dict[str, Any], on_gpu: bool) -> list[str]:
    """What fails power under load: a hardware, thermal or power-brake slowdown, or clocks nobody could watch."""
    clocks = run["clocks"]
    if clocks.get("status") != "sampled":
        return [f"clocks and power could not be watched ({clocks.get('status')}): install nvidia-ml-py"] \
            if on_gpu else []
    bad = list(clocks.get("bad_clock_events", []))
    if not bad:
        return []
    seen = {k: clocks["clock_event_reasons"][k] for k in bad}
    return [f"{run['what']}: clock slowdown under sustained load: {seen} (share of samples; reasons 0x"
            f"{BAD_CLOCK_EVENTS:x} fail, a software power cap does not); max temperature "
            f"{clocks['temperature_c']['max']} C, median power {clocks['power_w']['median']:.0f} W: check cooling, "
            "the power supply and the board (nvidia-smi -q -d PERFORMANCE)"]


def power_result(run: dict[str, Any], on_gpu: bool) -> Result:
    """Power under load as metrics (median draw, draw / enforced limit, SM clock), or the failure."""
    problems = power_problems(run, on_gpu)
    if problems:
        raise WorkloadError("; ".join(problems))
    power, clocks = run["power"], run["clocks"]
    details = {"power": power, "clocks": clocks, "windows": run["windows"]}
    if power.get("status") != "sampled":
        raise WorkloadError(f"{run['what']}: no power samples ({power.get('status')})")
    metrics = [Metric("sustained_power_w", power["median_w"], "W", "gpu",
                      "median power draw during the sustained matmul (NVML, 0.1 s samples)"),
               Metric("sustained_sm_clock_mhz", clocks["sm_clock_mhz"]["median"], "MHz", "gpu",
                      "median SM clock during the sustained matmul")]
    if power["fraction_of_limit"] is not None:
        metrics.append(Metric("sustained_power_fraction", power["fraction_of_limit"], "fraction", "gpu",
                              "median power draw / enforced power limit during the sustained matmul; software "
                              "power capping at full load is expected"))
    return Result(metrics=tuple(metrics), details=details)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--dtype", default="bf16", choices=("bf16", "fp16", "tf32"))
    parser.add_argument("--shape", default=None, metavar="MxNxK", help=f"default {'x'.join(map(str, DEFAULT_SHAPE))}")
    args = parser.parse_args()
    with distributed() as here:
        best = tuple(int(d) for d in args.shape.lower().split("x")) if args.shape else None
        result = run(Config.for_level("extended", here.device, args.seconds, args.dtype, best))  # type: ignore[arg-type]
        d = result.details
        for w in d["intervals"]:
            print(f"rank {here.rank} t={w['t_s']:6.1f}s {w['tflops']:7.1f} TFLOPS duty {w['duty']:.2f} "
                  f"{w.get('power_w', 0):6.0f} W SM {w.get('sm_clock_mhz', 0):5.0f} MHz {w.get('reasons', '')}")
        print(f"rank {here.rank}: {d['products']} products, no wrong element, {result.metrics[0].value:.4g} TFLOPS "
              f"sustained (min {d['tflops_min']:.4g}); power {d['power']}")


if __name__ == "__main__":
    main()
