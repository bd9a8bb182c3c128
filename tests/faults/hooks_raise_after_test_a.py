import os


def pytest_runtest_logfinish(nodeid: str) -> None:
    if os.environ["RANK"] == "1" and nodeid.endswith("test_a"):
        raise RuntimeError("planted: rank 1 raises between tests")
