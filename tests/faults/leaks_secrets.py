import os

import pytest

TOKEN = os.environ["NCCL_IB_AUTH_TOKEN"]


@pytest.mark.metrics("allreduce_busbw_gbps")
def test_leaks(cg) -> None:
    print(f"workload log: connecting with {TOKEN}")
    cg.details["nccl_env"] = {"NCCL_IB_AUTH_TOKEN": TOKEN, "NCCL_DEBUG": "WARN"}
    cg.record("allreduce_busbw_gbps", 1.0, "GB/s", scope="world")
    assert cg.rank != 1, f"planted failure quoting {TOKEN} and https://ops:{os.environ['SITE_PASSWORD']}@example.org/x"
