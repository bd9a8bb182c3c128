import os


def test_everyone_has_this() -> None:
    pass


if os.environ.get("RANK") == "1":

    def test_only_rank_1_has_this() -> None:
        pass
