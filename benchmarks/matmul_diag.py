"""Why one matmul figure differs from another on the same GPU: the same shapes timed four ways.

    torchrun --nproc-per-node=gpu benchmarks/matmul_diag.py --dtype bf16 --out matmul_diag.json

Variants, in this order on every GPU at once (the order repeats the first at the end, so drift shows):
- ``mamf``: the suite's judged method (workloads.gpu.matmul: each call timed alone, a 256 MiB L2 flush
  and a fresh C before each, median of 100 calls);
- ``no_flush``: the same per-call timing with nothing between calls (back to back, one event pair each);
- ``batched``: the suite's old method: ~20 ms runs of back-to-back products over operand sets that
  rotate past the L2, median of the runs;
- ``mamf`` again.
Each with the median SM clock, power draw and the clock event reasons seen (NVML). A figure that rises
with the gaps between calls at a lower power draw is the power cap at work, not a slow part.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from workloads.clocks import ClockSampler  # noqa: E402
from workloads.common import distributed, time_runs  # noqa: E402
from workloads.gpu import _hw as hw  # noqa: E402
from workloads.gpu import matmul  # noqa: E402

SHAPES = ((4096, 4096, 8192), (8192, 8192, 8192))


def batched(bench: matmul.Bench, rotate_bytes: int) -> float:
    """The old method: operand sets rotating past ``rotate_bytes``, ~20 ms runs back to back; TFLOPS of the median."""
    m, n, k = bench.shape
    size = (m * k + n * k + m * n) * bench.set[0].element_size()
    sets = [bench.set] + [matmul.operands(bench.shape, bench.cfg.dtype, bench.device, torch.Generator(
        device=bench.device).manual_seed(i)) for i in range(1, max(1, math.ceil(rotate_bytes / size)))]

    def one_pass() -> None:
        for s in sets:
            bench.product(s)
    t_pass = min(time_runs(one_pass, bench.device, warmup=1, repeats=2))
    inner = max(1, round(0.02 / t_pass))

    def run() -> None:
        for _ in range(inner):
            one_pass()
    times = time_runs(run, bench.device, warmup=3, repeats=max(5, round(1.0 / (inner * t_pass))))
    return matmul.tflops(bench.shape, statistics.median(times), inner * len(sets))


def variant(name: str, bench: matmul.Bench) -> dict[str, Any]:
    with ClockSampler(bench.device) as clocks:
        if name == "mamf":
            figure = matmul.measure_shape(bench)["tflops"]
        elif name == "no_flush":
            figure = matmul.tflops(bench.shape, statistics.median(hw.time_calls(bench.call, bench.device, 100)))
        else:
            figure = batched(bench, 3 * hw.l2_cache_bytes(bench.device))
    c = clocks.summary()
    return {"variant": name, "shape": "x".join(map(str, bench.shape)), "tflops": figure,
            "sm_clock_mhz": c.get("sm_clock_mhz", {}).get("median"), "power_w": c.get("power_w", {}).get("median"),
            "reasons": c.get("clock_event_reasons", c.get("status"))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dtype", default="bf16", choices=("bf16", "fp16"))
    parser.add_argument("--out", default="matmul_diag.json")
    args = parser.parse_args()
    with distributed() as here:
        device = here.device
        cfg = matmul.Config.for_level("standard", device, args.dtype)
        shapes = SHAPES if device.type == "cuda" else ((256, 256, 256),)
        flush = torch.empty(cfg.flush_bytes // 4, dtype=torch.int32, device=device)
        rows = []
        hw.start_together()
        with matmul.precision(args.dtype):
            for shape in shapes:
                bench = matmul.Bench(shape, cfg, device, torch.Generator(device=device).manual_seed(here.rank), flush)
                settle = hw.settle(bench.burst_tflops, 2 * cfg.warm_s, least_s=cfg.warm_s)
                for name in ("mamf", "no_flush", "batched", "mamf"):
                    rows.append({**variant(name, bench), "settle_s": settle["seconds"]})
                del bench
                hw.release(device)
        everyone: list[Any] = [None] * here.world_size
        dist.all_gather_object(everyone, {"rank": here.rank, "device": hw.device_name(device), "rows": rows})
        if here.rank == 0:
            Path(args.out).write_text(json.dumps({"dtype": args.dtype, "ranks": everyone}, indent=1))
            print(f"{args.dtype} matmul, four ways on every GPU at once (TFLOPS | SM MHz | W)")
            for r in everyone:
                for row in r["rows"]:
                    print(f"rank {r['rank']} {row['shape']:>16} {row['variant']:>9}: {row['tflops']:7.1f} TFLOPS "
                          f"| {row['sm_clock_mhz'] or 0:5.0f} MHz | {row['power_w'] or 0:4.0f} W | {row['reasons']}")
            print(f"written: {args.out}")


if __name__ == "__main__":
    main()
