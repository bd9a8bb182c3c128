"""The ``cg`` fixture: what an acceptance test sees of the run.

A test measures on every rank and records what it measured:

    @pytest.mark.metrics("matmul_bf16_tflops")
    def test_matmul_bf16(cg):
        cg.record_result(matmul.run(matmul.Config.for_level(cg.level, cg.device)))

The plugin gathers every rank's records after the test body, judges them on rank 0 against the
profile, and fails the test on every rank if any figure misses its criterion.

A test that does not apply skips through ``cg.skip(reason, fact=...)`` (or ``skip_unless_everywhere``), naming
the fact it rests on (``clustergate.trust.skip_facts``): the run records the fact with the test, and a skip on no
fact, or on one the manifest or the record does not bear out, makes the run partial
(``clustergate.trust.completeness``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pytest
import torch

from clustergate.criteria.thresholds import REQUIRED
from clustergate.record.judge import Record
from clustergate.run.ranks import control
from clustergate.trust.skip_facts import fact as skip_fact
from workloads.result import Metric, Result, Scope

if TYPE_CHECKING:
    from clustergate.criteria.thresholds import Profile
    from clustergate.run.lifecycle import Run


class Skip(pytest.skip.Exception):
    """A skip that carries the fact it rests on (``{"fact": NAME, ...}``, or None: a skip no complete run takes), as
    data: the run records it beside the reason and never reads the reason again."""

    def __init__(self, reason: str, fact: dict[str, Any] | None) -> None:
        super().__init__(reason)
        self.fact = fact


def fact_of(exc: BaseException | None) -> dict[str, Any] | None:
    """The fact a skip exception carries (None for any other, and for pytest's own skips)."""
    return getattr(exc, "fact", None) if isinstance(exc, Skip) else None


@dataclass(slots=True)
class Recorder:
    """Per-test handle, one per rank. Public attributes are the test's view of the run."""

    run: Run
    nodeid: str
    declared: tuple[str, ...]
    records: list[Record] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def level(self) -> str:
        """quick | standard | extended: how long and how large the workloads run."""
        return self.run.level

    @property
    def device(self) -> torch.device:
        return self.run.world.device

    @property
    def rank(self) -> int:
        return self.run.world.rank

    @property
    def world_size(self) -> int:
        return self.run.world.world_size

    @property
    def profile_name(self) -> str:
        return self.run.profile.name

    @property
    def profile(self) -> Profile:
        """The profile the run judges against (its criteria, settings and ``expect`` section)."""
        return self.run.profile

    @property
    def identities(self) -> list[dict[str, Any]]:
        """Every rank's identity (host, node_rank, local_rank, gpu), in rank order."""
        return self.run.identities

    def setting(self, name: str, default: Any = REQUIRED) -> Any:
        """A profile setting (``gpus_per_node``, ``peak_bf16_tflops``, ...): ``default`` when given and
        the profile lacks it, else a clear error naming the file, profile and key."""
        return self.run.profile.setting(name, default)

    def record(self, name: str, value: float, unit: str, *, scope: Scope = "gpu", description: str = "") -> None:
        """Record one figure measured on this rank; judged after the test body on every rank."""
        self.record_metric(Metric(name=name, value=float(value), unit=unit, scope=scope, description=description))

    def record_metric(self, metric: Metric) -> None:
        if metric.name not in self.declared:
            raise pytest.UsageError(
                f"{self.nodeid} records {metric.name!r} but does not declare it; add "
                f"@pytest.mark.metrics({metric.name!r}) so the profile is checked before the run"
            )
        self.records.append(Record(metric.name, metric.value, metric.unit, metric.scope, metric.description,
                                   self.run.where))

    def record_result(self, result: Result) -> None:
        """Record every metric of a workload's result, and keep its details for the report."""
        for metric in result.metrics:
            self.record_metric(metric)
        self.details.update(result.details)

    def add_run_section(self, name: str, data: Any) -> None:
        """A top-level section of results.json (e.g. "discovery"); rank 0's data is kept."""
        self.run.add_section(name, data)

    def all_ranks(self, value: Any) -> list[Any]:
        """Every rank's ``value`` on every rank (over the control group, not the workloads' group)."""
        return control.all_gather(self.run.world, value, f"{self.nodeid}: all_ranks")

    def skip(self, reason: str, *, fact: str | None, **params: Any) -> None:
        """Skip this test saying ``reason``, on the recorded ``fact`` (``clustergate.trust.skip_facts.FACTS``, with its
        parameters); ``fact=None`` for a skip no complete run takes (what should have run before did not)."""
        raise Skip(reason, skip_fact(fact, **params) if fact is not None else None)

    def skip_unless_everywhere(self, ok: bool, reason: str, *, fact: str | None, **params: Any) -> None:
        """Skip on every rank, on ``fact``, if the condition fails on any rank: skips must not differ by rank."""
        votes = self.all_ranks((ok, reason, self.run.identity.host))
        bad = [(r, why, host) for r, (fine, why, host) in enumerate(votes) if not fine]
        if bad:
            rank, why, host = bad[0]
            self.skip(f"{why} (on {len(bad)}/{len(votes)} ranks, first rank {rank} on {host})", fact=fact, **params)
