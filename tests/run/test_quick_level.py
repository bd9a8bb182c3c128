"""--level quick, the day-2 node check: what it shortens, and that the standard level is untouched.

The settings only (pure configs); the quick level's own run on CPU is timed by hand (docs/day-2.md,
"The quick level, timed") and on GPUs by the lead.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from workloads.finetune import fsdp, lora, zero3
from workloads.interconnect import pairs
from workloads.training import checkpoint, gpt

from torchrun_job import ROOT, run_job

GPU, CPU = torch.device("cuda", 0), torch.device("cpu")


def test_gpt_compiles_one_block_below_extended_and_the_whole_model_there() -> None:
    quick, standard = gpt.Config.for_level("quick", GPU), gpt.Config.for_level("standard", GPU)
    assert (quick.preset, quick.compile, quick.bf16) == ("gpt2-124m", "regional", True)
    assert standard.compile == "regional" and quick.steps < standard.steps
    assert gpt.Config.for_level("extended", GPU).compile == "model"
    assert gpt.Config.for_level("quick", CPU).compile == "off"
    assert gpt.Config.for_level("quick", GPU, "original").compile == "off"  # the original benchmark stays eager


def test_checkpoint_round_trip_uses_the_small_model_at_quick() -> None:
    assert checkpoint.Config.for_level("quick", GPU, "/tmp").preset == "tiny"
    assert checkpoint.Config.for_level("standard", GPU, "/tmp").preset == "gpt2-124m"


def test_fine_tunes_train_shorter_on_as_much_data_at_quick() -> None:
    for device in (GPU, CPU):
        q, s = lora.Config.for_level("quick", device), lora.Config.for_level("standard", device)
        assert q.steps < s.steps and q.pretrain_steps < s.pretrain_steps and q.train_samples == s.train_samples
    for workload in (fsdp, zero3):
        q, s = workload.Config.for_level("quick", GPU), workload.Config.for_level("standard", GPU)
        assert (q.steps, q.num_layers, s.steps, s.num_layers) == (20, 6, 30, 12)  # standard: 30, measured (full.py)
        assert q.train_samples == s.train_samples and q.seq_len == s.seq_len == 1024
    # A model the user gives keeps its validated recipe.
    assert fsdp.Config.for_level("quick", GPU, model_path="/m").steps == 30


def test_node_pair_rounds_are_fixed_per_level() -> None:
    rounds = {level: pairs.Config.for_level(level, GPU, kind="internode", max_bytes=1 << 30).rounds
              for level in ("quick", "standard", "extended")}
    assert rounds == {"quick": 2, "standard": 3, "extended": 5}
    assert pairs.Config.for_level("quick", CPU, kind="internode", max_bytes=1 << 30).rounds == 3


@pytest.mark.slow  # a torchrun job
def test_quick_leaves_out_the_fine_tunes_that_test_software_not_the_node(tmp_path: Path) -> None:
    r = run_job(tmp_path, [str(ROOT / "acceptance"), "--level", "quick", "-k", "finetune"], nproc=1,
                timeout=180)  # a hang guard: one CPU rank starts and skips three tests in 10-30 s
    skipped = {t["nodeid"].split("::")[1]: t for t in r.results["tests"]}
    assert set(skipped) == {"test_lora_finetune_learns", "test_fsdp_full_finetune", "test_zero3_finetune"}, r.output
    assert all(t["outcome"] == "skipped" and "day-2 node check" in t["message"] for t in skipped.values())


def test_the_acceptance_suite_imports_no_fine_tuning_stack() -> None:
    # A quick run collects every test module and runs no fine-tune: transformers, peft and DeepSpeed (1.2, 2.1
    # and more seconds of a rank's start on an H100 node) are imported inside the fine-tunes' runs alone.
    code = ("import sys, pathlib; import acceptance.conftest; "
            "[__import__('acceptance.' + p.stem) for p in pathlib.Path('acceptance').glob('test_*.py')]; "
            "print(sorted(m for m in ('transformers', 'peft', 'deepspeed') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]", out.stdout
