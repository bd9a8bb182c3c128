"""Is the job wired right? Device inventory per rank, and an all_reduce whose sum is exact.

Run alone: torchrun --nproc-per-node=2 -m workloads.interconnect.collective_check
"""

from __future__ import annotations

import argparse
from collections import Counter
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from workloads.common import check_level, distributed, place
from workloads.result import Result, WorkloadError


@dataclass(frozen=True, kw_only=True, slots=True)
class Config:
    sizes: tuple[int, ...] = (1, 1024, 1 << 20)
    """Element counts to reduce; the sum of rank-dependent integers is exact in int64."""
    device: str = "cpu"

    @classmethod
    def for_level(cls, level: str, device: torch.device) -> Config:
        check_level(level)
        sizes = (1, 1024, 1 << 20) if level == "quick" else (1, 1024, 1 << 20, 1 << 24)
        if device.type == "cpu":
            sizes = sizes[:3]
        return cls(sizes=sizes, device=str(device))


def inventory(device: torch.device) -> dict[str, Any]:
    """What this rank sees: its device, and how many CUDA devices its node has."""
    here = place()
    info: dict[str, Any] = {"local_rank": here.local_rank, "device": str(device),
                            "cuda_devices": torch.cuda.device_count() if torch.cuda.is_available() else 0}
    if device.type == "cuda":
        info["uuid"] = str(torch.cuda.get_device_properties(device).uuid)
    return info


def world_problems(everyone: list[dict[str, Any]], identities: list[dict[str, Any]],
                   gpus_per_node: int) -> list[str]:
    """Every way the job differs from the profile, one line each, naming node and rank."""
    problems: list[str] = []
    nodes: dict[int, list[int]] = {}
    for ident in identities:
        nodes.setdefault(ident["node_rank"], []).append(ident["rank"])
    for node, ranks in sorted(nodes.items()):
        host = identities[ranks[0]]["host"]
        if gpus_per_node > 0:
            devices = everyone[ranks[0]]["cuda_devices"]
            if devices != gpus_per_node:
                hint = " (no GPU: is the driver loaded? run nvidia-smi)" if devices == 0 else ""
                problems.append(f"node {node} ({host}): {devices} CUDA devices visible, profile expects "
                                f"{gpus_per_node}{hint}")
            if len(ranks) != gpus_per_node:
                problems.append(f"node {node} ({host}): {len(ranks)} ranks, profile expects {gpus_per_node} "
                                f"(start torchrun with --nproc-per-node={gpus_per_node})")
        uuids = Counter(everyone[r].get("uuid") for r in ranks if everyone[r].get("uuid"))
        for uuid, count in uuids.items():
            if count > 1:
                shared = [r for r in ranks if everyone[r].get("uuid") == uuid]
                problems.append(f"node {node} ({host}): ranks {shared} share one GPU ({uuid})")
        local = sorted(everyone[r]["local_rank"] for r in ranks)
        if local != list(range(len(ranks))):
            problems.append(f"node {node} ({host}): local ranks {local}, expected 0..{len(ranks) - 1}")
    return problems


def run(cfg: Config) -> Result:
    """all_reduce(SUM) of rank-dependent int64 data; every element checked against the closed form."""
    here = place()
    device = torch.device(cfg.device)
    n = here.world_size
    for size in cfg.sizes:
        idx = torch.arange(size, dtype=torch.int64, device=device)
        data = idx * (here.rank + 1) + here.rank
        dist.all_reduce(data)
        # sum over r of idx*(r+1) + r = idx * n(n+1)/2 + n(n-1)/2
        expected = idx * (n * (n + 1) // 2) + n * (n - 1) // 2
        wrong = (data != expected).nonzero()
        if wrong.numel():
            i = int(wrong[0])
            raise WorkloadError(f"all_reduce of {size} int64 on {n} ranks is wrong at {wrong.numel()} "
                                f"elements, first at {i}: got {int(data[i])}, expected {int(expected[i])} "
                                f"(rank {here.rank}, {device})")
    return Result(metrics=(), details={"checked_sizes": list(cfg.sizes), "world_size": n})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--level", default="standard", choices=("quick", "standard", "extended"))
    args = parser.parse_args()
    with distributed() as here:
        run(Config.for_level(args.level, here.device))
        if here.rank == 0:
            print(f"all_reduce exact on {here.world_size} ranks")


if __name__ == "__main__":
    main()
