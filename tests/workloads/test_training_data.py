"""The sampler's disjointness check and the checkpoint comparison, as pure logic, plus one-rank runs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.utils.data import DistributedSampler

from workloads.result import WorkloadError
from workloads.training import checkpoint, sampler
from workloads.training.sampler import SyntheticTokens, split_problems


def shares(n: int, world: int, rank_of: list[int] | None = None, epoch: int = 0) -> list[list[int]]:
    """What each of ``world`` ranks gets from DistributedSampler; ``rank_of[r]`` fakes the rank r passes."""
    dataset = SyntheticTokens(n, 4, 100)
    out = []
    for r in range(world):
        s = DistributedSampler(dataset, num_replicas=world, rank=(rank_of or list(range(world)))[r],
                               shuffle=True, seed=0, drop_last=True)
        s.set_epoch(epoch)
        out.append(list(s))
    return out


@pytest.mark.parametrize("world", [1, 2, 3, 8])
def test_distributed_sampler_split_is_disjoint(world: int) -> None:
    for epoch in (0, 1):
        assert split_problems(shares(101, world, epoch=epoch), 101) == []


def test_every_rank_passing_rank_zero_is_caught() -> None:
    problems = split_problems(shares(100, 4, rank_of=[0, 0, 0, 0]), 100)
    assert any("ranks 0 and 1 both received 25 samples" in p for p in problems)
    assert any("received 25 distinct samples, expected 100" in p for p in problems)


def test_wrong_world_size_is_caught() -> None:
    # Each rank thinks the job has 2 ranks while it has 4: ranks 2 and 3 repeat ranks 0 and 1.
    two = shares(100, 2)
    problems = split_problems([two[0], two[1], two[0], two[1]], 100)
    assert any("ranks 0 and 2" in p for p in problems)


def test_duplicates_unequal_and_out_of_range() -> None:
    assert split_problems([[0, 0], [1, 2]], 4) == [
        "rank 0 received 1 samples more than once",
        "the ranks together received 3 distinct samples, expected 4 (2 ranks x 2)"]
    assert any("different numbers" in p for p in split_problems([[0, 1, 2], [3]], 4))
    assert any("outside the dataset" in p for p in split_problems([[0, 9]], 2))


def test_loader_drops_partial_batches() -> None:
    # 2 ranks x 50 samples, batch 8: 6 whole batches each, 48 samples.
    assert split_problems([list(range(0, 48)), list(range(50, 98))], 100, batch_size=8) == []


def test_synthetic_tokens_are_deterministic() -> None:
    a, b = SyntheticTokens(10, 32, 1000, seed=3), SyntheticTokens(10, 32, 1000, seed=3)
    assert torch.equal(a[7]["tokens"], b[7]["tokens"])
    assert not torch.equal(a[7]["tokens"], a[8]["tokens"])
    assert int(a[7]["tokens"].max()) < 1000
    with pytest.raises(IndexError):
        a[10]


def test_checkpoint_comparison_is_exact() -> None:
    tree = {"model": {"w": torch.arange(6.0).view(2, 3)}, "optim": {"state": {"w": {"step": torch.tensor(2.0)}},
                                                                  "param_groups": [{"lr": 1e-3, "params": ["w"]}]}}
    flat = checkpoint.flatten(tree)
    assert set(flat) == {"model.w", "optim.state.w.step", "optim.param_groups.0.lr", "optim.param_groups.0.params.0"}
    assert checkpoint.mismatches(flat, checkpoint.flatten(tree)) == []
    changed = checkpoint.flatten(tree)
    changed["model.w"][1, 2] = torch.nextafter(changed["model.w"][1, 2], torch.tensor(100.0))  # one ulp
    changed["optim.param_groups.0.lr"] = 2e-3
    assert checkpoint.mismatches(flat, changed) == ["model.w", "optim.param_groups.0.lr"]
    retyped = {**flat, "model.w": flat["model.w"].double()}
    assert checkpoint.mismatches(flat, retyped) == ["model.w"]
    assert checkpoint.mismatches(flat, {k: v for k, v in flat.items() if k != "model.w"}) == ["model.w"]


# ---- one process on gloo -------------------------------------------------------------------------



def test_sampler_run_one_rank(gloo_world: None) -> None:
    result = sampler.run(sampler.Config(num_samples=67, batch_size=8))
    assert result.details["samples_per_rank_per_epoch"] == 64


def test_checkpoint_round_trip_one_rank(gloo_world: None, tmp_path: Path) -> None:
    result = checkpoint.run(checkpoint.Config(directory=str(tmp_path)))
    d = result.details
    assert d["tensors"] > 100 and d["tensors_changed_by_load"] == d["tensors"]  # the load changed every tensor
    assert list(tmp_path.iterdir()) == []  # removed after success


def test_kept_checkpoint_is_the_jobs_own(gloo_world: None, tmp_path: Path) -> None:
    """The checkpoint's directory admits no other user: DCP unpickles its metadata when it loads."""
    result = checkpoint.run(checkpoint.Config(directory=str(tmp_path), keep=True))
    kept = Path(result.details["directory"])
    assert kept.parent == tmp_path and kept.stat().st_mode & 0o777 == 0o700


def test_checkpoint_into_unwritable_directory_fails(gloo_world: None, tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(WorkloadError, match="cannot create"):
        checkpoint.run(checkpoint.Config(directory=str(blocker)))
