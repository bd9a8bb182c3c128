"""Fixtures shared by the suite's own tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist

from workloads.common import ensure_distributed

pytest_plugins = ["pytester"]


@pytest.fixture
def gloo_world(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A one-rank gloo default group in this process, as the plugin (or ensure_distributed() outside
    torchrun) gives the workloads on CPU."""
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    torch.set_num_threads(1)  # the fine-tune tests compare figures bit for bit
    ensure_distributed()
    yield
    dist.destroy_process_group()
