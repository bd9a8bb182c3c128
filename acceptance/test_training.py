"""Training: GPT throughput and MFU under DDP, scaling across nodes, the data split, checkpoints.

Tokens/s per GPU are counted after warm-up steps (median step); MFU = tokens/s x (6N + 12 L d T)
/ the profile's peak_bf16_tflops (docs/reference-figures.md). The model, data and optimizer are built here
from config: nothing is downloaded.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from clustergate.run.recorder import Recorder
from clustergate.trust import attestation
from workloads.compiled import Share
from workloads.result import Result
from workloads.training import checkpoint, gpt, sampler, scaling


def _peak(cg: Recorder) -> float | None:
    """The MFU denominator: the profile's datasheet peak on GPUs; None (a measured matmul) on CPU
    ranks, which train in fp32, and on GPU profiles without a peak."""
    return cg.setting("peak_bf16_tflops", None) if cg.device.type == "cuda" else None


@pytest.mark.metrics("train_tokens_per_s_per_gpu", "train_mfu", "train_local_tokens_per_s_per_gpu")
def test_gpt_throughput(cg: Recorder, shared_dir: str | None) -> None:
    """GPT-2 124M (seq 1024, bf16, compiled) under DDP on every GPU: tokens/s, MFU, stragglers. The kernels are
    compiled once for the fleet: loaded from the shared directory where a node compiled them for this key
    (workloads.compiled), the details' ``kernels`` say which."""
    share = Share(shared_dir, attestation.suite_digest())
    cg.record_result(gpt.run(gpt.Config.for_level(cg.level, cg.device, peak_tflops=_peak(cg)), share=share))


ORIGINAL_NAMES = {"train_tokens_per_s_per_gpu": "train_original_tokens_per_s_per_gpu",
                  "train_mfu": "train_original_mfu"}


@pytest.mark.metrics(*ORIGINAL_NAMES.values())
def test_gpt_original_settings(cg: Recorder) -> None:
    """The original benchmark's settings (seq 512, batch 8 per GPU, eager), for comparison with the
    figures of the original cluster documentation. GPUs: at --level extended only (it judges the
    software of the old benchmark, not the cluster). CPU ranks run it at every level (seconds)."""
    gpu = cg.device.type == "cuda"
    if gpu and cg.level != "extended":
        cg.skip("the original benchmark's settings run at --level extended", fact="below_level", level=cg.level)
    cfg = gpt.Config.for_level(cg.level, cg.device, "original" if gpu else "tiny", _peak(cg), compile="off")
    result = gpt.run(cfg)
    cg.record_result(Result(
        metrics=tuple(replace(m, name=ORIGINAL_NAMES[m.name]) for m in result.metrics if m.name in ORIGINAL_NAMES),
        details=result.details))


@pytest.mark.multinode
@pytest.mark.metrics("scaling_efficiency")
def test_scaling_efficiency(cg: Recorder) -> None:
    """Per-GPU throughput of the whole job over that of each node training alone."""
    cg.record_result(scaling.run(scaling.Config.for_level(cg.level, cg.device, _peak(cg))))


def test_sampler_gives_disjoint_shares(cg: Recorder) -> None:
    """DistributedSampler gives every rank its own samples: index sets gathered and compared."""
    cg.record_result(sampler.run(sampler.Config.for_level(cg.level, cg.device, cg.world_size)))


def test_checkpoint_round_trip(cg: Recorder, shared_dir: str | None, tmp_path: Path) -> None:
    """Model + optimizer saved sharded (torch.distributed.checkpoint), loaded on every rank, exact."""
    everyone = cg.all_ranks(shared_dir)
    if len(set(everyone)) > 1:
        pytest.fail(f"ranks name different shared directories ({sorted(set(map(str, everyone)))}); "
                    "pass --shared-dir (or set CLUSTERGATE_SHARED_DIR) alike on every node", pytrace=False)
    nodes = len({ident["node_rank"] for ident in cg.identities})
    if everyone[0] is None and nodes > 1:
        cg.skip(f"a checkpoint across {nodes} nodes needs a directory every node mounts: pass --shared-dir, "
                "set CLUSTERGATE_SHARED_DIR or settings.shared_dir in the profile", fact="no_shared_dir")
    # pytest's tmp_path differs per process; rank 0's serves every rank of a one-node job.
    directory = everyone[0] or cg.all_ranks(str(tmp_path))[0]
    cg.record_result(checkpoint.run(checkpoint.Config.for_level(cg.level, cg.device, directory)))
