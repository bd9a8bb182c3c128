"""Correctness before speed: exact integer data, emulated collectives, and planted wrong results."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from workloads.interconnect._data import EXACT, amplitude, expected, inputs, make_tile, mismatch
from workloads.result import WorkloadError

ROOT = Path(__file__).resolve().parents[2]
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def emulate(collective: str, sends: list[torch.Tensor], outs: list[torch.Tensor], n: int) -> None:
    """What a correct collective leaves in every rank's output; sums accumulate in the dtype, rank by rank,
    as a ring does (every partial sum must be exact)."""
    if collective in ("all_reduce", "reduce_scatter"):
        total = sends[0].clone()
        for s in sends[1:]:
            total += s
        for r in range(n):
            if collective == "all_reduce":
                outs[r].copy_(total)
            else:
                outs[r].copy_(total.view(n, -1)[r])
    elif collective == "all_gather":
        for r in range(n):
            outs[r].copy_(torch.cat(sends))
    elif collective == "all_to_all":
        for r in range(n):
            outs[r].copy_(torch.cat([sends[s].view(n, -1)[r] for s in range(n)]))
    elif collective == "broadcast":
        for r in range(n):
            outs[r].copy_(sends[0])
    else:  # sendrecv ring shift
        for r in range(n):
            outs[r].copy_(sends[(r - 1) % n])


COLLS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "sendrecv")


@pytest.mark.parametrize("collective", COLLS)
@pytest.mark.parametrize(("dtype", "n"), [("fp32", 2), ("fp32", 7), ("bf16", 2), ("bf16", 16)])
def test_a_correct_collective_passes_and_one_wrong_element_is_caught(collective: str, dtype: str, n: int) -> None:
    tile, unit = 64, 256
    base = make_tile(tile, amplitude(collective, dtype, n), seed=7)
    pairs = [inputs(collective, base, n, r, unit, DTYPES[dtype], torch.device("cpu")) for r in range(n)]
    sends = [s.clone() for s, _ in pairs]
    outs = [o for _, o in pairs]
    for r in range(n):
        if not (collective == "broadcast" and r == 0):  # the root's own buffer is already the answer
            assert mismatch(outs[r], expected(collective, base, n, r)) is not None, "an untouched output passed"
    emulate(collective, sends, outs, n)
    for r in range(n):
        assert mismatch(outs[r], expected(collective, base, n, r)) is None
    outs[n - 1].view(-1)[37] += 1  # a planted wrong sum (or a flipped word on the wire)
    problem = mismatch(outs[n - 1], expected(collective, base, n, n - 1))
    assert problem is not None and problem.startswith(f"1 of {outs[n - 1].numel()} elements wrong, first at element 37")


def test_data_is_random_never_zero_and_differs_between_ranks() -> None:
    base = make_tile(4096, amplitude("all_reduce", "fp32", 8), seed=1)
    assert bool((base != 0).all()) and base.abs().max() <= EXACT["fp32"] // 8 and len(set(base.tolist())) > 1000
    a, _ = inputs("all_reduce", base, 8, 0, 8192, torch.float32, torch.device("cpu"))
    b, _ = inputs("all_reduce", base, 8, 1, 8192, torch.float32, torch.device("cpu"))
    assert not torch.equal(a, b)


def test_bf16_sums_stay_exact_at_the_amplitude_bound() -> None:
    n = 32
    amp = amplitude("all_reduce", "bf16", n)
    assert amp == EXACT["bf16"] // n
    worst = torch.full((4,), float(amp), dtype=torch.bfloat16)
    total = worst.clone()
    for _ in range(n - 1):
        total += worst
    assert total.tolist() == [float(amp * n)] * 4
    with pytest.raises(WorkloadError, match="use fp32"):
        amplitude("reduce_scatter", "bf16", 512)


def test_a_no_op_broadcast_is_caught() -> None:
    base = make_tile(64, 100, seed=3)
    send, _ = inputs("broadcast", base, 4, 2, 128, torch.float32, torch.device("cpu"))
    assert mismatch(send, expected("broadcast", base, 4, 2)) is not None


@pytest.mark.slow
def test_a_wrong_sum_on_one_rank_fails_every_rank_alike(tmp_path: Path) -> None:
    """Under torchrun on gloo: rank 1's all_reduce result is corrupted after the collective; both ranks must
    raise the same WorkloadError (after agreeing), naming rank 1, and none may hang."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RANK", "LOCAL_RANK", "WORLD_SIZE"))}
    env.update(PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="", OUT=str(tmp_path))
    job = ROOT / "tests" / "helpers" / "interconnect_planted_job.py"
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                           str(job)], env=env, capture_output=True, text=True, timeout=120)
    outs = sorted(tmp_path.glob("rank*.txt"))
    assert len(outs) == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    texts = [p.read_text() for p in outs]
    assert texts[0] == texts[1]
    assert texts[0].startswith("WorkloadError: all_reduce (world): correctness at 4096 B failed on 1/2 ranks:\n"
                               f"  node 0 ({socket.gethostname()}) rank 1: ")
    assert "1 of 1024 elements wrong" in texts[0]
