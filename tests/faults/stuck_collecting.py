import os
import time
from pathlib import Path

if os.environ["RANK"] == "1":  # rank 1 never finishes collecting this file
    Path("stuck-1").write_text(str(os.getpid()))
    time.sleep(3600)


def test_never_runs() -> None:
    pass
