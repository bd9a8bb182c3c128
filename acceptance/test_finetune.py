"""Fine-tunes: does training on this cluster learn, and how fast, with LoRA, FSDP and ZeRO-3?

Each runs a model built from config on generated data unless local files are given
(--lora-model/--lora-data, --finetune-model/--finetune-data): nothing is downloaded.

None runs at --level quick, the day-2 node check: each tests a fine-tuning stack (transformers, peft, FSDP,
DeepSpeed) rather than the node, and costs a quick run seconds of imports and model building; the GPT test
trains on every GPU and the collective tests check NCCL on every GPU there. Their modules import
transformers, peft and DeepSpeed only inside the runs, so a quick run never imports them.
"""

from __future__ import annotations

import pytest

from clustergate.run.recorder import Recorder
from workloads.finetune import fsdp as fsdp_finetune
from workloads.finetune import lora, zero3


def _path(request: pytest.FixtureRequest, name: str) -> str | None:
    return request.config.getoption(name)


def _not_at_quick(cg: Recorder, what: str, tests: str) -> None:
    if cg.level == "quick":
        cg.skip(f"--level quick (day-2 node check) leaves out the {what}: it tests {tests}, not the node; "
                "run --level standard for it", fact="below_level", level=cg.level)


@pytest.mark.metrics("lora_loss_drop", "lora_eval_loss_drop", "lora_tokens_per_s_per_gpu")
def test_lora_finetune_learns(cg: Recorder, request: pytest.FixtureRequest) -> None:
    """LoRA (r=64, alpha=128 on q/k/v/o, cosine, DDP) lowers the training and held-out loss; ranks agree.
    Not at --level quick (13 s of a 62 s quick run on one H100)."""
    _not_at_quick(cg, "LoRA fine-tune", "transformers and peft")
    cfg = lora.Config.for_level(cg.level, cg.device, model_path=_path(request, "lora_model"),
                                data_path=_path(request, "lora_data"))
    cg.record_result(lora.run(cfg))


@pytest.mark.metrics("fsdp_loss_drop", "fsdp_tokens_per_s_per_gpu")
def test_fsdp_full_finetune(cg: Recorder, request: pytest.FixtureRequest) -> None:
    """FSDP full fine-tune (decoder-layer units, bf16 mixed precision on GPU): loss falls; tokens/s per GPU.
    Not at --level quick (9.1 s of a 53.4 s quick run on one H100, 15.6 s of 73.8 s with a cold compile cache)."""
    _not_at_quick(cg, "FSDP fine-tune", "FSDP's sharding of a transformers model")
    cfg = fsdp_finetune.Config.for_level(cg.level, cg.device, model_path=_path(request, "finetune_model"),
                                         data_path=_path(request, "finetune_data"))
    cg.record_result(fsdp_finetune.run(cfg))


@pytest.mark.metrics("zero3_loss_drop", "zero3_tokens_per_s_per_gpu")
def test_zero3_finetune(cg: Recorder, request: pytest.FixtureRequest) -> None:
    """DeepSpeed ZeRO-3 (overlap_comm, contiguous gradients, bf16 communication): loss falls; tokens/s per GPU.
    Not at --level quick (15 s of a 2-GPU quick run)."""
    _not_at_quick(cg, "DeepSpeed ZeRO-3 fine-tune", "DeepSpeed's engine")
    ok, why = zero3.available()
    # Not installed is a fact the record shows (its environment names every optional package installed); one that
    # is installed but does not import is a broken node, whose skip no complete run takes.
    if zero3.installed():
        cg.skip_unless_everywhere(ok, why, fact=None)
    else:
        cg.skip_unless_everywhere(ok, why, fact="package_missing", package="deepspeed")
    cfg = zero3.Config.for_level(cg.level, cg.device, model_path=_path(request, "finetune_model"),
                                 data_path=_path(request, "finetune_data"))
    cg.record_result(zero3.run(cfg))
