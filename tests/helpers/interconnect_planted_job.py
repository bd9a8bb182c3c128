"""Run by tests/workloads/test_interconnect_data.py under torchrun: a planted wrong all_reduce result on rank 1."""

from __future__ import annotations

import os
from pathlib import Path

import torch.distributed as dist

from workloads.common import distributed
from workloads.interconnect import collectives
from workloads.result import WorkloadError

real = collectives._operation


def corrupting(cfg, comm, send, out):  # type: ignore[no-untyped-def]
    fn = real(cfg, comm, send, out)

    def wrapped() -> None:
        fn()
        if dist.get_rank() == 1:
            out.view(-1)[5] += 1  # the wire flipped a word

    return wrapped


collectives._operation = corrupting
with distributed() as here:
    cfg = collectives.Config(collective="all_reduce", scope="world", sizes=(4096, 16384), repeats=2, warmup=0)
    try:
        collectives.run(cfg)
        outcome = "passed"
    except WorkloadError as exc:
        outcome = f"WorkloadError: {exc}"
    Path(os.environ["OUT"], f"rank{here.rank}.txt").write_text(outcome)
