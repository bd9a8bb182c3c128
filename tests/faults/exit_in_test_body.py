import os

import pytest
import torch
import torch.distributed as dist


def test_first() -> None:
    dist.all_reduce(torch.ones(4))


def test_leaves() -> None:
    if os.environ["RANK"] == "1":
        pytest.exit("planted: rank 1 leaves the run")


def test_after() -> None:
    dist.all_reduce(torch.ones(4))
