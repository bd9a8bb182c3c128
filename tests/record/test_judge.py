"""Judging gathered metrics, merging phase outcomes across ranks, what poisons a run (pure logic)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from clustergate.criteria.criterion import Criterion
from clustergate.criteria.thresholds import Profile
from clustergate.record.judge import Record, Where, judge, warnings
from clustergate.record.outcomes import PhaseOutcome, merge, poisons
from workloads.result import Metric, WorkloadError


def profile(**metrics: Criterion) -> Profile:
    return Profile(name="test", description="", match=(), sign_off=True, settings={}, metrics=metrics,
                   source=Path("thresholds.yaml"))


def rec(value: float, rank: int = 0, node: int = 0, name: str = "tflops", scope: str = "gpu", unit: str = "TFLOPS",
        serial: str | None = "SN0") -> Record:
    return Record(name, value, unit, scope, "", Where(rank, f"node{node}", node, rank % 8, serial, None))


def test_min_failure_names_value_criterion_profile_and_gpu() -> None:
    [j] = judge([rec(720, 0), rec(512.3, 1, serial="1650")], profile(tflops=Criterion.of(min=700)))
    assert not j.passed
    assert j.value == 512.3  # the worst figure stands for the metric
    assert j.failures == ["tflops=512.3 TFLOPS, expected >= 700 [test, rank 1 node0 gpu 1 serial 1650]"]
    assert [p["passed"] for p in j.per_rank] == [True, False]


def test_max_ceiling_and_unit() -> None:
    p = profile(lat=Criterion.of(max=50), bw=Criterion.of(min=1, ceiling=480), u=Criterion.of(unit="GB/s"))
    results = {j.name: j for j in judge([
        rec(60, name="lat", unit="us"), rec(500, name="bw"), rec(3, name="u", unit="Gb/s")], p)}
    assert "expected <= 50" in results["lat"].failures[0]
    assert "above the physical ceiling 480" in results["bw"].failures[0]
    assert "recorded in 'Gb/s', the profile expects 'GB/s'" in results["u"].failures[0]


def test_outlier_against_node_median_even_above_minimum() -> None:
    values = [800, 801, 799, 802, 800, 798, 803, 650]
    records = [rec(v, rank) for rank, v in enumerate(values)]
    [j] = judge(records, profile(tflops=Criterion.of(min=600, outlier_fraction=0.9)))
    assert len(j.failures) == 1
    assert "rank 7" in j.failures[0] and "below 90% of the node median" in j.failures[0]


def test_node_and_world_scopes_keep_one_record_each() -> None:
    records = [rec(5, r, node=r // 2, name="nb", scope="node") for r in range(4)]
    records += [rec(7, r, name="wb", scope="world") for r in range(4)]
    by = {j.name: j for j in judge(records, profile(nb=Criterion.of(min=1), wb=Criterion.of(min=1)))}
    assert [p["rank"] for p in by["nb"].per_rank] == [0, 2]
    assert [p["rank"] for p in by["wb"].per_rank] == [0]


def test_metric_missing_from_profile_fails_naming_the_key() -> None:
    [j] = judge([rec(1, name="mystery")], profile())
    assert not j.passed and "has no metrics.mystery" in j.failures[0]


def test_empty_criterion_measures_without_judging() -> None:
    [j] = judge([rec(1.0), rec(3.0, 1), rec(2.0, 2)], profile(tflops=Criterion()))
    assert j.passed and j.value == 2.0


def outcome(rank: int, kind: str, message: str = "", stop: float = 0.0,
            records: list[Record] | None = None, poisoned: bool = False, said: str = "") -> PhaseOutcome:
    return PhaseOutcome(rank=rank, host=f"h{rank}", outcome=kind, message=message, stop=stop, records=records or [],
                        poisoned=poisoned, said=said)


def test_failure_on_one_rank_fails_everywhere_earliest_first() -> None:
    v = merge([outcome(0, "failed", "late", 2.0), outcome(1, "passed"), outcome(2, "failed", "early", 1.0)],
              profile(), "call", ())
    assert v.outcome == "failed" and v.failed_ranks == [2, 0]
    assert v.message.startswith("failed on 2/3 ranks: 2, 0")
    assert v.message.index("early") < v.message.index("late")


def test_mixed_pass_and_skip_is_a_failure() -> None:
    skip = outcome(1, "skipped", "('t.py', 3, 'Skipped: no GPU')", said="no GPU")
    v = merge([outcome(0, "passed"), skip], profile(), "call", ())
    assert v.outcome == "failed" and "mixed outcomes" in v.message and "\nrank 1: no GPU" in v.message


def test_declared_metric_not_recorded_fails() -> None:
    v = merge([outcome(0, "passed")], profile(tflops=Criterion.of(min=1)), "call", ("tflops",))
    assert v.outcome == "failed" and "declared metrics never recorded: tflops" in v.message


def test_metric_failure_fails_a_passing_test_and_names_the_rank() -> None:
    p = profile(tflops=Criterion.of(min=700))
    v = merge([outcome(0, "passed", records=[rec(800, 0)]), outcome(1, "passed", records=[rec(100, 1)])],
              p, "call", ("tflops",))
    assert v.outcome == "failed" and v.failed_ranks == [1]
    assert "1 metric check failed" in v.message


def test_a_rank_that_lost_a_collective_poisons_the_session() -> None:
    """The flag comes from the rank that raised; words in other ranks' messages decide nothing."""
    msg = "RuntimeError: [gloo] Timed out waiting 30000ms for recv operation to complete"
    assert merge([outcome(0, "failed", msg, poisoned=True), outcome(1, "failed", "ValueError")], profile(), "call",
                 ()).poisoned
    assert not merge([outcome(0, "failed", "AssertionError: timed out waiting for the fan")], profile(), "call",
                     ()).poisoned


def test_poisons_is_decided_from_the_exception_and_its_causes() -> None:
    import torch.distributed as dist

    gloo = RuntimeError("[third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer [10.0.0.2]:1161")
    assert poisons(gloo)
    assert poisons(RuntimeError("[gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 3000ms for recv"))
    assert poisons(dist.DistBackendError("NCCL error: unhandled system error"))
    assert poisons(dist.DistStoreError("wait timeout"))
    try:  # a workload that wraps the lost collective in its own error
        try:
            raise gloo
        except RuntimeError as exc:
            raise WorkloadError("all_reduce failed") from exc
    except WorkloadError as wrapped:
        assert poisons(wrapped)
    assert not poisons(WorkloadError("the token file is not visible: timed out after 30 s"))  # a finding
    assert not poisons(AssertionError("Timed out"))
    assert not poisons(ValueError("planted"))
    assert not poisons(None)


def test_each_rank_records_each_figure_once() -> None:
    p = profile(tflops=Criterion.of(min=1))
    twice = merge([outcome(0, "passed", records=[rec(5, 0), rec(6, 0)]), outcome(1, "passed", records=[rec(5, 1)])],
                  p, "call", ("tflops",))
    assert twice.outcome == "failed" and twice.failed_ranks == [0]
    assert "tflops recorded 2 times on rank 0: an error in the test" in twice.message
    missing = merge([outcome(0, "passed", records=[rec(5, 0)]), outcome(1, "passed"), outcome(2, "passed")],
                    p, "call", ("tflops",))
    assert missing.outcome == "failed" and missing.failed_ranks == [1, 2]
    assert "per-GPU metric tflops not recorded on 2 of the 3 ranks that ran the test: rank 1 (h1), rank 2 (h2)" \
        in missing.message
    assert missing.problems and not missing.metrics[0].failures  # a record problem, not a missed criterion
    node = merge([outcome(0, "passed", records=[rec(5, 0, scope="node")]), outcome(1, "passed")], p, "call",
                 ("tflops",))
    assert node.outcome == "passed"  # a node's figure comes from one rank of the node


def test_a_figure_that_is_not_a_finite_number_is_refused_where_it_is_recorded() -> None:
    for bad in (math.nan, math.inf, -math.inf):
        with pytest.raises(ValueError, match=r"metric x: value is (nan|inf|-inf); a workload must fail with the "
                                             "reason instead of recording a figure that is not a finite number"):
            Metric("x", bad, "GB/s")


def test_metric_problems_and_message_are_kept_apart() -> None:
    p = profile(tflops=Criterion.of(min=700))
    v = merge([outcome(0, "failed", "boom", records=[rec(100, 0)]), outcome(1, "passed", records=[rec(800, 1)])],
              p, "call", ("tflops",))
    assert v.problems[0] == "failed on 1/2 ranks: 0" and "boom" in v.problems
    assert v.message == "\n".join(v.problems) + "\n1 metric check failed:\n  tflops=100 TFLOPS, expected >= 700 " \
        "[test, rank 0 node0 gpu 0 serial SN0]"


def test_a_missed_warn_criterion_passes_and_is_listed_as_a_warning() -> None:
    p = profile(tflops=Criterion.of(min=700, severity="warn", source="estimate"))
    [j] = judge([rec(720, 0), rec(650, 1, serial="SN1")], p)
    assert j.passed and not j.failures
    assert j.warnings == ["tflops=650 TFLOPS, expected >= 700 [test, rank 1 node0 gpu 1 serial SN1]"]
    out = j.as_json()
    assert out["warned"] and [r["warned"] for r in out["per_rank"]] == [False, True]
    assert [r["passed"] for r in out["per_rank"]] == [True, True]
    v = merge([outcome(0, "passed", records=[rec(720, 0)]), outcome(1, "passed", records=[rec(650, 1)])], p,
              "call", ("tflops",))
    assert v.outcome == "passed" and v.message == ""
    listed = warnings([{"nodeid": "t::x", "metrics": [out]}])
    assert listed == [{"test": "t::x", "metric": "tflops", "value": 650, "criterion": ">= 700",
                       "where": "rank 1 node0 gpu 1 serial SN1"}]
