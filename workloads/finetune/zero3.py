"""Full fine-tune with DeepSpeed ZeRO-3: the proposed multi-node optimisation of the original cluster.

Parameters, gradients and optimizer state partitioned across ranks, with overlap_comm,
contiguous_gradients, sized reduce and prefetch buckets, and bf16 communication. DeepSpeed runs on
the process group torch.distributed already has (the plugin's, or ``distributed()``'s);
AdamW is torch's own (``torch_adam``), so no DeepSpeed op is compiled. With a local model
directory it fine-tunes that; without, a Qwen2-architecture model built from config on generated
function-calling text. deepspeed is an optional extra: ``available()`` says whether it imports.

Checked: losses finite, and after training every rank computes the same loss on the same batch.

Run alone: torchrun --nproc-per-node=2 -m workloads.finetune.zero3 [--model-path DIR]
"""

from __future__ import annotations

import argparse
import logging
import os
import warnings
from dataclasses import dataclass
from importlib import metadata
from typing import Any, ClassVar

import torch
import torch.distributed as dist

from workloads.common import agree_on, place
from workloads.finetune import _common as fc
from workloads.finetune import full as ff
from workloads.result import Result


@dataclass(frozen=True, kw_only=True, slots=True)
class Config(ff.Config):
    """The shared full fine-tune fields (``full_finetune.Config``: model, data, sizes, steps) plus ZeRO-3's own.

    batch_size is DeepSpeed's train_micro_batch_size_per_gpu.
    """

    GPU_PRECISION: ClassVar[dict[str, bool]] = {"bf16": True}

    bf16: bool = False
    """bf16 parameters and compute (DeepSpeed keeps fp32 master weights); on a GPU."""
    communication_dtype: str = "bf16"
    """communication_data_type: the dtype gradients are reduced in ('bf16' or 'fp32')."""
    bucket_elements: int = 0
    """reduce_bucket_size; stage3_prefetch_bucket_size is 0.9 of it. 0: hidden_size**2 (the HF rule)."""

    def __post_init__(self) -> None:
        ff.Config.__post_init__(self)  # not super(): slots=True makes a new class, which zero-argument super() misses
        if self.communication_dtype not in ("bf16", "fp32"):
            raise ValueError(f"communication_dtype={self.communication_dtype!r} must be 'bf16' or 'fp32'")


def installed() -> bool:
    """Whether deepspeed is installed at all (its package metadata), imported or not."""
    try:
        metadata.version("deepspeed")
    except metadata.PackageNotFoundError:
        return False
    return True


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
    with ff.freeing(cfg), warnings.catch_warnings():
        # DeepSpeed calls torch.distributed functions newer torch renamed: one warning per call, no news.
        warnings.filterwarnings("ignore", message=r".*torch\.distributed.* is deprecated", category=FutureWarning)
        warnings.filterwarnings("ignore", message=r".*torch\.jit\.script", category=DeprecationWarning)
        return _run(cfg)


def _run(cfg: Config) -> Result:
    import deepspeed

    logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
    here = place()
    # DeepSpeed reads LOCAL_RANK itself; torchrun sets it, a run in one process (world of one) may not.
    os.environ.setdefault("LOCAL_RANK", str(here.local_rank))
    deepspeed.init_distributed(dist_backend=dist.get_backend())  # adopts the existing default group
    dtype = torch.bfloat16 if cfg.bf16 else torch.float32
    model, ids, held = agree_on(lambda: ff.setup(cfg, "qwen2", dtype), "ZeRO-3 fine-tune setup failed", fc.SETUP_ERRORS)
    params = sum(p.numel() for p in model.parameters())
    config = ds_config(cfg, here.world_size, model.config.hidden_size)
    engine = None
    try:
        engine, _, _, _ = deepspeed.initialize(
            model=model, model_parameters=[p for p in model.parameters() if p.requires_grad], config=config,
            lr_scheduler=lambda opt: ff.schedule(opt, cfg))
        data = fc.batches(ids, ids, cfg.batch_size, cfg.seed + 3, engine.device)

        def step() -> torch.Tensor:
            x, y = next(data)
            loss = engine(input_ids=x, labels=y).loss
            engine.backward(loss)
            engine.step()
            return loss

        times, curve = ff.train(step, cfg, engine.device, "ZeRO-3 fine-tune")
        engine.eval()
        spread, same_batch = ff.same_batch_spread(lambda x: engine(input_ids=x, labels=x).loss, held, cfg,
                                                  engine.device)
        engine.train()
    except torch.OutOfMemoryError as exc:
        raise ff.oom_error(exc, "ZeRO-3 fine-tune", cfg) from None
    finally:
        if engine is not None and hasattr(engine, "destroy"):
            engine.destroy()
    return ff.result("zero3", cfg, times, curve, spread, same_batch, sharded="partitioned", head={
        "model": cfg.model_path or f"built-in Qwen2 ({cfg.num_layers}x{cfg.hidden_size})", "parameters": params,
        "deepspeed": deepspeed.__version__, "ds_config": config})


def main() -> None:
    ff.main(__doc__, Config, run, "zero3", more_options=_more_options, ready=_ready)


def _more_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--communication-dtype", choices=("bf16", "fp32"))


def _ready() -> None:
    ok, why = available()
    if not ok:
        raise SystemExit(why)


if __name__ == "__main__":
    main()
