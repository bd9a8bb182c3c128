"""Full fine-tune with FSDP (fully_shard, FSDP2): sharded parameters, gradients and optimizer state.

As validated on Mistral-7B: every decoder layer is its own FSDP unit (transformer-layer wrapping:
the classes the model names in ``_no_split_modules``), bf16 mixed precision on a GPU (bf16
compute and all-gathers, fp32 gradient reduction and master weights). With a local model directory
(``model_path``) it fine-tunes that; without, a Mistral-architecture model built from config,
trained on generated function-calling text (nothing downloaded).

Checked: losses finite, and after training every rank computes the same loss on the same batch
(each gathers the same full parameters from the shards).

Run alone: torchrun --nproc-per-node=2 -m workloads.finetune.fsdp [--model-path DIR]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from workloads.common import agree_on, place
from workloads.finetune import _common as fc
from workloads.finetune import full as ff
from workloads.result import Result, WorkloadError


@dataclass(frozen=True, kw_only=True, slots=True)
class Config(ff.Config):
    """The shared full fine-tune fields (``full_finetune.Config``: model, data, sizes, steps) plus FSDP's own."""

    GPU_PRECISION: ClassVar[dict[str, bool]] = {"mixed_precision": True}

    mixed_precision: bool = False
    """bf16 parameters and all-gathers in forward/backward, fp32 gradient reduction (GPU)."""
    reshard_after_forward: bool = True
    """Free the gathered parameters after forward (ZeRO-3-like); False keeps them for backward."""

    def __post_init__(self) -> None:
        ff.Config.__post_init__(self)  # not super(): slots=True makes a new class, which zero-argument super() misses
        if self.lr < 0:
            raise ValueError(f"lr={self.lr} cannot be negative")


def run(cfg: Config) -> Result:
    """Shard per decoder layer, train ``steps`` steps, check ranks agree, measure tokens/s and loss drop."""
    with ff.freeing(cfg):
        return _run(cfg)


def _run(cfg: Config) -> Result:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    here = place()
    device = torch.device(cfg.device)
    model, ids, held = agree_on(lambda: _setup(cfg, device), "FSDP fine-tune setup failed", fc.SETUP_ERRORS)
    try:
        mesh = init_device_mesh(device.type, (here.world_size,))
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) \
            if cfg.mixed_precision else MixedPrecisionPolicy()
        units = set(getattr(model, "_no_split_modules", None) or ())
        layers = [m for m in model.modules() if type(m).__name__ in units]
        if not layers:
            raise WorkloadError(f"no decoder layer to wrap: the model names {sorted(units)} in _no_split_modules")
        for layer in layers:
            fully_shard(layer, mesh=mesh, mp_policy=policy, reshard_after_forward=cfg.reshard_after_forward)
        fully_shard(model, mesh=mesh, mp_policy=policy, reshard_after_forward=cfg.reshard_after_forward)
        model.to(torch.float32)  # fp32 master weights (local shards only); compute follows the policy
        opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)
        sched = ff.schedule(opt, cfg)
        data = fc.batches(ids, ids, cfg.batch_size, cfg.seed + 3, device)

        def step() -> torch.Tensor:
            x, y = next(data)
            loss = model(input_ids=x, labels=y).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)  # DTensor-aware
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            return loss

        times, curve = ff.train(step, cfg, device, "FSDP fine-tune")
        spread, same_batch = ff.same_batch_spread(lambda x: model(input_ids=x, labels=x).loss, held, cfg, device)
    except torch.OutOfMemoryError as exc:
        raise ff.oom_error(exc, "FSDP fine-tune", cfg) from None
    params = sum(p.numel() for p in model.parameters())  # DTensor numel: the full (unsharded) size
    return ff.result("fsdp", cfg, times, curve, spread, same_batch, sharded="sharded", head={
        "model": cfg.model_path or f"built-in Mistral ({cfg.num_layers}x{cfg.hidden_size})", "parameters": params,
        "wrapped_layers": len(layers)})


def _setup(cfg: Config, device: torch.device) -> tuple[Any, Any, Any]:
    # bf16 on the host (half the memory per rank); upcast after sharding, shard by shard.
    model, ids, held_ids = ff.setup(cfg, "mistral", torch.bfloat16 if device.type == "cuda" else torch.float32)
    if device.type == "cpu":
        model = model.to(device)  # on a GPU fully_shard moves each unit to the device as it shards it
    return model, ids, held_ids


def main() -> None:
    ff.main(__doc__, Config, run, "fsdp")


if __name__ == "__main__":
    main()
