"""Scaling efficiency: per-GPU training throughput of the whole job over that of each node alone.

First every node trains on its own, all nodes at once (DDP over a process group of the node's
ranks, made with ``dist.new_group``), then the whole job trains together, with the same model,
batch per GPU and steps (``workloads.training.gpt``). Efficiency = median per-GPU tokens/s of the whole
job / median per-GPU tokens/s of the nodes alone. Near 1 when the fabric between nodes keeps up
with the gradient all-reduce; the original cluster documentation reported 0.21.

Run alone: torchrun --nnodes=2 --nproc-per-node=8 ... -m workloads.training.scaling
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from workloads.common import distributed, gather_numbers, place
from workloads.result import Metric, Result
from workloads.training import gpt


@dataclass(frozen=True, kw_only=True, slots=True)
class Config:
    gpt: gpt.Config
    """The training run measured twice: per node, then the whole job."""

    @classmethod
    def for_level(cls, level: str, device: torch.device, peak_tflops: float | None = None,
                  **overrides: Any) -> Config:
        return cls(gpt=gpt.Config.for_level(level, device, None, peak_tflops, **overrides))


def node_members(node_rank: int) -> list[list[int]]:
    """The global ranks of each node, by node, from every rank's node rank (torchrun's GROUP_RANK)."""
    nodes: dict[int, list[int]] = {}
    for rank, (node,) in enumerate(gather_numbers([node_rank])):
        nodes.setdefault(int(node), []).append(rank)
    return [nodes[n] for n in sorted(nodes)]


def efficiency(together: list[float], alone: list[float]) -> float:
    """Median per-GPU throughput of the whole job over the median per-GPU throughput of nodes alone."""
    return statistics.median(together) / statistics.median(alone)


def run(cfg: Config) -> Result:
    here = place()
    members = node_members(here.node_rank)
    node_group, _ = dist.new_subgroups_by_enumeration(members)  # every rank creates every node's group
    alone = gpt.run(cfg.gpt, group=node_group)
    dist.destroy_process_group(node_group)  # free its communicator before the whole job trains
    together = gpt.run(cfg.gpt)
    name = "train_tokens_per_s_per_gpu"
    every = gather_numbers([alone.metric(name).value, together.metric(name).value])
    alone_tps, together_tps = [t[0] for t in every], [t[1] for t in every]
    value = efficiency(together_tps, alone_tps)
    per_node = [{"ranks": ranks, "alone_tokens_per_s_per_gpu": statistics.median(alone_tps[r] for r in ranks),
                 "together_tokens_per_s_per_gpu": statistics.median(together_tps[r] for r in ranks)}
                for ranks in members]
    details = {"nodes": len(members), "world_size": dist.get_world_size(), "per_node": per_node,
               "alone_per_rank": alone_tps, "together_per_rank": together_tps,
               "alone_step_s": alone.details["step_s"], "together_step_s": together.details["step_s"],
               "compile_used": together.details["compile_used"], "config": together.details["config"]}
    return Result(metrics=(Metric(
        "scaling_efficiency", value, "fraction", "world",
        f"{cfg.gpt.preset} DDP: median tokens/s per GPU of all {dist.get_world_size()} GPUs / of each of "
        f"{len(members)} nodes alone"),), details=details)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--level", default="standard", choices=("quick", "standard", "extended"))
    parser.add_argument("--batch-size", type=int, help="samples per step per GPU")
    parser.add_argument("--compile", choices=gpt.COMPILE_MODES)
    args = parser.parse_args()
    with distributed() as here:
        overrides = {k: v for k, v in (("batch_size", args.batch_size), ("compile", args.compile)) if v is not None}
        result = run(Config.for_level(args.level, here.device, **overrides))
        if here.rank == 0:
            m = result.metrics[0]
            print(f"{m.name} = {m.value:.3f} ({m.description})")
            for node in result.details["per_node"]:
                print(f"  node ranks {node['ranks'][0]}..{node['ranks'][-1]}: alone "
                      f"{node['alone_tokens_per_s_per_gpu']:.0f}, together {node['together_tokens_per_s_per_gpu']:.0f} "
                      "tokens/s per GPU")


if __name__ == "__main__":
    main()
