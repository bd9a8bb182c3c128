import os
from pathlib import Path


def test_blocks_junit() -> None:
    if os.environ["RANK"] == "0":
        (Path("report") / "junit.xml").mkdir()  # pytest's JUnit writer cannot write its file at the end
