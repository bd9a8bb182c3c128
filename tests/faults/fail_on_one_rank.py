import os


def test_healthy_before() -> None:
    pass


def test_fails_on_last_rank() -> None:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    assert rank != world - 1, f"planted failure on rank {rank}"


def test_healthy_after() -> None:
    pass
