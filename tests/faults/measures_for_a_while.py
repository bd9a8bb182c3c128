import os
import time
from pathlib import Path

import torch


def test_first() -> None:
    pass


def test_measures() -> None:
    """A measurement of 20 s (a loop of timed work): the harness stops this rank a while in the middle of it."""
    Path(f"ready-{os.environ['RANK']}").write_text(str(os.getpid()))
    a = torch.randn(64, 64)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        a = torch.tanh(a @ a)
        time.sleep(0.01)


def test_after() -> None:
    pass
