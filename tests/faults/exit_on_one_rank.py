import os

import pytest


def test_leaves() -> None:
    if os.environ["RANK"] == "1":
        pytest.exit("planted: rank 1 leaves the run")  # rank 0 finds it gone at the test's exchange
