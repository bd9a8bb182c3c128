"""What the fine-tune workloads (lora, fsdp_finetune, zero3) share: models, data, loss curves.

A model is either built here from a config (no download) or loaded from a local Hugging Face
directory, checked to be a decoder-only LM of a family these workloads know. Data is packed
function-calling text (``function_calling_data``). Every setup step that can fail on one rank
runs through ``workloads.common.agree_on`` with ``SETUP_ERRORS``, so a bad path fails every rank
at once instead of leaving peers waiting in a collective.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from workloads.common import place
from workloads.finetune import data as fcd
from workloads.result import WorkloadError

ARCHITECTURES = ("qwen2", "qwen3", "llama", "mistral")
"""config.model_type values accepted for a local model: decoder-only LMs with q/k/v/o_proj layers."""


SETUP_ERRORS = (WorkloadError, fcd.DataFormatError, OSError, ValueError)
"""What a setup step (model, tokenizer, data) raises on a bad input: agreed across ranks (``agree_on``)."""


def records(data_path: str | None, train: int, held_out: int, seed: int) -> tuple[list[dict], list[dict]]:
    """(train, held-out) records: the head of a local Glaive JSONL, or generated from ``seed``."""
    if data_path is None:
        return fcd.generate(train, seed), fcd.generate(held_out, seed + 1)
    rows = fcd.read_jsonl(data_path, limit=held_out + train)
    if len(rows) <= held_out:
        raise fcd.DataFormatError(f"{data_path}: {len(rows)} records, need more than the {held_out} held out")
    return rows[held_out:], rows[:held_out]


def build_model(arch: str, vocab: int, hidden: int, layers: int, heads: int, seq_len: int, seed: int) -> Any:
    """A randomly initialised decoder-only LM from config: the same weights on every rank for ``seed``."""
    from transformers import AutoModelForCausalLM, MistralConfig, Qwen2Config

    kinds = {"qwen2": Qwen2Config, "mistral": MistralConfig}
    if arch not in kinds:
        raise ValueError(f"architecture {arch!r} is not one of {', '.join(kinds)}")
    torch.manual_seed(seed)
    config = kinds[arch](vocab_size=vocab, hidden_size=hidden, intermediate_size=3 * hidden, num_hidden_layers=layers,
                         num_attention_heads=heads, num_key_value_heads=max(1, heads // 2),
                         max_position_embeddings=seq_len, tie_word_embeddings=True)
    return AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")


def load_local(path_text: str, dtype: torch.dtype, *, gradient_checkpointing: bool = False) -> tuple[Any, Any]:
    """(model, fast tokenizer) from a local Hugging Face directory, files only; clear errors naming the path."""
    import transformers
    from packaging.version import Version
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    path = Path(path_text)
    if not path.is_dir():
        raise WorkloadError(f"model path {path} does not exist or is not a directory; give a local Hugging Face "
                            "model directory (config.json, weights, tokenizer), or leave it unset for the "
                            "built-in model")
    if not (path / "config.json").is_file():
        raise WorkloadError(f"model path {path} has no config.json: not a Hugging Face model directory")
    config = AutoConfig.from_pretrained(path, local_files_only=True)
    if config.model_type not in ARCHITECTURES:
        raise WorkloadError(f"model path {path} holds a {config.model_type!r} model; this workload needs a "
                            f"Qwen2/Llama-style causal LM (model_type one of {', '.join(ARCHITECTURES)})")
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    if not tokenizer.is_fast or tokenizer.eos_token_id is None:
        raise WorkloadError(f"model path {path}: the tokenizer must be a fast one (tokenizer.json: reply offsets) "
                            "with an end-of-text token (it separates packed records)")
    # transformers renamed torch_dtype to dtype in 4.56; an unknown keyword would be silently ignored.
    dtype_key = "dtype" if Version(transformers.__version__) >= Version("4.56") else "torch_dtype"
    model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, attn_implementation="sdpa",
                                                 **{dtype_key: dtype})
    if gradient_checkpointing:
        model.gradient_checkpointing_enable()
        model.enable_input_require_grads()  # frozen embeddings: checkpointed blocks still need a grad path
    return model, tokenizer


def built_in_tokenizer(train: list[dict]) -> Any:
    from workloads.finetune._tokenizer import build_tokenizer

    return build_tokenizer(fcd.text_and_spans(r)[0] for r in train)


def blocks(rows: list[dict], tokenizer: Any, seq_len: int, need_reply: bool) -> tuple[Any, Any]:
    """Packed (ids, assistant-mask) blocks; with ``need_reply`` only blocks holding a reply token
    (a block of system prompt alone has nothing to learn under reply-only loss: NaN)."""
    ids, assistant = fcd.pack(rows, tokenizer, seq_len)
    keep = assistant.any(dim=1) if need_reply else torch.ones(len(ids), dtype=torch.bool)
    if not keep.any():
        raise fcd.DataFormatError(f"no block of {seq_len} tokens holds an assistant reply; check the data")
    return ids[keep], assistant[keep]


def batches(ids: Any, labels: Any, batch: int, seed: int, device: torch.device) -> Iterator[tuple[Any, Any]]:
    """This rank's blocks (rank::world), reshuffled every epoch, the same order on every run."""
    here = place()
    mine = torch.arange(here.rank, len(ids), here.world_size)
    if len(mine) < batch:
        raise WorkloadError(f"rank {here.rank} has {len(mine)} blocks of data, fewer than batch_size={batch}: "
                            "give more train_samples or a smaller batch")
    epoch = 0
    while True:
        order = mine[torch.randperm(len(mine), generator=torch.Generator().manual_seed(seed * 1000 + epoch))]
        for i in range(0, len(order) - batch + 1, batch):
            pick = order[i:i + batch]
            yield ids[pick].to(device, non_blocking=True), labels[pick].to(device, non_blocking=True)
        epoch += 1


def world_curve(history: list[torch.Tensor], what: str, lr: float) -> list[float]:
    """Per-step losses averaged over ranks (one collective for the whole curve); finite or an error."""
    curve = torch.stack(history).double()
    dist.all_reduce(curve)
    values = (curve / dist.get_world_size()).tolist()
    if not all(math.isfinite(x) for x in values):
        raise WorkloadError(f"{what}: training loss is not finite (first values {values[:5]}); lower the learning "
                            f"rate (lr={lr}) or check the data")
    return values


def loss_drop(curve: list[float], window: int) -> tuple[float, float, float]:
    """(1 - late/early, early, late): mean loss over the first and the last ``window`` steps."""
    w = max(1, min(window, len(curve) // 2))
    early, late = sum(curve[:w]) / w, sum(curve[-w:]) / w
    return 1 - late / early, early, late


def autocast(device: torch.device) -> Any:
    """bf16 autocast on a GPU; nothing on the CPU (fp32 there: bf16 matmuls are slow on most CPUs)."""
    from contextlib import nullcontext

    return torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else nullcontext()


def oom_error(exc: BaseException, where: str, settings: str) -> WorkloadError:
    here = place()
    return WorkloadError(f"{where}: out of GPU memory on rank {here.rank} ({here.device}) with {settings}; lower the "
                         f"batch size or sequence length ({str(exc).splitlines()[0]})")


@torch.no_grad()
def eval_loss(model: Any, ids: Any, labels: Any, batch: int, device: torch.device) -> float:
    """Token-weighted loss over held-out blocks, shared out across ranks (rank::world) and summed.

    Ranks may run different numbers of forward passes (some none, on a large job): only for a
    model whose forward has no collective (DDP's inner module, not an FSDP/ZeRO-3 one).
    """
    here = place()
    was_training = model.training
    model.eval()
    sums = torch.zeros(2, dtype=torch.float64, device=device)
    mine = list(range(here.rank, len(ids), here.world_size))
    for i in range(0, len(mine), batch):
        pick = mine[i:i + batch]
        x, y = ids[pick].to(device), labels[pick].to(device)
        counted = (y[:, 1:] != -100).sum()
        with autocast(device):
            loss = model(input_ids=x, labels=y).loss
        if counted:
            sums += torch.stack([loss.double() * counted, counted.double()])
    dist.all_reduce(sums)
    model.train(was_training)
    if sums[1] == 0:
        raise WorkloadError("no held-out token carries a label: nothing to evaluate; give more eval samples")
    return float(sums[0] / sums[1])
