"""Host link bandwidth: pinned host memory to the GPU (h2d) and back (d2h), every GPU at once.

bandwidth = S / t at the median time (bytes crossing the link once), with page-locked host buffers
(the fastest path; pageable memory measures the CPU's staging copy instead). All ranks start
together, so GPUs behind one PCIe switch or one CPU socket share it as they do in training: a slow
switch, a downtrained link or a rank on the wrong NUMA node shows up here. Each copy is checked
exactly. On CPU there is no link: a memcpy between two host buffers stands in for it (the flow
runs for real; the figure is host memory bandwidth, not a bus).

Run alone: torchrun --nproc-per-node=8 -m workloads.gpu.hostlink --direction h2d
"""

from __future__ import annotations

import argparse
import os
import statistics
from dataclasses import dataclass
from typing import Any

import torch

from workloads.common import check_level, distributed, synchronize
from workloads.gpu import _hw as hw
from workloads.result import Metric, Result, WorkloadError

GiB, MiB = 1 << 30, 1 << 20
DIRECTIONS = {"h2d": "host to device", "d2h": "device to host"}
GPU_SIZES = {"quick": (256 * MiB,), "standard": (256 * MiB, 1 * GiB), "extended": (64 * MiB, 256 * MiB, 1 * GiB)}
CPU_SIZES = {"quick": (32 * MiB,), "standard": (64 * MiB,), "extended": (64 * MiB, 128 * MiB)}


@dataclass(frozen=True, kw_only=True, slots=True)
class Config:
    direction: str = "h2d"
    """h2d (pinned host -> device) or d2h (device -> pinned host)."""
    sizes: tuple[int, ...] = CPU_SIZES["standard"]
    """Bytes per transfer; multiples of 4."""
    seconds_per_size: float = 0.3
    warmup: int = 2
    device: str = "cpu"
    seed: int = 777

    def __post_init__(self) -> None:
        if self.direction not in DIRECTIONS:
            raise ValueError(f"direction {self.direction!r} is not one of {', '.join(DIRECTIONS)}")
        if not self.sizes or any(s <= 0 or s % 4 for s in self.sizes):
            raise ValueError(f"sizes must be positive multiples of 4 bytes, got {self.sizes}")

    @classmethod
    def for_level(cls, level: str, device: torch.device, direction: str) -> Config:
        check_level(level)
        if device.type == "cpu":
            return cls(direction=direction, sizes=CPU_SIZES[level], device=str(device), seconds_per_size=0.2)
        return cls(direction=direction, sizes=GPU_SIZES[level], device=str(device),
                   seconds_per_size={"quick": 0.2, "standard": 0.4, "extended": 1.0}[level])


def gbps(size_bytes: int, seconds: float) -> float:
    return size_bytes / seconds / 1e9


def numa_node(device: torch.device) -> int | None:
    """The NUMA node the GPU's PCIe slot belongs to (sysfs), or None where unknown."""
    if device.type != "cuda":
        return None
    props = torch.cuda.get_device_properties(device)
    bus = getattr(props, "pci_bus_id", None)
    if bus is None:
        return None
    path = f"/sys/bus/pci/devices/{getattr(props, 'pci_domain_id', 0):04x}:{bus:02x}:" \
           f"{getattr(props, 'pci_device_id', 0):02x}.0/numa_node"
    try:
        with open(path) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def measure_size(size: int, cfg: Config, device: torch.device, gen: torch.Generator) -> dict[str, Any]:
    pinned = device.type == "cuda"
    dev_src = torch.randn(size // 4, device=device, generator=gen)
    host_src = torch.empty(dev_src.shape, pin_memory=pinned)
    host_src.copy_(dev_src)  # random data on the host side too, filled fast from the device
    if cfg.direction == "h2d":
        src, dst, want = host_src, torch.empty_like(dev_src), dev_src
    else:
        src, dst, want = dev_src, torch.empty(dev_src.shape, pin_memory=pinned), host_src

    def copy() -> None:
        dst.copy_(src, non_blocking=pinned)
    times = hw.timed(copy, device, cfg.warmup, cfg.seconds_per_size, most=200)
    synchronize(device)  # the last non-blocking copy has landed before the check
    if not torch.equal(dst, want):
        bad = int((dst != want).sum())
        raise WorkloadError(f"{DIRECTIONS[cfg.direction]} copy of {size / MiB:.0f} MiB on {device}: {bad} of "
                            f"{want.numel()} float32 elements arrived wrong; the link or host memory corrupts "
                            "data: check dmesg for PCIe AER errors and the host's memory (ECC/EDAC counters)")
    return {"bytes": size, "gbps": gbps(size, statistics.median(times)), "gbps_min": gbps(size, max(times)),
            "gbps_max": gbps(size, min(times)), "copies": len(times), "pinned": pinned}


def run(cfg: Config) -> Result:
    """Host-link bandwidth of this rank's GPU in one direction, every rank at once; best size counts."""
    device = torch.device(cfg.device)
    sizes, clocks = hw.each_at_once(cfg.sizes, lambda s, gen: measure_size(s, cfg, device, gen), device, cfg.seed)
    best = max(sizes, key=lambda s: s["gbps"])
    if device.type == "cuda":
        desc = f"{DIRECTIONS[cfg.direction]}, pinned host memory, S/t at the median time, every GPU at once"
    else:
        desc = f"{DIRECTIONS[cfg.direction]} stand-in on CPU: memcpy between two host buffers (no bus to measure)"
    affinity = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    details = {"direction": cfg.direction, "device": hw.device_name(device), "sizes": sizes,
               "best_bytes": best["bytes"], "gpu_numa_node": numa_node(device),
               "cpu_affinity": f"{len(affinity)} CPUs" + (f" ({affinity[0]}..{affinity[-1]})" if affinity else ""),
               "clocks": clocks}
    return Result(metrics=(Metric(f"{cfg.direction}_bandwidth_gbps", best["gbps"], "GB/s", "gpu", desc),),
                  details=details)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--level", default="standard", choices=("quick", "standard", "extended"))
    parser.add_argument("--direction", default="both", choices=("h2d", "d2h", "both"))
    args = parser.parse_args()
    with distributed() as here:
        for direction in ("h2d", "d2h") if args.direction == "both" else (args.direction,):
            result = run(Config.for_level(args.level, here.device, direction))
            for s in result.details["sizes"]:
                print(f"rank {here.rank}: {direction} {s['bytes'] / MiB:.0f} MiB {s['gbps']:.2f} GB/s")


if __name__ == "__main__":
    main()
