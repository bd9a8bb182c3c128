import os
import resource
import time
from pathlib import Path


def test_first() -> None:
    pass


def test_disk_fills() -> None:
    if os.environ["RANK"] == "0":
        Path("filled-at").write_text(str(time.time()))
        # From here on rank 0 cannot grow a file past 512 bytes: its writes fail (EFBIG) as on a full disk.
        resource.setrlimit(resource.RLIMIT_FSIZE, (512, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))


def test_after() -> None:
    pass
