import os

import pytest
import torch
import torch.distributed as dist


@pytest.fixture
def model() -> int:
    if os.environ["RANK"] == "1":
        raise RuntimeError("planted: rank 1 cannot build the model")
    dist.all_reduce(torch.ones(4))  # rank 0 waits here for a rank that has left the fixture
    return 1


def test_uses_model(model: int) -> None:
    assert model == 1


def test_after() -> None:
    pass
