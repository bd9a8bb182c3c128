"""Host link bandwidth: pinned host memory to the GPU (h2d) and back (d2h), each GPU alone and all at once.

bandwidth = S / t at the median time (bytes crossing the link once), with page-locked host buffers
(the fastest path; pageable memory measures the CPU's staging copy instead). Two figures:
- ``alone`` (judged per GPU): one GPU of each node at a time, the others waiting on the host, as
  nvbandwidth's copy-engine tests run: what this GPU's link does. A downtrained link or a GPU on the
  wrong NUMA node shows here, apart from what it shares.
- ``together`` (per node, a warning): every GPU of the node at once, as training's data loaders run;
  the node's figure is its slowest GPU (the node's sum in details). GPUs behind one PCIe switch or
  one CPU socket share it, and a virtualised host shows its limits here (28-33 GB/s h2d, 16-20 d2h a
  GPU on an 8-GPU VM, where each GPU alone reaches ~55).
Each copy is checked exactly. On CPU there is no link: a memcpy between two host buffers stands in
for it (the flow runs for real; the figure is host memory bandwidth, not a bus).

Run alone: torchrun --nproc-per-node=8 -m workloads.gpu.hostlink --direction both --mode both
"""

from __future__ import annotations

import argparse
import os
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from workloads.clocks import ClockSampler
from workloads.common import check_level, distributed, gather_objects, place, synchronize
from workloads.gpu import _hw as hw
from workloads.result import Metric, Result, WorkloadError

GiB, MiB = 1 << 30, 1 << 20
DIRECTIONS = {"h2d": "host to device", "d2h": "device to host"}
MODES = {"alone": "each GPU alone (one per node at a time, the others waiting)",
         "together": "every GPU of the node at once, the node's slowest GPU"}
GPU_SIZES = {"quick": (256 * MiB,), "standard": (1 * GiB,), "extended": (64 * MiB, 256 * MiB, 1 * GiB)}
CPU_SIZES = {"quick": (32 * MiB,), "standard": (64 * MiB,), "extended": (64 * MiB, 128 * MiB)}


@dataclass(frozen=True, kw_only=True, slots=True)
class Config:
    direction: str = "h2d"
    """h2d (pinned host -> device) or d2h (device -> pinned host)."""
    mode: str = "alone"
    """alone (one GPU of each node at a time: judged per GPU) or together (every GPU at once: per node)."""
    sizes: tuple[int, ...] = CPU_SIZES["standard"]
    """Bytes per transfer; multiples of 4."""
    seconds_per_size: float = 0.3
    warmup: int = 2
    device: str = "cpu"
    seed: int = 777

    def __post_init__(self) -> None:
        if self.direction not in DIRECTIONS:
            raise ValueError(f"direction {self.direction!r} is not one of {', '.join(DIRECTIONS)}")
        if self.mode not in MODES:
            raise ValueError(f"mode {self.mode!r} is not one of {', '.join(MODES)}")
        if not self.sizes or any(s <= 0 or s % 4 for s in self.sizes):
            raise ValueError(f"sizes must be positive multiples of 4 bytes, got {self.sizes}")

    @classmethod
    def for_level(cls, level: str, device: torch.device, direction: str, mode: str = "alone") -> Config:
        check_level(level)
        if device.type == "cpu":
            return cls(direction=direction, mode=mode, sizes=CPU_SIZES[level], device=str(device),
                       seconds_per_size=0.2)
        return cls(direction=direction, mode=mode, sizes=GPU_SIZES[level], device=str(device),
                   seconds_per_size={"quick": 0.2, "standard": 0.3, "extended": 1.0}[level])


def metric_name(direction: str, mode: str) -> str:
    return f"{direction}_bandwidth_gbps" if mode == "alone" else f"{direction}_bandwidth_all_gpus_gbps"


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


@dataclass
class Copies:
    """One size's buffers on this rank: the source, the destination, and what the destination must hold."""
    size: int
    src: torch.Tensor
    dst: torch.Tensor
    want: torch.Tensor
    pinned: bool

    def copy(self) -> None:
        self.dst.copy_(self.src, non_blocking=self.pinned)


def prepare(size: int, cfg: Config, device: torch.device, gen: torch.Generator) -> Copies:
    """The buffers of one size, filled with random data (pinned host memory on a GPU)."""
    pinned = device.type == "cuda"
    dev_src = torch.randn(size // 4, device=device, generator=gen)
    host_src = torch.empty(dev_src.shape, pin_memory=pinned)
    host_src.copy_(dev_src)  # random data on the host side too, filled fast from the device
    if cfg.direction == "h2d":
        return Copies(size, host_src, torch.empty_like(dev_src), dev_src, pinned)
    return Copies(size, dev_src, torch.empty(dev_src.shape, pin_memory=pinned), host_src, pinned)


def time_copies(copies: Copies, cfg: Config, device: torch.device) -> list[float]:
    """Seconds of each timed copy; the last one has landed when this returns."""
    times = hw.timed(copies.copy, device, cfg.warmup, cfg.seconds_per_size, most=200)
    synchronize(device)
    return times


def figures(copies: Copies, times: list[float], cfg: Config, device: torch.device) -> dict[str, Any]:
    """The size's figures, once its last copy is checked exactly."""
    if not torch.equal(copies.dst, copies.want):
        bad = int((copies.dst != copies.want).sum())
        raise WorkloadError(f"{DIRECTIONS[cfg.direction]} copy of {copies.size / MiB:.0f} MiB on {device}: {bad} of "
                            f"{copies.want.numel()} float32 elements arrived wrong; the link or host memory corrupts "
                            "data: check dmesg for PCIe AER errors and the host's memory (ECC/EDAC counters)")
    return {"bytes": copies.size, "gbps": gbps(copies.size, statistics.median(times)),
            "gbps_min": gbps(copies.size, max(times)), "gbps_max": gbps(copies.size, min(times)),
            "copies": len(times), "pinned": copies.pinned}


def measure_size(size: int, cfg: Config, device: torch.device, gen: torch.Generator) -> dict[str, Any]:
    copies = prepare(size, cfg, device, gen)
    return figures(copies, time_copies(copies, cfg, device), cfg, device)


def size_alone(size: int, cfg: Config, device: torch.device, gen: torch.Generator, make: bool
               ) -> tuple[dict[str, Any] | None, dict[str, Any], Exception | None]:
    """One size: its buffers made (where ``make``), its copies timed in this rank's turn, checked after the last
    turn. (figures, clocks during the turn, this rank's error): the error is returned, not raised, so the caller
    walks every size's turns. The buffers are gone when this returns."""
    copies: Copies | None = None
    error: Exception | None = None
    if make:
        try:
            copies = prepare(size, cfg, device, gen)
        except Exception as exc:  # returned after the turns
            error = exc

    def turn() -> tuple[list[float], dict[str, Any]] | None:
        if copies is None:
            return None
        with ClockSampler(device) as sampler:
            times = time_copies(copies, cfg, device)
        return times, sampler.summary()

    try:
        timed = hw.in_turns(turn)  # this rank's own error from its turn is raised after the last turn
        if copies is not None and timed is not None:
            return figures(copies, timed[0], cfg, device), timed[1], None
    except Exception as exc:
        error = exc
    return None, {}, error


def alone(cfg: Config, device: torch.device) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Each size on one GPU of each node at a time. Only the timed copies take turns: every rank makes its
    buffers before the turns and checks and frees them after, all at once (on 2 H200s a turn was 0.65 s, of
    which 0.23 s copying; pinning, checking and unpinning the rest). Every rank walks every size's turns and
    raises its first error after the last of them, so a failing rank never leaves its peers waiting."""
    gen = torch.Generator(device=device).manual_seed(cfg.seed + place().rank)
    sizes: list[dict[str, Any]] = []
    clocks: dict[str, Any] = {}
    error: Exception | None = None
    for size in cfg.sizes:
        try:
            figure, sampled, failed = size_alone(size, cfg, device, gen, make=error is None)
        finally:
            hw.release(device)  # this size's buffers are gone: one size's at a time, as before the turns were split
        error = error or failed
        if figure is not None:
            sizes.append(figure)
            if figure["gbps"] >= max(s["gbps"] for s in sizes):
                clocks = sampled  # the clocks of the size that counts
    if error is not None:
        raise error
    return sizes, clocks


def run(cfg: Config) -> Result:
    """Host-link bandwidth of this rank's GPU in one direction, alone or with the node's other GPUs; the
    best size counts. Every rank of the job must call it (turns, or the node's figures exchanged)."""
    device = torch.device(cfg.device)

    def sweep() -> tuple[list[dict[str, Any]], dict[str, Any]]:
        return hw.measure_each(cfg.sizes, lambda s, gen: measure_size(s, cfg, device, gen), device, cfg.seed)

    if cfg.mode == "alone":
        sizes, clocks = alone(cfg, device)
        node: dict[str, Any] = {}
    else:
        hw.start_together()
        sizes, clocks, node = together(sweep)
    best = max(sizes, key=lambda s: s["gbps"])
    value = node.get("slowest_gbps", best["gbps"])
    if device.type == "cuda":
        desc = f"{DIRECTIONS[cfg.direction]}, pinned host memory, S/t at the median time, {MODES[cfg.mode]}"
    else:
        desc = (f"{DIRECTIONS[cfg.direction]} stand-in on CPU: memcpy between two host buffers (no bus to measure), "
                f"{MODES[cfg.mode]}")
    affinity = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    details = {"direction": cfg.direction, "mode": cfg.mode, "device": hw.device_name(device), "sizes": sizes,
               "best_bytes": best["bytes"], "gbps_this_gpu": best["gbps"], **node,
               "gpu_numa_node": numa_node(device),
               "cpu_affinity": f"{len(affinity)} CPUs" + (f" ({affinity[0]}..{affinity[-1]})" if affinity else ""),
               "clocks": clocks}
    scope = "gpu" if cfg.mode == "alone" else "node"
    return Result(metrics=(Metric(metric_name(cfg.direction, cfg.mode), value, "GB/s", scope, desc),),
                  details=details)


def together(sweep: Callable[[], tuple[list[dict[str, Any]], dict[str, Any]]]
             ) -> tuple[list[dict[str, Any]], dict[str, Any], dict[str, Any]]:
    """``sweep()`` on every rank at once, then the node's figures: its slowest GPU and its sum.
    A rank whose sweep failed still joins the exchange, then raises."""
    sizes: list[dict[str, Any]] = []
    clocks: dict[str, Any] = {}
    error: Exception | None = None
    try:
        sizes, clocks = sweep()
    except Exception as exc:  # raised below, after the exchange
        error = exc
    node_rank = place().node_rank
    mine = {"node": node_rank, "gbps": max((s["gbps"] for s in sizes), default=None),
            "error": f"{type(error).__name__}: {error}" if error else None}
    everyone: list[Any] = [mine]
    group = hw.host_group()
    if group is not None:
        everyone = gather_objects(mine, group=group)
    if error is not None:
        raise error
    peers = {rank: e for rank, e in enumerate(everyone) if e["node"] == node_rank}
    failed = [f"rank {rank}: {e['error']}" for rank, e in peers.items() if e["error"]]
    if failed:
        raise WorkloadError(f"host link of the node's other GPUs could not be measured: {'; '.join(failed)}")
    slowest = min(peers, key=lambda rank: peers[rank]["gbps"])
    return sizes, clocks, {"slowest_gbps": peers[slowest]["gbps"], "slowest_rank": slowest,
                           "gpus_on_node": len(peers), "node_sum_gbps": sum(e["gbps"] for e in peers.values())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--level", default="standard", choices=("quick", "standard", "extended"))
    parser.add_argument("--direction", default="both", choices=("h2d", "d2h", "both"))
    parser.add_argument("--mode", default="both", choices=("alone", "together", "both"))
    args = parser.parse_args()
    with distributed() as here:
        for mode in MODES if args.mode == "both" else (args.mode,):
            for direction in DIRECTIONS if args.direction == "both" else (args.direction,):
                result = run(Config.for_level(args.level, here.device, direction, mode))
                m = result.metrics[0]
                for s in result.details["sizes"]:
                    print(f"rank {here.rank}: {direction} {mode:8} {s['bytes'] / MiB:6.0f} MiB {s['gbps']:7.2f} GB/s "
                          f"(min {s['gbps_min']:.2f}, max {s['gbps_max']:.2f})")
                print(f"rank {here.rank}: {m.name} = {m.value:.2f} {m.unit} ({m.scope}) "
                      f"{ {k: v for k, v in result.details.items() if k.startswith(('node_', 'slowest'))} }")


if __name__ == "__main__":
    main()
