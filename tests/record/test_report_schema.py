"""results.json against clustergate/results.schema.json, from real runs; and when the report is drawn."""

from __future__ import annotations

import html
from pathlib import Path

import pytest
from report_runs import demo_baseline, demo_reject, no_tests_run, results, schema_errors  # noqa: F401
from trust_runs import node_run, recorded  # noqa: F401

from clustergate.common.exit_codes import Exit


def test_shipped_acceptance_run_matches_the_schema(node_run: Path) -> None:  # noqa: F811
    data = recorded(node_run)
    assert (node_run.parents[3] / "status").read_text() == "0", (node_run.parents[3] / "output.txt").read_text()
    assert schema_errors(data) == []
    assert data["verdict"] == "accept"
    assert (node_run / "report.html").stat().st_size > 10_000
    # the run's longest wait in a collective of a test, far under the bound past which a live peer is named stuck
    assert data["liveness"]["longest_wait_s"] < data["liveness"]["bound_s"] / 3, data["liveness"]
    # the start's breakdown is in the record itself: from the launcher's start, in order, to the session
    steps = [s["step"] for s in data["startup"]]
    assert steps[:3] == ["launcher", "rank process", "imports"] and steps[-1] == "session", data["startup"]
    assert [s["at"] for s in data["startup"]] == sorted(s["at"] for s in data["startup"])


@pytest.mark.slow  # a torchrun job (shared by the report tests)
def test_demo_runs_match_the_schema(demo_reject: Path, demo_baseline: Path) -> None:  # noqa: F811
    for run in (demo_reject, demo_baseline):
        assert schema_errors(results(run)) == [], (run / "output.txt").read_text()[-3000:]


def test_schema_rejects_what_is_not_a_results_file(node_run: Path) -> None:  # noqa: F811
    data = recorded(node_run)
    broken = {**data, "verdict": "maybe"}
    del broken["tests"]
    errors = schema_errors(broken)
    assert any("verdict" in e for e in errors) and any("tests" in e for e in errors)
    bad_metric = {**data, "tests": [{"nodeid": "x", "outcome": "passed", "duration_s": 0, "failed_ranks": [],
                                     "message": "", "metrics": [{"name": "m", "value": "fast", "unit": "",
                                                                 "scope": "rack", "criterion": {}, "passed": True}]}]}
    assert len(schema_errors(bad_metric)) == 2


def test_report_is_drawn_after_the_verdict_is_final(no_tests_run: Path) -> None:  # noqa: F811
    """The plugin sets why nothing ran (-k deselected everything) in its trylast sessionfinish; pytest-html's
    summary must see it."""
    data = results(no_tests_run)
    assert (no_tests_run / "status").read_text() == str(int(Exit.NOT_ACCEPTED))  # pytest's 5 never leaves a run
    assert data["verdict"] == "reject" and "deselected by -k/-m: nothing ran" in data["error"]
    assert schema_errors(data) == []
    page = (no_tests_run / "report" / "report.html").read_text()
    banner = page[page.index('id="cg-verdict"'):page.index('class="cg-facts"')]
    assert "REJECT" in banner and "collected tests were deselected by -k/-m" in banner


@pytest.mark.slow  # a torchrun job (shared by the report tests)
def test_baseline_lands_in_results_json(demo_baseline: Path) -> None:  # noqa: F811
    """Written in this module's sessionfinish, before the plugin's trylast one writes results.json."""
    base = results(demo_baseline)["baseline"]
    assert base["tolerance"] == 0.05 and base["flagged"] > 0
    assert base["source"].endswith("results.json")


def test_a_row_names_its_failed_ranks_with_their_hosts(demo_reject: Path) -> None:  # noqa: F811
    """The report's extra columns: the failed ranks of a test with their hosts (read from the record only where a
    rank failed), the count of its metrics that failed."""
    data = results(demo_reject)
    page = html.unescape((demo_reject / "report" / "report.html").read_text()).replace('\\"', '"')
    [failed] = [t for t in data["tests"] if t["nodeid"].endswith("test_demo_gpu_figures")]
    host = data["nodes"][0]["host"]
    assert failed["failed_ranks"] == [1] and f'<td class="col-failedranks">1 ({host})</td>' in page
    assert '<td class="col-metrics">1 of 2 fail</td>' in page and page.count('<td class="col-failedranks"></td>') == 3
