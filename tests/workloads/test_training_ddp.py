"""Two real gloo ranks (spawned processes): the checks that need more than one rank to mean anything.

- the GPT run's replica check catches gradients that are not all-reduced (a DDP that never syncs);
- the sampler check passes on a real 2-rank split and fails when both ranks pass rank 0;
- the checkpoint round trip reads files the other rank wrote, and a directory one rank cannot
  see is named.
"""

from __future__ import annotations

import contextlib
import json
import traceback
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp
from torch import nn

from workloads.common import end_process_groups, start_process_group

pytestmark = pytest.mark.slow


class NoSyncDDP(nn.Module):
    """Stands in for DistributedDataParallel but never all-reduces: each rank trains on its own data."""

    def __init__(self, module: nn.Module, **_: Any) -> None:
        super().__init__()
        self.module = module

    def forward(self, *args: Any) -> Any:
        return self.module(*args)

    def no_sync(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()


def _outcome(fn: Any) -> str:
    try:
        fn()
        return "ok"
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"


def _rank(rank: int, world: int, store_path: str, out: str) -> None:
    import torch.utils.data.distributed as dd

    from workloads.training import checkpoint, gpt, sampler

    torch.set_num_threads(1)
    start_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=world)
    results: dict[str, str] = {}
    try:
        quick = gpt.Config(warmup=1, steps=2, local_steps=1, peak_tflops=1.0)
        results["gpt"] = _outcome(lambda: gpt.run(quick))
        ckpt = checkpoint.Config(directory=str(Path(out).parent / "ckpt"), keep=True)
        results["checkpoint"] = _outcome(lambda: checkpoint.run(ckpt))
        real_exists = Path.exists
        if rank == 1:  # as if rank 1 were on a node that does not mount the directory
            Path.exists = lambda self: False if self.name == "visible-to-every-rank" else real_exists(self)
        results["checkpoint_unshared"] = _outcome(lambda: checkpoint.run(ckpt))
        Path.exists = real_exists
        results["sampler"] = _outcome(lambda: sampler.run(sampler.Config(num_samples=67, batch_size=4)))
        real_ddp, gpt.DDP = gpt.DDP, NoSyncDDP
        results["gpt_unsynced"] = _outcome(lambda: gpt.run(quick))
        gpt.DDP = real_ddp
        real_init = dd.DistributedSampler.__init__

        def everyone_rank_zero(self: Any, *args: Any, **kwargs: Any) -> None:
            real_init(self, *args, **{**kwargs, "rank": 0})

        dd.DistributedSampler.__init__ = everyone_rank_zero
        results["sampler_rank_zero"] = _outcome(lambda: sampler.run(sampler.Config(num_samples=67, batch_size=4)))
    except Exception:
        results["crash"] = traceback.format_exc()
    finally:
        Path(f"{out}.{rank}").write_text(json.dumps(results))
        end_process_groups()


def test_two_ranks(tmp_path: Path) -> None:
    world = 2
    mp.spawn(_rank, args=(world, str(tmp_path / "store"), str(tmp_path / "out")), nprocs=world, join=True)
    for rank in range(world):
        results = json.loads((tmp_path / f"out.{rank}").read_text())
        assert "crash" not in results, results.get("crash")
        assert results["gpt"] == "ok"
        assert results["sampler"] == "ok"
        assert results["checkpoint"] == "ok"
        assert "not shared by every node on 1/2 ranks" in results["checkpoint_unshared"]
        assert "cannot see" in results["checkpoint_unshared"]
        assert "parameters differ across ranks" in results["gpt_unsynced"]
        assert "ranks 0 and 1 both received 32 samples" in results["sampler_rank_zero"]
    written = sorted(p.name for d in (tmp_path / "ckpt").iterdir() for p in d.iterdir())
    assert {"__0_0.distcp", "__1_0.distcp", ".metadata"} <= set(written)  # each rank wrote its shard


def test_the_round_trip_compares_copies_where_the_state_lies() -> None:
    """The expected state is a copy kept on the state's own device (no host round trip): a tensor changed after it
    was taken differs, an equal one on another device does not, nor does a non-tensor leaf."""
    from workloads.training.checkpoint import flatten, mismatches

    weight = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    state = {"model": {"w": weight}, "optim": {"state": {0: {"step": torch.tensor(3.0)}}, "lr": [1e-3]}}
    expected = flatten(state)
    assert set(expected) == {"model.w", "optim.state.0.step", "optim.lr.0"}
    assert expected["model.w"].device == weight.device and expected["model.w"].data_ptr() != weight.data_ptr()
    assert mismatches(expected, flatten(state)) == []
    weight[0, 0] = 42.0  # a load that changed what it should not have
    assert mismatches(expected, flatten(state)) == ["model.w"]
    assert mismatches({"k": torch.ones(2, dtype=torch.float64)}, {"k": torch.ones(2)}) == ["k"]  # dtype counts
