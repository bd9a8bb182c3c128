"""Checkpoint round trip: save a trained model and its optimizer, load them on every rank, compare.

The GPT of ``workloads.training.gpt`` trains a few DDP steps (so the AdamW moments are not zero), then
``torch.distributed.checkpoint`` saves model + optimizer state under ``directory``: each rank
writes its own file and the planner spreads the replicated tensors over the ranks, so every rank
must read files other ranks wrote. A fresh model with other weights loads it on every rank, and
every tensor must equal the saved one exactly; the mismatch count is summed over all ranks.

The directory must be the same path on every rank, and in a multi-node job one that every node
mounts: a probe file written by rank 0 must be visible everywhere, or the run fails naming the
ranks that cannot see it.

Run alone: torchrun --nproc-per-node=2 -m workloads.training.checkpoint --dir /shared/scratch
"""

from __future__ import annotations

import argparse
import dataclasses
import secrets
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from workloads.common import agree, check_level, distributed
from workloads.result import Result
from workloads.training import gpt


@dataclass(frozen=True, kw_only=True, slots=True)
class Config:
    directory: str
    """Where the checkpoint goes (a fresh subdirectory is made and removed): the same path on every
    rank, on a filesystem every node mounts."""
    preset: str = "tiny"
    """GPT shape (workloads.training.gpt.PRESETS): gpt2-124m writes about 1.5 GB (weights + AdamW moments)."""
    train_steps: int = 2
    """DDP steps before saving, so the optimizer state is real."""
    seed: int = 0
    device: str = "cpu"
    keep: bool = False
    """Leave the checkpoint on disk (it is always left when the check fails)."""

    @classmethod
    def for_level(cls, level: str, device: torch.device, directory: str | Path) -> Config:
        check_level(level)
        # quick (a day-2 check) proves the sharded round trip is exact with the small model in well under a
        # second; gpt2-124m's 1.5 GB of state took 11.5 s on 2 H200s, a disk test the full levels keep.
        full = device.type == "cuda" and level != "quick"
        return cls(directory=str(directory), preset="gpt2-124m" if full else "tiny", device=str(device))


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """A nested state dict as {dotted path: leaf}; tensors detached and copied where they are. Not to the host:
    gpt2-124m's state (1.5 GB with the AdamW moments) is copied three times a round trip and compared twice,
    which HBM does in milliseconds and pageable host copies and a CPU compare take seconds over."""
    if isinstance(tree, dict):
        return {k: v for key, sub in tree.items() for k, v in flatten(sub, f"{prefix}{key}.").items()}
    if isinstance(tree, (list, tuple)):
        return {k: v for i, sub in enumerate(tree) for k, v in flatten(sub, f"{prefix}{i}.").items()}
    return {prefix.rstrip("."): tree.detach().clone() if isinstance(tree, torch.Tensor) else tree}


def mismatches(expected: dict[str, Any], actual: dict[str, Any]) -> list[str]:
    """Keys whose values are not exactly equal (tensors: same dtype, shape and bits), or are missing."""
    bad = [k for k in expected if k not in actual] + [k for k in actual if k not in expected]
    for key in expected.keys() & actual.keys():
        a, b = expected[key], actual[key]
        if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
            same = (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype
                    and torch.equal(a, b.to(a.device)))
        else:
            same = a == b
        if not same:
            bad.append(key)
    return sorted(bad)


def _shared_path(cfg: Config, device: torch.device, group: dist.ProcessGroup | None) -> Path:
    """A fresh directory under cfg.directory, named by rank 0, that every rank can see."""
    token = torch.tensor([secrets.randbits(62)], dtype=torch.int64, device=device)  # never a torch seed's
    dist.broadcast(token, src=dist.get_global_rank(group or dist.group.WORLD, 0), group=group)
    path = Path(cfg.directory) / f"clustergate-checkpoint-{int(token.item()):016x}"
    probe = path / "visible-to-every-rank"
    problem = None
    if dist.get_rank(group) == 0:
        try:
            # The job's own (0700): DCP loads its metadata with pickle, so no other user may put a file there.
            path.mkdir(parents=True, mode=0o700)
            probe.write_text("written by rank 0\n")
        except OSError as exc:
            problem = f"cannot create {path} ({exc})"
    agree(problem, "the checkpoint directory could not be made", "choose a writable directory: settings.shared_dir "
          "in thresholds.yaml", group)
    deadline = time.monotonic() + 5  # network filesystems may show a new file a little late
    while not probe.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    agree(None if probe.exists() else f"cannot see {probe}, which rank 0 wrote",
          f"{cfg.directory} is not shared by every node", "set settings.shared_dir to a directory every node mounts",
          group)
    return path


def run(cfg: Config, group: dist.ProcessGroup | None = None) -> Result:
    # Imported here, not at the top: torch.distributed.checkpoint brings in DTensor, 1.7 s of CPU per rank, and
    # every run of the suite imports this module when it collects test_training.py, whether or not it runs it.
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    device = torch.device(cfg.device)
    # A small batch: the round trip is about the state, not throughput. Eager: nothing to compile.
    gcfg = gpt.Config.for_level("quick", device, cfg.preset, seed=cfg.seed, compile="off", batch_size=4)
    path = _shared_path(cfg, device, group)
    model = gpt.build(gcfg)
    ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None, process_group=group)
    opt = gpt.optimizer(model, gcfg)
    for x, y in gpt.token_batches(gcfg, cfg.train_steps, group):
        gpt.train_step(ddp, model, opt, x, y, gcfg)
    model_sd, optim_sd = get_state_dict(model, opt)
    expected = flatten({"model": model_sd, "optim": optim_sd})
    t0 = time.perf_counter()
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=path, process_group=group)
    save_s = time.perf_counter() - t0

    fresh = gpt.build(dataclasses.replace(gcfg, seed=cfg.seed + 1))
    fresh_opt = gpt.optimizer(fresh, gcfg)
    fresh_model_sd, fresh_optim_sd = get_state_dict(fresh, fresh_opt)  # also creates the AdamW state
    state = {"model": fresh_model_sd, "optim": fresh_optim_sd}
    tensors = [k for k, v in expected.items() if isinstance(v, torch.Tensor)]
    differed = len(set(mismatches(expected, flatten(state))) & set(tensors))
    t0 = time.perf_counter()
    dcp.load(state, checkpoint_id=path, process_group=group)
    load_s = time.perf_counter() - t0
    set_state_dict(fresh, fresh_opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    after = get_state_dict(fresh, fresh_opt)
    bad = mismatches(expected, flatten({"model": after[0], "optim": after[1]}))
    problem = None
    if bad:
        problem = f"{len(bad)} of {len(expected)} entries differ (e.g. {bad[:5]})"
    elif not differed:
        problem = "the fresh model already equalled the saved one: nothing was tested"
    files = sorted(p.name for p in path.iterdir())
    size = sum(p.stat().st_size for p in path.iterdir())
    ranks = dist.get_world_size(group)
    agree(problem, f"checkpoint round trip through {path} failed", "the checkpoint is left there; check free space "
          "and that every node sees the same files", group)
    dist.barrier(group=group, device_ids=[device.index] if device.type == "cuda" else None)
    if dist.get_rank(group) == 0 and not cfg.keep:
        shutil.rmtree(path, ignore_errors=True)
    return Result(metrics=(), details={
        "directory": str(path), "kept": cfg.keep, "preset": cfg.preset, "ranks": ranks, "entries": len(expected),
        "tensors": len(tensors), "tensors_changed_by_load": differed, "files": files, "bytes": size,
        "save_s": save_s, "load_s": load_s, "save_gbps": size / save_s / 1e9, "load_gbps": size / load_s / 1e9})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--level", default="standard", choices=("quick", "standard", "extended"))
    parser.add_argument("--dir", default=tempfile.gettempdir(),
                        help="directory every rank (every node) can write (default: %(default)s)")
    parser.add_argument("--preset", choices=tuple(gpt.PRESETS), help="default: gpt2-124m on GPU, tiny on CPU")
    parser.add_argument("--keep", action="store_true", help="leave the checkpoint on disk")
    args = parser.parse_args()
    with distributed() as here:
        cfg = Config.for_level(args.level, here.device, args.dir)
        cfg = dataclasses.replace(cfg, preset=args.preset or cfg.preset, keep=args.keep)
        result = run(cfg)
        if here.rank == 0:
            d = result.details
            print(f"checkpoint round trip exact on {d['ranks']} ranks: {d['entries']} entries, "
                  f"{d['bytes'] / 1e6:.1f} MB in {len(d['files'])} files, save {d['save_s']:.2f} s, "
                  f"load {d['load_s']:.2f} s")


if __name__ == "__main__":
    main()
