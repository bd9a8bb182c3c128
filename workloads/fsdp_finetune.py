"""Full fine-tune with FSDP (fully_shard, FSDP2): sharded parameters, gradients and optimizer state.

As validated on Mistral-7B: every decoder layer is its own FSDP unit (transformer-layer wrapping:
the classes the model names in ``_no_split_modules``), bf16 mixed precision on a GPU (bf16
compute and all-gathers, fp32 gradient reduction and master weights). With a local model directory
(``model_path``) it fine-tunes that; without, a Mistral-architecture model built from config,
trained on generated function-calling text (nothing downloaded).

Checked: losses finite, and after training every rank computes the same loss on the same batch
(each gathers the same full parameters from the shards).

Run alone: torchrun --nproc-per-node=2 -m workloads.fsdp_finetune [--model-path DIR]
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from workloads import finetune_common as fc
from workloads.common import check_level, ensure_distributed, place, summarize, time_runs
from workloads.result import Metric, Result, WorkloadError


@dataclass(frozen=True, kw_only=True, slots=True)
class Config:
    model_path: str | None = None
    """Local Hugging Face model directory (Mistral/Llama/Qwen2); None: a model built from config."""
    data_path: str | None = None
    """Local JSONL in the Glaive function-calling format; None: generated records."""
    device: str = "cpu"
    steps: int = 30
    batch_size: int = 4
    """Sequences per rank per step."""
    seq_len: int = 256
    lr: float = 3e-3
    warmup_steps: int = 3
    max_grad_norm: float = 1.0
    """Gradients are clipped to this global norm (as fine-tuning recipes do)."""
    hidden_size: int = 128
    """Built-in model only: width, layers and attention heads."""
    num_layers: int = 2
    num_heads: int = 4
    mixed_precision: bool = False
    """bf16 parameters and all-gathers in forward/backward, fp32 gradient reduction (GPU)."""
    reshard_after_forward: bool = True
    """Free the gathered parameters after forward (ZeRO-3-like); False keeps them for backward."""
    train_samples: int = 400
    loss_window: int = 0
    """Steps averaged at the start and end for the loss drop; 0: steps // 5."""
    agreement_rtol: float = 1e-3
    """Largest relative spread of the same batch's loss across ranks."""
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "seq_len", "train_samples"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be at least 1")
        if self.lr < 0:
            raise ValueError(f"lr={self.lr} cannot be negative")

    @classmethod
    def for_level(cls, level: str, device: torch.device, *, model_path: str | None = None,
                  data_path: str | None = None) -> Config:
        check_level(level)
        if device.type == "cpu":
            return cls(model_path=model_path, data_path=data_path, device=str(device),
                       steps={"quick": 30, "standard": 30, "extended": 100}[level])
        steps = {"quick": 30, "standard": 60, "extended": 200}[level]
        if model_path is not None:
            # The validated setting: 7B full fine-tune, seq 512, bf16.
            return cls(model_path=model_path, data_path=data_path, device=str(device), steps=steps, batch_size=4,
                       seq_len=512, lr=1e-5, warmup_steps=steps // 10, mixed_precision=True, train_samples=2048)
        return cls(data_path=data_path, device=str(device), steps=steps, batch_size=8, seq_len=1024, lr=6e-4,
                   warmup_steps=steps // 10, hidden_size=1024, num_layers=12, num_heads=16, mixed_precision=True,
                   train_samples=2000)


def run(cfg: Config) -> Result:
    """Shard per decoder layer, train ``steps`` steps, check ranks agree, measure tokens/s and loss drop."""
    try:
        return _run(cfg)
    finally:
        gc.collect()  # FSDP hooks make reference cycles: free the shards before the next test
        if torch.device(cfg.device).type == "cuda":
            torch.cuda.empty_cache()


def _run(cfg: Config) -> Result:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from transformers import get_cosine_schedule_with_warmup

    here = place()
    device = torch.device(cfg.device)
    model, ids, held = fc.agree(lambda: _setup(cfg, device))
    settings = f"batch_size={cfg.batch_size}, seq_len={cfg.seq_len}, model {cfg.model_path or 'built-in'}"
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
        sched = get_cosine_schedule_with_warmup(opt, min(cfg.warmup_steps, cfg.steps // 2), cfg.steps)
        data = fc.batches(ids, ids, cfg.batch_size, cfg.seed + 3, device)
        history: list[torch.Tensor] = []

        def step() -> None:
            x, y = next(data)
            loss = model(input_ids=x, labels=y).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)  # DTensor-aware
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            history.append(loss.detach().float())

        warmup = min(3, cfg.steps // 4)
        times = time_runs(step, device, warmup=warmup, repeats=cfg.steps - warmup)
        curve = fc.world_curve(history, "FSDP fine-tune", cfg.lr)
        spread, same_batch = _same_batch_spread(model, held, cfg, device)
    except torch.OutOfMemoryError as exc:
        raise fc.oom_error(exc, "FSDP fine-tune", settings) from None
    if spread > cfg.agreement_rtol:
        raise WorkloadError(f"ranks disagree on the loss of the same batch after training: losses {same_batch} "
                            f"(relative spread {spread:.3g}, allowed {cfg.agreement_rtol:g}); the sharded "
                            "parameters do not gather the same on every rank")
    drop, early, late = fc.loss_drop(curve, cfg.loss_window or max(1, cfg.steps // 5))
    timing = summarize(times)
    tokens = cfg.batch_size * cfg.seq_len
    params = sum(p.numel() for p in model.parameters())  # DTensor numel: the full (unsharded) size
    return Result(metrics=(
        Metric("fsdp_loss_drop", drop, "fraction", "world", "1 - late/early mean training loss, averaged over ranks"),
        Metric("fsdp_tokens_per_s_per_gpu", tokens / timing["median_s"], "tokens/s", "gpu",
               "tokens this rank trained on per second, median step"),
    ), details={"fsdp": {
        "model": cfg.model_path or f"built-in Mistral ({cfg.num_layers}x{cfg.hidden_size})", "parameters": params,
        "wrapped_layers": len(layers), "loss_curve": [round(x, 4) for x in curve], "early_loss": early,
        "late_loss": late, "same_batch_losses": same_batch, "step_time": timing, "tokens_per_step_per_rank": tokens,
        "world_size": here.world_size, "config": {k: v for k, v in dataclasses.asdict(cfg).items() if k != "device"}}})


def _setup(cfg: Config, device: torch.device) -> tuple[Any, Any, Any]:
    train, held = fc.records(cfg.data_path, cfg.train_samples, 16, cfg.seed)
    if cfg.model_path is None:
        tokenizer = fc.built_in_tokenizer(train)
        model = fc.build_model("mistral", len(tokenizer), cfg.hidden_size, cfg.num_layers, cfg.num_heads,
                               cfg.seq_len, cfg.seed)
    else:
        # bf16 on the host (half the memory per rank); upcast after sharding, shard by shard.
        model, tokenizer = fc.load_local(cfg.model_path, torch.bfloat16 if device.type == "cuda" else torch.float32)
    ids = fc.blocks(train, tokenizer, cfg.seq_len, need_reply=False)[0]
    held_ids = fc.blocks(held, tokenizer, cfg.seq_len, need_reply=False)[0]
    if device.type == "cpu":
        model = model.to(device)  # on a GPU fully_shard moves each unit to the device as it shards it
    return model, ids, held_ids


def _same_batch_spread(model: Any, held: Any, cfg: Config, device: torch.device) -> tuple[float, list[float]]:
    """Every rank's loss on the same held-out batch, and their relative spread."""
    x = held[: cfg.batch_size].to(device)
    with torch.no_grad():
        loss = model(input_ids=x, labels=x).loss.detach().double()
    everyone = [torch.zeros_like(loss) for _ in range(dist.get_world_size())]
    dist.all_gather(everyone, loss)
    values = [float(v) for v in everyone]
    return (max(values) - min(values)) / max(abs(max(values)), 1e-12), values


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--level", default="standard", choices=("quick", "standard", "extended"))
    parser.add_argument("--model-path", help="local Hugging Face model directory (default: built-in model)")
    parser.add_argument("--data-path", help="local Glaive-format JSONL (default: generated records)")
    for name, kind in (("steps", int), ("batch_size", int), ("seq_len", int), ("lr", float)):
        parser.add_argument("--" + name.replace("_", "-"), type=kind, help=f"override Config.{name}")
    args = parser.parse_args()
    here = ensure_distributed()
    cfg = Config.for_level(args.level, here.device, model_path=args.model_path, data_path=args.data_path)
    given = {k: v for k, v in vars(args).items() if v is not None and k in Config.__dataclass_fields__}
    result = run(dataclasses.replace(cfg, **given))
    if here.rank == 0:
        for m in result.metrics:
            print(f"{m.name} = {m.value:.4g} {m.unit}  ({m.description})")
        print("loss curve:", " ".join(f"{x:.2f}" for x in result.details["fsdp"]["loss_curve"]))


if __name__ == "__main__":
    main()
