"""The job itself: the world matches the profile, and a collective returns the exact answer.

These run first and prove the flow on CPU and GPU: if they fail, nothing after them means much.
"""

from __future__ import annotations

from clustergate.run.recorder import Recorder
from workloads.interconnect import collective_check


def test_world_matches_profile(cg: Recorder) -> None:
    """Ranks per node, devices per node, one distinct device per local rank."""
    everyone = cg.all_ranks(collective_check.inventory(cg.device))
    problems = collective_check.world_problems(everyone, cg.identities, cg.setting("gpus_per_node"))
    assert not problems, "\n".join(problems)


def test_allreduce_is_exact(cg: Recorder) -> None:
    """all_reduce of known integers gives the exact sum on every rank (correctness before speed)."""
    collective_check.run(collective_check.Config.for_level(cg.level, cg.device))
