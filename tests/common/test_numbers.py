"""One number formatter: a figure reads the same in a failure line, the terminal summary, the report's criteria
table and merge's reason for a node (pure functions)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from clustergate.cluster.node_runs import failed_tests
from clustergate.common.numbers import number, percent
from clustergate.criteria.criterion import Criterion
from clustergate.criteria.thresholds import Profile
from clustergate.record.judge import Record, Where, judge
from clustergate.record.outcomes import metric_block
from clustergate.report import html, model
from clustergate.report.summary import summary_lines

PACKAGE = Path(__file__).resolve().parents[2] / "clustergate"


@pytest.mark.parametrize(("value", "unit", "text"), [
    (12345.6, "", "12346"), (9999.7, "us", "10000 us"), (512.34, "TFLOPS", "512.3 TFLOPS"),
    (1e12, "B", "1000000000000 B"), (0.000012345, "", "1.234e-05"), (-3.25, "", "-3.25"), (700.0, "", "700"),
    (None, "GB/s", ""),
])
def test_four_significant_digits_whole_from_ten_thousand(value: float | None, unit: str, text: str) -> None:
    assert number(value, unit) == text


@pytest.mark.parametrize(("fraction", "signed", "text"), [
    (0.9, False, "90%"), (0.05, False, "5%"), (0.1234, False, "12.3%"), (-0.105, True, "-10.5%"), (0.2, True, "+20%"),
    (12.5, True, "+1250%"), (None, True, ""),
])
def test_percentages(fraction: float | None, signed: bool, text: str) -> None:
    assert percent(fraction, signed) == text


def test_a_missed_figure_reads_alike_in_every_text() -> None:
    """The failure line, the terminal summary, the report's criteria table and merge's reason for the node all say
    ``12346``; before one formatter, the report said ``1.235e+04``."""
    profile = Profile(name="p", description="", match=(), sign_off=True, settings={},
                      metrics={"latency_us": Criterion.of(max=9000.5, unit="us")}, source=Path("thresholds.yaml"))
    [judged] = judge([Record("latency_us", 12345.6, "us", "gpu", "", Where(0, "node-0", 0, 0, "SN0"))], profile)
    line = judged.failures[0]
    assert line == "latency_us=12346 us, expected <= 9000 [p, rank 0 node-0 gpu 0 serial SN0]"
    results = {"schema": 1, "verdict": "reject", "profile": "p", "world_size": 1,
               "nodes": [{"host": "node-0", "node_rank": 0, "ranks": [0],
                          "gpus": [{"index": 0, "serial": "SN0", "rank": 0}]}],
               "tests": [{"nodeid": "acceptance/t.py::test_latency", "outcome": "failed", "failed_ranks": [0],
                          "message": f"[call] {metric_block([line])}", "metrics": [judged.as_json()]}]}
    [row] = model.criteria_rows(results)
    assert (number(row.value, row.unit), row.criterion) == ("12346 us", "<= 9000")
    assert "12346 us" in html.criteria_table(results) and "1.235e+04" not in html.criteria_table(results)
    assert any("12346 us" in s and "<= 9000" in s for s in summary_lines(results))
    assert failed_tests(results)[0]["summary"] == "latency_us=12346 us (<= 9000) on gpu 0"


def test_no_other_number_format_in_the_package() -> None:
    """A figure, a bound or a percentage becomes text through clustergate.common.numbers alone (times and counts of
    seconds, ``{x:g} s``, are not figures)."""
    spec = re.compile(r":[+ ]?\.\d+[ge%]\}|:[+ ]?%\}")
    found = [f"{path.relative_to(PACKAGE)}:{i}: {line.strip()}" for path in sorted(PACKAGE.rglob("*.py"))
             if path.name != "numbers.py"
             for i, line in enumerate(path.read_text().splitlines(), 1) if spec.search(line)]
    assert found == []
