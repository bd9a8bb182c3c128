"""Full fine-tune with DeepSpeed ZeRO-3: the proposed multi-node optimisation of the original cluster.

Parameters, gradients and optimizer state partitioned across ranks, with overlap_comm,
contiguous_gradients, sized reduce and prefetch buckets, and bf16 communication. DeepSpeed runs on
the process group torch.distributed already has (the plugin's, or ``ensure_distributed``'s);
AdamW is torch's own (``torch_adam``), so no DeepSpeed op is compiled. With a local model
directory it fine-tunes that; without, a Qwen2-architecture model built from config on generated
function-calling text. deepspeed is an optional extra: ``available()`` says whether it imports.

Checked: losses finite, and after training every rank computes the same loss on the same batch.

Run alone: torchrun --nproc-per-node=2 -m workloads.zero3 [--model-path DIR]
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import logging
import os
import warnings
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
    """Local Hugging Face model directory (Qwen2/Llama/Mistral); None: a model built from config."""
    data_path: str | None = None
    """Local JSONL in the Glaive function-calling format; None: generated records."""
    device: str = "cpu"
    steps: int = 30
    batch_size: int = 4
    """Sequences per rank per step (train_micro_batch_size_per_gpu)."""
    seq_len: int = 256
    lr: float = 3e-3
    warmup_steps: int = 3
    max_grad_norm: float = 1.0
    """Gradients are clipped to this global norm (as fine-tuning recipes do)."""
    hidden_size: int = 128
    """Built-in model only: width, layers and attention heads."""
    num_layers: int = 2
    num_heads: int = 4
    bf16: bool = False
    """bf16 parameters and compute (DeepSpeed keeps fp32 master weights); on a GPU."""
    communication_dtype: str = "bf16"
    """communication_data_type: the dtype gradients are reduced in ('bf16' or 'fp32')."""
    bucket_elements: int = 0
    """reduce_bucket_size; stage3_prefetch_bucket_size is 0.9 of it. 0: hidden_size**2 (the HF rule)."""
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
        if self.communication_dtype not in ("bf16", "fp32"):
            raise ValueError(f"communication_dtype={self.communication_dtype!r} must be 'bf16' or 'fp32'")

    @classmethod
    def for_level(cls, level: str, device: torch.device, *, model_path: str | None = None,
                  data_path: str | None = None) -> Config:
        check_level(level)
        if device.type == "cpu":
            return cls(model_path=model_path, data_path=data_path, device=str(device),
                       steps={"quick": 30, "standard": 30, "extended": 100}[level])
        steps = {"quick": 30, "standard": 60, "extended": 200}[level]
        if model_path is not None:
            return cls(model_path=model_path, data_path=data_path, device=str(device), steps=steps, batch_size=4,
                       seq_len=512, lr=1e-5, warmup_steps=steps // 10, bf16=True, train_samples=2048)
        return cls(data_path=data_path, device=str(device), steps=steps, batch_size=8, seq_len=1024, lr=6e-4,
                   warmup_steps=steps // 10, hidden_size=1024, num_layers=12, num_heads=16, bf16=True,
                   train_samples=2000)


def available() -> tuple[bool, str]:
    """Whether deepspeed imports here, and if not, why (for a skip reason)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # deepspeed's own use of torch.jit at import
            import deepspeed  # noqa: F401
    except Exception as exc:  # an ImportError, or a broken install failing at import: either way, unusable
        return False, (f"deepspeed is not installed or does not import ({type(exc).__name__}: {exc}); "
                       "install the optional extra: pip install 'clustergate[deepspeed]'")
    return True, ""


def ds_config(cfg: Config, world_size: int, hidden: int) -> dict[str, Any]:
    """The DeepSpeed config: ZeRO-3 with the original proposal's communication settings."""
    bucket = cfg.bucket_elements or hidden * hidden
    return {
        "train_micro_batch_size_per_gpu": cfg.batch_size,
        "gradient_accumulation_steps": 1,
        "train_batch_size": cfg.batch_size * world_size,
        "optimizer": {"type": "AdamW", "params": {"lr": cfg.lr, "weight_decay": 0.0, "torch_adam": True}},
        "bf16": {"enabled": cfg.bf16},
        "communication_data_type": cfg.communication_dtype,
        "gradient_clipping": cfg.max_grad_norm,
        "zero_optimization": {
            "stage": 3, "overlap_comm": True, "contiguous_gradients": True, "reduce_bucket_size": bucket,
            "stage3_prefetch_bucket_size": int(0.9 * bucket), "stage3_param_persistence_threshold": 10 * hidden,
        },
        "steps_per_print": 1 << 30,
        "wall_clock_breakdown": False,
    }


def run(cfg: Config) -> Result:
    """Train ``steps`` ZeRO-3 steps, check ranks agree, measure tokens/s and loss drop."""
    try:
        with warnings.catch_warnings():
            # DeepSpeed calls torch.distributed functions newer torch renamed: one warning per call, no news.
            warnings.filterwarnings("ignore", message=r".*torch\.distributed.* is deprecated", category=FutureWarning)
            warnings.filterwarnings("ignore", message=r".*torch\.jit\.script", category=DeprecationWarning)
            return _run(cfg)
    finally:
        gc.collect()  # the engine's hooks make reference cycles: free the partitions before the next test
        if torch.device(cfg.device).type == "cuda":
            torch.cuda.empty_cache()


def _run(cfg: Config) -> Result:
    import deepspeed
    from transformers import get_cosine_schedule_with_warmup

    logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
    here = place()
    # DeepSpeed reads LOCAL_RANK itself; torchrun sets it, a run in one process (world of one) may not.
    os.environ.setdefault("LOCAL_RANK", str(here.local_rank))
    deepspeed.init_distributed(dist_backend=dist.get_backend())  # adopts the existing default group
    model, ids, held = fc.agree(lambda: _setup(cfg))
    params = sum(p.numel() for p in model.parameters())
    config = ds_config(cfg, here.world_size, model.config.hidden_size)
    engine = None
    try:
        engine, _, _, _ = deepspeed.initialize(
            model=model, model_parameters=[p for p in model.parameters() if p.requires_grad], config=config,
            lr_scheduler=lambda opt: get_cosine_schedule_with_warmup(opt, min(cfg.warmup_steps, cfg.steps // 2),
                                                                     cfg.steps))
        data = fc.batches(ids, ids, cfg.batch_size, cfg.seed + 3, engine.device)
        history: list[torch.Tensor] = []

        def step() -> None:
            x, y = next(data)
            loss = engine(input_ids=x, labels=y).loss
            engine.backward(loss)
            engine.step()
            history.append(loss.detach().float())

        warmup = min(3, cfg.steps // 4)
        times = time_runs(step, engine.device, warmup=warmup, repeats=cfg.steps - warmup)
        curve = fc.world_curve(history, "ZeRO-3 fine-tune", cfg.lr)
        spread, same_batch = _same_batch_spread(engine, held, cfg)
    except torch.OutOfMemoryError as exc:
        raise fc.oom_error(exc, "ZeRO-3 fine-tune", f"batch_size={cfg.batch_size}, seq_len={cfg.seq_len}, "
                           f"model {cfg.model_path or 'built-in'}") from None
    finally:
        if engine is not None and hasattr(engine, "destroy"):
            engine.destroy()
    if spread > cfg.agreement_rtol:
        raise WorkloadError(f"ranks disagree on the loss of the same batch after training: losses {same_batch} "
                            f"(relative spread {spread:.3g}, allowed {cfg.agreement_rtol:g}); the partitioned "
                            "parameters do not gather the same on every rank")
    drop, early, late = fc.loss_drop(curve, cfg.loss_window or max(1, cfg.steps // 5))
    timing = summarize(times)
    tokens = cfg.batch_size * cfg.seq_len
    return Result(metrics=(
        Metric("zero3_loss_drop", drop, "fraction", "world", "1 - late/early mean training loss, averaged over ranks"),
        Metric("zero3_tokens_per_s_per_gpu", tokens / timing["median_s"], "tokens/s", "gpu",
               "tokens this rank trained on per second, median step"),
    ), details={"zero3": {
        "model": cfg.model_path or f"built-in Qwen2 ({cfg.num_layers}x{cfg.hidden_size})", "parameters": params,
        "deepspeed": deepspeed.__version__, "ds_config": config, "loss_curve": [round(x, 4) for x in curve],
        "early_loss": early, "late_loss": late, "same_batch_losses": same_batch, "step_time": timing,
        "tokens_per_step_per_rank": tokens, "world_size": here.world_size,
        "config": {k: v for k, v in dataclasses.asdict(cfg).items() if k != "device"}}})


def _setup(cfg: Config) -> tuple[Any, Any, Any]:
    train, held = fc.records(cfg.data_path, cfg.train_samples, 16, cfg.seed)
    if cfg.model_path is None:
        tokenizer = fc.built_in_tokenizer(train)
        model = fc.build_model("qwen2", len(tokenizer), cfg.hidden_size, cfg.num_layers, cfg.num_heads,
                               cfg.seq_len, cfg.seed)
    else:
        model, tokenizer = fc.load_local(cfg.model_path, torch.bfloat16 if cfg.bf16 else torch.float32)
    ids = fc.blocks(train, tokenizer, cfg.seq_len, need_reply=False)[0]
    held_ids = fc.blocks(held, tokenizer, cfg.seq_len, need_reply=False)[0]
    return model, ids, held_ids


def _same_batch_spread(engine: Any, held: Any, cfg: Config) -> tuple[float, list[float]]:
    """Every rank's loss on the same held-out batch, and their relative spread."""
    x = held[: cfg.batch_size].to(engine.device)
    engine.eval()
    with torch.no_grad():
        loss = engine(input_ids=x, labels=x).loss.detach().double()
    engine.train()
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
    parser.add_argument("--communication-dtype", choices=("bf16", "fp32"))
    args = parser.parse_args()
    ok, why = available()
    if not ok:
        raise SystemExit(why)
    here = ensure_distributed()
    cfg = Config.for_level(args.level, here.device, model_path=args.model_path, data_path=args.data_path)
    given = {k: v for k, v in vars(args).items() if v is not None and k in Config.__dataclass_fields__}
    result = run(dataclasses.replace(cfg, **given))
    if here.rank == 0:
        for m in result.metrics:
            print(f"{m.name} = {m.value:.4g} {m.unit}  ({m.description})")
        print("loss curve:", " ".join(f"{x:.2f}" for x in result.details["zero3"]["loss_curve"]))


if __name__ == "__main__":
    main()
