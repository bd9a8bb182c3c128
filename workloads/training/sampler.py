"""Training data that needs no download, and the check that each rank gets its own share of it.

``SyntheticTokens`` is a map-style dataset of random token sequences: item ``i`` is the same
sequence on every rank and in every run (seeded by ``seed`` and ``i``), so which rank trains on
which sample is decided by the sampler alone. ``run`` feeds it through a DataLoader with
``torch.utils.data.DistributedSampler`` and checks, across ranks, that no sample is delivered
to two ranks and that together they cover the whole split.

Run alone: torchrun --nproc-per-node=2 -m workloads.training.sampler
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from workloads.common import check_level, distributed
from workloads.result import Result, WorkloadError


class SyntheticTokens(Dataset):
    """``num_samples`` random sequences of ``length`` tokens below ``vocab``; item i is seeded by (seed, i)."""

    def __init__(self, num_samples: int, length: int, vocab: int, seed: int = 0) -> None:
        self.num_samples, self.length, self.vocab, self.seed = num_samples, length, vocab, seed

    def __len__(self) -> int:
        return self.num_samples

    def __getitem__(self, index: int) -> dict[str, torch.Tensor | int]:
        if not 0 <= index < self.num_samples:
            raise IndexError(f"sample {index} outside 0..{self.num_samples - 1}")
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        return {"index": index, "tokens": torch.randint(self.vocab, (self.length,), generator=gen)}


def loader(dataset: Dataset, batch_size: int, group: dist.ProcessGroup | None = None, *,
           seed: int = 0, epoch: int = 0) -> DataLoader:
    """A DataLoader giving this rank its disjoint share of ``dataset`` (shuffled, last partial batch dropped)."""
    sampler = DistributedSampler(dataset, num_replicas=dist.get_world_size(group), rank=dist.get_rank(group),
                                 shuffle=True, seed=seed, drop_last=True)
    sampler.set_epoch(epoch)
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler, drop_last=True, num_workers=0)


def split_problems(index_sets: Sequence[Sequence[int]], dataset_size: int, batch_size: int = 1) -> list[str]:
    """Every way the ranks' index sets fail to be a disjoint, equal, complete split (empty when fine).

    ``index_sets[r]`` lists the sample indices rank r received. The sampler (drop_last) gives each
    rank ``dataset_size // world`` samples and the loader drops a last partial batch, so the ranks
    together must receive ``world`` times that many whole batches, all distinct.
    """
    world = len(index_sets)
    problems: list[str] = []
    owner: dict[int, int] = {}
    for rank, indices in enumerate(index_sets):
        repeats = len(indices) - len(set(indices))
        if repeats:
            problems.append(f"rank {rank} received {repeats} samples more than once")
        for i in indices:
            if not 0 <= i < dataset_size:
                problems.append(f"rank {rank} received index {i}, outside the dataset of {dataset_size}")
                break
    for rank, indices in enumerate(index_sets):
        for other, shared in _shared_with_earlier(owner, rank, indices).items():
            problems.append(f"ranks {other} and {rank} both received {len(shared)} samples "
                            f"(e.g. {sorted(shared)[:5]})")
    counts = {len(s) for s in index_sets}
    if len(counts) > 1:
        problems.append(f"ranks received different numbers of samples: {[len(s) for s in index_sets]}")
    per_rank = dataset_size // world // batch_size * batch_size
    if len(owner) != world * per_rank:
        problems.append(f"the ranks together received {len(owner)} distinct samples, expected "
                        f"{world * per_rank} ({world} ranks x {per_rank})")
    return problems


def _shared_with_earlier(owner: dict[int, int], rank: int, indices: Sequence[int]) -> dict[int, set[int]]:
    """Record ``rank`` as the owner of its indices; return the ones earlier ranks already own, by rank."""
    shared: dict[int, set[int]] = {}
    for i in indices:
        first = owner.setdefault(i, rank)
        if first != rank:
            shared.setdefault(first, set()).add(i)
    return shared


@dataclass(frozen=True, kw_only=True, slots=True)
class Config:
    num_samples: int = 1000
    """Dataset size; not a multiple of the world size on purpose in the default (drop_last is exercised)."""
    batch_size: int = 8
    """Samples per batch per rank."""
    length: int = 16
    """Tokens per sample."""
    epochs: int = 2
    """Each epoch is checked; the sampler reshuffles per epoch, so the split must hold for each."""
    seed: int = 0
    device: str = "cpu"
    """Where the index sets are gathered (a CUDA device under NCCL)."""

    def __post_init__(self) -> None:
        if self.num_samples < self.batch_size:
            raise ValueError(f"num_samples={self.num_samples} is below batch_size={self.batch_size}")

    @classmethod
    def for_level(cls, level: str, device: torch.device, world_size: int = 1) -> Config:
        check_level(level)
        per_rank = {"quick": 64, "standard": 256, "extended": 1024}[level]
        # +3: a remainder the sampler must drop rather than hand to two ranks.
        return cls(num_samples=per_rank * world_size + 3, device=str(device))


def gather_indices(indices: Sequence[int], device: torch.device,
                   group: dist.ProcessGroup | None = None) -> list[list[int]]:
    """Every rank's index list (all ranks must pass lists of one length, as drop_last guarantees)."""
    mine = torch.tensor(list(indices), dtype=torch.int64, device=device)
    lengths = [torch.zeros(1, dtype=torch.int64, device=device) for _ in range(dist.get_world_size(group))]
    dist.all_gather(lengths, torch.tensor([mine.numel()], dtype=torch.int64, device=device), group=group)
    longest = int(max(t.item() for t in lengths))
    padded = torch.full((longest,), -1, dtype=torch.int64, device=device)
    padded[: mine.numel()] = mine
    out = [torch.empty_like(padded) for _ in lengths]
    dist.all_gather(out, padded, group=group)
    return [t[: int(n.item())].tolist() for t, n in zip(out, lengths, strict=True)]


def run(cfg: Config, group: dist.ProcessGroup | None = None) -> Result:
    """Deliver each epoch through DistributedSampler; check the gathered index sets form a disjoint split."""
    device = torch.device(cfg.device)
    dataset = SyntheticTokens(cfg.num_samples, cfg.length, vocab=50_000, seed=cfg.seed)
    world = dist.get_world_size(group)
    problems: list[str] = []
    per_rank = 0
    for epoch in range(cfg.epochs):
        seen: list[int] = []
        for batch in loader(dataset, cfg.batch_size, group, seed=cfg.seed, epoch=epoch):
            seen += batch["index"].tolist()
            # The delivered tokens must be the dataset's item, not another rank's or a stale buffer.
            for row, i in zip(batch["tokens"], batch["index"].tolist(), strict=True):
                if not torch.equal(row, dataset[i]["tokens"]):
                    problems.append(f"epoch {epoch}: sample {i} arrived with other tokens than the dataset holds")
                    break
        everyone = gather_indices(seen, device, group)  # every rank calls this before anyone judges
        problems += [f"epoch {epoch}: {p}" for p in split_problems(everyone, cfg.num_samples, cfg.batch_size)]
        per_rank = len(seen)
    if problems:
        raise WorkloadError(
            f"DistributedSampler did not give {world} ranks disjoint shares of {cfg.num_samples} samples: "
            + "; ".join(problems[:10]) + ". Check that every rank passes its own rank and the same "
            "num_replicas to the sampler, and calls set_epoch with the same epoch")
    return Result(metrics=(), details={"world_size": world, "dataset_size": cfg.num_samples,
                                       "samples_per_rank_per_epoch": per_rank, "epochs": cfg.epochs,
                                       "batch_size": cfg.batch_size})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--level", default="standard", choices=("quick", "standard", "extended"))
    args = parser.parse_args()
    with distributed() as here:
        result = run(Config.for_level(args.level, here.device, here.world_size))
        if here.rank == 0:
            print(f"disjoint split on {here.world_size} ranks: {result.details}")


if __name__ == "__main__":
    main()
