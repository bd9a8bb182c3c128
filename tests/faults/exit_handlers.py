import atexit
import os
from pathlib import Path

import torch
import torch.distributed as dist


def test_leaves_work_for_the_exit_handlers(cg, tmp_path: Path) -> None:
    # pytest's numbered temporary directory is locked until its own exit handler unlocks it (then a later
    # run may prune it); this rank's own handler leaves a mark where the suite's test looks.
    (tmp_path / "scratch").write_text("x")
    marks = Path(os.environ["EXIT_HANDLER_MARKS"])
    atexit.register(lambda: (marks / f"rank-{dist.get_rank()}").touch())
    t = torch.ones(8)
    dist.all_reduce(t)
    assert t[0].item() == cg.world_size
