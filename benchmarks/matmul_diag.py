"""Why one matmul figure differs from another on the same GPU: the level's whole sweep timed several ways.

    torchrun --nproc-per-node=gpu benchmarks/matmul_diag.py --dtype bf16 --out matmul_diag.json

Each variant is the suite's own workload (workloads.gpu.matmul.run: the same sweep, settle, second pass and
float64 checks) with one setting changed, in this order on every GPU at once (the first repeats at the end,
so drift shows):
- ``mamf``: as the suite measures, the way mamf-finder times a shape (its 50 warm-up calls and 100 timed
  ones queued straight after its operands are made, a cache flush and a fresh C before each call);
- ``settled``: the same with 1000 warm-up calls per shape (0.3 to 3 s of them): each shape timed once the
  clocks have settled at the power cap again after the pause its operands' making left;
- ``mamf`` again;
then the sustained run (workloads.gpu.burn_in: the best shape back to back, 4 outputs) for --sustain-s.
Each with the median SM clock, power draw and the clock event reasons seen (NVML). A figure that moves with
what runs before the timed calls, at another clock, is the power controller at work, not a slow part.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from workloads.common import distributed, gather_objects  # noqa: E402
from workloads.gpu import burn_in, matmul  # noqa: E402

VARIANTS: dict[str, dict[str, Any]] = {"mamf": {}, "settled": {"warmup_calls": 1000}}
CPU_SETTLE_CALLS = 10
"""The settled variant's warm-up calls on CPU, where no clock settles at a power cap: enough to run its path (the
CPU mode is a dry run), as the sustained run on CPU is held for a second at most."""
ORDER = ("mamf", "settled", "mamf")


def clock_row(clocks: dict[str, Any]) -> dict[str, Any]:
    return {"sm_clock_mhz": clocks.get("sm_clock_mhz", {}).get("median"),
            "power_w": clocks.get("power_w", {}).get("median"),
            "reasons": clocks.get("clock_event_reasons", clocks.get("status"))}


def sweep(base: matmul.Config, name: str) -> dict[str, Any]:
    change = VARIANTS[name]
    if base.device == "cpu" and "warmup_calls" in change:
        change = {**change, "warmup_calls": min(change["warmup_calls"], CPU_SETTLE_CALLS)}
    d = matmul.run(dataclasses.replace(base, **change)).details
    return {"variant": name, "tflops": d["best_tflops"], "shape": "x".join(map(str, d["best_shape"])),
            "shapes": {"x".join(map(str, s["shape"])): round(s["tflops"], 1) for s in d["shapes"]},
            "wallclock_ratio": d["wallclock"]["ratio"], "settle": d["settle"], **clock_row(d["clocks"])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dtype", default="bf16", choices=("bf16", "fp16"))
    parser.add_argument("--level", default="standard", choices=("quick", "standard", "extended"))
    parser.add_argument("--variants", default=",".join(ORDER), help=f"comma-separated, of {', '.join(VARIANTS)}")
    parser.add_argument("--sustain-s", type=float, default=10.0, help="seconds of the sustained run (0: none)")
    parser.add_argument("--out", default="matmul_diag.json")
    args = parser.parse_args()
    names = [v for v in args.variants.split(",") if v]
    unknown = sorted(set(names) - set(VARIANTS))
    if unknown:
        parser.error(f"unknown variant(s) {', '.join(unknown)}; choose from {', '.join(VARIANTS)}")
    with distributed() as here:
        device = here.device
        base = matmul.Config.for_level(args.level, device, args.dtype)
        rows = [sweep(base, name) for name in names]
        if args.sustain_s > 0:
            best = max(rows, key=lambda r: r["tflops"])
            shape = tuple(int(x) for x in best["shape"].split("x"))
            seconds = args.sustain_s if device.type == "cuda" else min(args.sustain_s, 1.0)
            cfg = burn_in.Config(duration_s=seconds, dtype=args.dtype, shape=shape,  # type: ignore[arg-type]
                                 shape_source=f"best of {best['variant']}", device=str(device))
            d = burn_in.run(cfg).details
            rows.append({"variant": "sustained", "tflops": statistics.median(w["tflops"] for w in d["intervals"]),
                         "shape": best["shape"], "shapes": {}, **clock_row(d["clocks"])})
        everyone = gather_objects({"rank": here.rank, "device": matmul.hw.device_name(device), "rows": rows})
        if here.rank == 0:
            Path(args.out).write_text(json.dumps({"dtype": args.dtype, "level": args.level, "ranks": everyone},
                                                 indent=1))
            print(f"{args.dtype} matmul at {args.level}, each way on every GPU at once "
                  "(best median TFLOPS @ shape | SM MHz | W | top shapes)")
            for r in everyone:
                for row in r["rows"]:
                    top = sorted(row["shapes"].items(), key=lambda kv: -kv[1])[:3]
                    print(f"rank {r['rank']} {row['variant']:>14}: {row['tflops']:7.1f} @ {row['shape']:>16} "
                          f"| {row['sm_clock_mhz'] or 0:5.0f} MHz | {row['power_w'] or 0:4.0f} W | "
                          f"{' '.join(f'{s}={v}' for s, v in top)} | {row['reasons']}")
            print(f"written: {args.out}")


if __name__ == "__main__":
    main()
