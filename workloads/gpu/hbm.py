"""Device memory bandwidth: a large device-to-device copy, bytes read + bytes written counted.

copy bandwidth = 2 * S / t (S bytes read and S written) at the median time, for buffers of several
GB on a GPU (past any cache), every GPU at once. The copy is checked exactly (every element) before
its figure counts. A read-only (sum) and a write-only (fill) pass are kept in details.
On CPU the same copy measures host memory (small buffers, still past the L3).

Run alone: torchrun --nproc-per-node=8 -m workloads.gpu.hbm
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from workloads.common import check_level, distributed
from workloads.gpu import _hw as hw
from workloads.result import Metric, Result, WorkloadError

GiB, MiB = 1 << 30, 1 << 20
GPU_SIZES = {"quick": (1 * GiB,), "standard": (1 * GiB, 4 * GiB), "extended": (1 * GiB, 4 * GiB, 8 * GiB)}
CPU_SIZES = {"quick": (64 * MiB,), "standard": (64 * MiB, 128 * MiB), "extended": (64 * MiB, 256 * MiB)}


@dataclass(frozen=True, kw_only=True, slots=True)
class Config:
    sizes: tuple[int, ...] = CPU_SIZES["standard"]
    """Bytes per buffer (source and destination each); multiples of 4 (float32 elements)."""
    seconds_per_size: float = 0.3
    """Timed seconds per size and pass: sets the number of timed copies."""
    warmup: int = 3
    device: str = "cpu"
    seed: int = 4321

    def __post_init__(self) -> None:
        if not self.sizes or any(s <= 0 or s % 4 for s in self.sizes):
            raise ValueError(f"sizes must be positive multiples of 4 bytes, got {self.sizes}")

    @classmethod
    def for_level(cls, level: str, device: torch.device) -> Config:
        check_level(level)
        if device.type == "cpu":
            return cls(sizes=CPU_SIZES[level], device=str(device), seconds_per_size=0.2)
        # Two buffers per size plus headroom for the other tests' cached memory.
        cap = (hw.free_bytes(device) or 0) // 3 // 4 * 4
        sizes = tuple(sorted({min(s, cap) for s in GPU_SIZES[level]}))
        return cls(sizes=sizes, device=str(device), seconds_per_size={"quick": 0.2, "standard": 0.3,
                                                                       "extended": 1.0}[level])


def copy_tbps(size_bytes: int, seconds: float) -> float:
    """Copy bandwidth counting bytes read + bytes written."""
    return 2 * size_bytes / seconds / 1e12


def _timed(fn: Callable[[], object], device: torch.device, cfg: Config) -> list[float]:
    return hw.timed(fn, device, cfg.warmup, cfg.seconds_per_size, most=500)


def check_copy(dst: torch.Tensor, src: torch.Tensor, what: str) -> None:
    """Every element of the copy equals its source (exact: a copy must not change a bit)."""
    if torch.equal(dst, src):
        return
    wrong = (dst != src).nonzero()
    i = int(wrong[0])
    raise WorkloadError(f"{what}: {wrong.numel()} of {src.numel()} float32 elements differ after the copy, first "
                        f"at {i}: got {float(dst[i])!r}, expected {float(src[i])!r}; memory is corrupting data: "
                        "drain the GPU, check ECC counters (nvidia-smi -q -d ECC), run dcgmi diag -r 3")


def measure_size(size: int, cfg: Config, device: torch.device, gen: torch.Generator) -> dict[str, Any]:
    src = torch.randn(size // 4, device=device, generator=gen)
    dst = torch.empty_like(src)
    copy_times = _timed(lambda: dst.copy_(src), device, cfg)
    check_copy(dst, src, f"copy of {size / GiB:.3g} GiB on {device} ({hw.device_name(device)})")
    read_times = _timed(lambda: src.sum(), device, cfg)
    write_times = _timed(lambda: dst.fill_(1.5), device, cfg)  # a non-zero constant: zero fills may take fast paths
    med = statistics.median
    return {"bytes": size, "copy_tbps": copy_tbps(size, med(copy_times)),
            "copy_tbps_min": copy_tbps(size, max(copy_times)), "copy_tbps_max": copy_tbps(size, min(copy_times)),
            "copies": len(copy_times), "read_tbps": size / med(read_times) / 1e12,
            "write_tbps": size / med(write_times) / 1e12}


def run(cfg: Config) -> Result:
    """Copy bandwidth on this rank's device, every rank at once; the best size is the metric."""
    device = torch.device(cfg.device)
    sizes, clocks = hw.each_at_once(cfg.sizes, lambda s, gen: measure_size(s, cfg, device, gen), device, cfg.seed)
    best = max(sizes, key=lambda s: s["copy_tbps"])
    desc = ("device-to-device copy, bytes read + bytes written counted (2*S/t), median time, best of "
            f"{len(sizes)} sizes up to {max(cfg.sizes) / GiB:.3g} GiB, every device at once"
            + (" (host memory on CPU)" if device.type == "cpu" else ""))
    return Result(metrics=(Metric("hbm_bandwidth_tbps", best["copy_tbps"], "TB/s", "gpu", desc),),
                  details={"device": hw.device_name(device), "sizes": sizes, "best_bytes": best["bytes"],
                           "clocks": clocks})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--level", default="standard", choices=("quick", "standard", "extended"))
    parser.add_argument("--gib", type=float, nargs="*", default=None, help="buffer sizes in GiB (overrides --level)")
    args = parser.parse_args()
    with distributed() as here:
        cfg = Config.for_level(args.level, here.device)
        if args.gib:
            cfg = Config(sizes=tuple(int(g * GiB) // 4 * 4 for g in args.gib), device=cfg.device,
                         seconds_per_size=cfg.seconds_per_size)
        result = run(cfg)
        for s in result.details["sizes"]:
            print(f"rank {here.rank}: {s['bytes'] / GiB:.3g} GiB copy {s['copy_tbps']:.3f} TB/s (read+write), "
                  f"read {s['read_tbps']:.3f}, write {s['write_tbps']:.3f}")


if __name__ == "__main__":
    main()
