"""FSDP and ZeRO-3 full fine-tunes: the DeepSpeed config, and a tiny real run at world size 1."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from workloads.finetune import fsdp as fsdp_finetune
from workloads.finetune import zero3
from workloads.result import WorkloadError

TINY_FSDP = fsdp_finetune.Config(steps=8, train_samples=60)
TINY_ZERO3 = zero3.Config(steps=8, train_samples=60)


def test_deepspeed_config_is_the_proposed_zero3() -> None:
    config = zero3.ds_config(zero3.Config(batch_size=3), world_size=4, hidden=256)
    zero = config["zero_optimization"]
    assert zero["stage"] == 3 and zero["overlap_comm"] and zero["contiguous_gradients"]
    assert zero["reduce_bucket_size"] == 256 * 256 and zero["stage3_prefetch_bucket_size"] == int(0.9 * 256 * 256)
    assert config["communication_data_type"] == "bf16"
    assert config["optimizer"]["params"]["torch_adam"] is True  # no compiled DeepSpeed op needed
    assert config["train_batch_size"] == 12
    gpu = zero3.Config.for_level("standard", torch.device("cuda", 0))
    assert gpu.bf16 and gpu.communication_dtype == "bf16"


def test_deepspeed_absence_gives_a_skip_reason() -> None:
    ok, why = zero3.available()
    assert ok or "pip install 'clustergate[deepspeed]'" in why


def test_fsdp_full_finetune_runs_and_learns(gloo_world: None) -> None:
    result = fsdp_finetune.run(TINY_FSDP)
    assert result.metric("fsdp_loss_drop").value > 0.05
    assert result.metric("fsdp_tokens_per_s_per_gpu").value > 0
    details = result.details["fsdp"]
    assert details["wrapped_layers"] == TINY_FSDP.num_layers  # one FSDP unit per decoder layer


def test_fsdp_bad_model_path_is_named(gloo_world: None, tmp_path: Path) -> None:
    with pytest.raises(WorkloadError, match=f"model path {tmp_path / 'mistral'} does not exist"):
        fsdp_finetune.run(dataclasses.replace(TINY_FSDP, model_path=str(tmp_path / "mistral")))


def test_zero3_runs_and_learns(gloo_world: None) -> None:
    ok, why = zero3.available()
    if not ok:
        pytest.skip(why)
    result = zero3.run(TINY_ZERO3)
    assert result.metric("zero3_loss_drop").value > 0.05
    assert result.details["zero3"]["ds_config"]["zero_optimization"]["stage"] == 3
