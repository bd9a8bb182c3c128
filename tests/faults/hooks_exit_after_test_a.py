import os


def pytest_runtest_logfinish(nodeid: str) -> None:
    if os.environ["RANK"] == "1" and nodeid.endswith("test_a"):
        os._exit(5)  # rank 1 leaves between test_a and test_b
