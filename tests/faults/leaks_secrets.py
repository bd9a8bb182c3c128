import json
import os
from pathlib import Path

import pytest

TOKEN = os.environ["NCCL_IB_AUTH_TOKEN"]
SAID = Path("planted-messages.json")
"""Secrets the harness wrote beside this file, in no variable: the test says them (a message, a log, details)."""


@pytest.mark.metrics("allreduce_busbw_gbps")
def test_leaks(cg) -> None:
    said = json.loads(SAID.read_text()) if SAID.exists() else []
    print(f"workload log: connecting with {TOKEN}")
    print("NCCL settings:", {k: v for k, v in sorted(os.environ.items()) if k.startswith("NCCL_")})
    print("workload log:", *said, sep="\n  ")
    cg.details["nccl_env"] = {"NCCL_IB_AUTH_TOKEN": TOKEN, "NCCL_DEBUG": "WARN"}
    cg.details["said"] = said
    cg.details["said_in_json_in_json"] = json.dumps(json.dumps({"log": said}))
    cg.record("allreduce_busbw_gbps", 1.0, "GB/s", scope="world")
    assert cg.rank != 1, (f"planted failure quoting {TOKEN} and https://ops:{os.environ['SITE_PASSWORD']}@example.org/x"
                          + "".join(f"\n  {s}" for s in said) + f"\n  as JSON: {json.dumps(said)}")
