"""A criterion's table by node count (``by_nodes``): reading it, choosing the row of a job, the record naming the
row, and one clear error naming the file and key on a bad table."""

from __future__ import annotations

from pathlib import Path

import pytest

from clustergate.cluster.judged_by import problem
from clustergate.criteria.criterion import Criterion
from clustergate.criteria.thresholds import ThresholdsError, load
from clustergate.record.judge import Record, Where, judge
from clustergate.record.rejudge import rejudge

ROOT = Path(__file__).resolve().parents[2]

FILE = """{schema: 1, fallback_profile: generic, cpu_profile: cpu, profiles: {
  base: {match: [H100], settings: {gpus_per_node: 8},
         metrics: {allreduce_busbw_gbps: {min: 350, unit: GB/s, source: spec, by_nodes: TABLE}}},
  generic: {sign_off: false, metrics: {}}, cpu: {settings: {gpus_per_node: 0}}}}
"""
GOOD = "{2: {min: 380, source: {kind: published, note: 'two nodes'}}, 8: {min: 300}}"


def _load(tmp_path: Path, table: str):
    path = tmp_path / "thresholds.yaml"
    path.write_text(FILE.replace("TABLE", table))
    return path, load(path)


def test_the_row_of_the_largest_count_not_above_the_jobs_judges_it(tmp_path: Path) -> None:
    _, t = _load(tmp_path, GOOD)
    c = t.profile("base").metrics["allreduce_busbw_gbps"]
    assert [n for n, _ in c.by_nodes] == [2, 8]
    assert c.for_nodes(1).get("min") == 350 and c.for_nodes(1).row is None  # one node: the criterion's own keys
    assert c.for_nodes(2).get("min") == 380 and c.for_nodes(2).source.kind == "published"
    assert c.for_nodes(7).get("min") == 380 and c.for_nodes(7).row == 2
    row = c.for_nodes(16)
    assert row.get("min") == 300 and row.row == 8 and row.unit == "GB/s" and row.source.kind == "spec"
    assert row.as_json()["by_nodes_row"] == 8 and "by_nodes" not in row.as_json()
    assert "by node count: 2+ nodes: >= 380 (published); 8+ nodes: >= 300 (spec)" in c.describe()["criterion"]


def _records(nodes: int, value: float) -> list[Record]:
    return [Record("allreduce_busbw_gbps", value, "GB/s", "world", "", Where(rank=r, host=f"n{r}", node_rank=r))
            for r in range(nodes)]


def test_the_fabric_phase_is_judged_by_the_row_of_its_own_node_count(tmp_path: Path) -> None:
    _, t = _load(tmp_path, GOOD)
    profile = t.profile("base")
    (two,) = judge(_records(2, 360), profile)  # 360 passes the row-less 350, not the 2-node row's 380
    assert not two.passed and two.criterion["by_nodes_row"] == 2
    assert two.failures == ["allreduce_busbw_gbps=360 GB/s, expected >= 380 [base, whole job]"]
    (sixteen,) = judge(_records(16, 310), profile)
    assert sixteen.passed and sixteen.criterion["by_nodes_row"] == 8 and sixteen.criterion["min"] == 300
    (one,) = judge(_records(1, 340), profile)
    assert not one.passed and "by_nodes_row" not in one.criterion


@pytest.mark.parametrize(("table", "key", "problem"), [
    ("{}", "by_nodes", "must be a non-empty mapping of node count to criterion keys"),
    ("{'2': {min: 380}}", "by_nodes.2", "a node count must be a whole number >= 1, got '2' (quoted in YAML"),
    ("{two: {min: 380}}", "by_nodes.two", "a node count must be a whole number >= 1, got 'two'"),
    ("{0: {min: 380}}", "by_nodes.0", "a node count must be a whole number >= 1, got 0"),
    ("{2: 380}", "by_nodes.2", "must be a mapping of criterion keys"),
    ("{2: {minimum: 380}}", "by_nodes.2.minimum", "unknown key"),
    ("{2: {min: 380, max: 100}}", "by_nodes.2", "min 380 is above max 100"),
])
def test_a_bad_table_is_one_error_naming_the_file_and_key(tmp_path: Path, table: str, key: str, problem: str) -> None:
    path = tmp_path / "thresholds.yaml"
    path.write_text(FILE.replace("TABLE", table))
    with pytest.raises(ThresholdsError) as err:
        load(path)
    text = str(err.value)
    assert str(path) in text and f"allreduce_busbw_gbps.{key}" in text and problem in text, text
    assert "\n" not in text.strip()


def test_the_shipped_8_gpu_profiles_judge_the_job_wide_all_reduce_by_node_count() -> None:
    t = load(ROOT / "thresholds.yaml")
    for name in ("h100-sxm-80gb", "h200"):
        c = t.profile(name).metrics["allreduce_busbw_gbps"]
        assert [n for n, _ in c.by_nodes] == [2, 4, 8, 16]
        assert c.for_nodes(2).source.kind == "published" and "nccl-tests/issues/319" in c.for_nodes(2).source_text()
        assert all(row.source is not None for _, row in c.by_nodes)
    assert Criterion.of(min=1).for_nodes(64) == Criterion.of(min=1)  # no table: the criterion itself


def test_a_re_judged_record_takes_the_row_of_its_own_node_count(tmp_path: Path) -> None:
    """A world figure is kept once (the lowest rank's): the record's own node list says how many nodes the job had."""
    _, t = _load(tmp_path, GOOD)
    metric = {"name": "allreduce_busbw_gbps", "value": 360.0, "unit": "GB/s", "scope": "world",
              "per_rank": [{"rank": 0, "host": "n0", "node_rank": 0, "value": 360.0}]}
    results = {"nodes": [{"host": "n0", "node_rank": 0}, {"host": "n1", "node_rank": 1}],
               "tests": [{"nodeid": "acceptance/test_interconnect.py::x", "outcome": "passed", "message": "",
                          "metrics": [metric]}]}
    (test,) = rejudge(results, t.profile("base"))["tests"]
    assert test["outcome"] == "failed" and test["metrics"][0]["criterion"]["by_nodes_row"] == 2
    assert "expected >= 380" in test["message"]


def test_merge_holds_a_record_to_the_row_of_its_own_node_count(tmp_path: Path) -> None:
    """The criterion a run stored is its node count's row; merge and sign-off compare it with that row, not the
    whole table (else every 8-GPU run across nodes would read as an edited file)."""
    _, t = _load(tmp_path, GOOD)
    profile = t.profile("base")
    stored = profile.metrics["allreduce_busbw_gbps"].for_nodes(2).as_json()
    results = {"verdict": "accept", "profile": "base", "clustergate": {"thresholds_digest": profile.run_digest},
               "nodes": [{"host": "n0"}, {"host": "n1"}],
               "tests": [{"nodeid": "x", "metrics": [{"name": "allreduce_busbw_gbps", "criterion": stored}]}]}
    assert problem(results, t) is None
    results["nodes"] = results["nodes"][:1]
    assert "the file was edited after the run" in problem(results, t)
