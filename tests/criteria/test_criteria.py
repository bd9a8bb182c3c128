"""Criteria: each kind of bound parsed, range-checked, judged and described in one place (pure logic)."""

from __future__ import annotations

import datetime as dt

import pytest

from clustergate.criteria.criterion import BOUNDS, KEYS, Criterion, CriterionError, Figure


def figures(*values: float, node: int = 0, unit: str = "TFLOPS") -> list[Figure]:
    return [Figure(v, unit, node) for v in values]


def test_each_bound_says_how_a_figure_misses_it() -> None:
    c = Criterion.of(min=700, max=900, ceiling=989, unit="TFLOPS")
    assert c.judge(figures(800, 650, 950, 1000), "world") == [
        [], ["expected >= 700"], ["expected <= 900"],
        ["above the physical ceiling 989: a measurement error, not a result", "expected <= 900"]]
    assert c.judge([Figure(800, "GFLOPS", 0)], "world") == [["recorded in 'GFLOPS', the profile expects 'TFLOPS'"]]


def test_outlier_fraction_judges_a_gpu_against_its_node_and_the_cluster() -> None:
    c = Criterion.of(outlier_fraction=0.9)
    node0 = figures(800, 801, 799, 650, node=0)
    node1 = figures(500, 500, 500, 500, node=1)
    problems = c.judge(node0 + node1, "gpu")
    assert problems[3] == ["below 90% of the node median 799.5"]
    assert problems[4] == ["below 90% of the cluster median 575"]  # a whole slow node shows against the cluster
    assert problems[0] == []
    assert c.judge(figures(650), "gpu") == [[]]  # alone: no peers, nothing to compare


def test_a_node_figure_is_judged_against_every_node_of_the_run() -> None:
    c = Criterion.of(outlier_fraction=0.9)
    nodes = [Figure(370, "GB/s", 0), Figure(368, "GB/s", 1), Figure(222, "GB/s", 2)]
    assert c.judge(nodes, "node") == [[], [], ["below 90% of the cluster median 368"]]
    assert c.judge(nodes[:1], "node") == [[]]  # one node: no peers
    assert c.judge(nodes, "world") == [[], [], []]  # the job's one figure has none


def test_outlier_multiple_judges_a_lower_is_better_figure_against_its_peers() -> None:
    c = Criterion.of(outlier_multiple=1.5, unit="us")
    nodes = [Figure(9.0, "us", 0), Figure(9.5, "us", 1), Figure(20.0, "us", 2)]
    assert c.judge(nodes, "node") == [[], [], ["above 1.5x the cluster median 9.5"]]
    assert c.text() == "<= 1.5x peers' median" and c.higher_is_better is False
    assert (c.peer_floor(10.0), c.peer_limit(10.0)) == (None, 15.0)
    assert c.peer_misses(16.0, 10.0, "fleet") == ["above 1.5x the fleet median 10"]
    assert Criterion.of(outlier_fraction=0.9).peer_misses(8.0, 10.0, "fleet") == ["below 90% of the fleet median 10"]
    assert Criterion.of(min=5).peer_misses(1.0, 10.0, "fleet") == []  # an absolute bound is not a peer bound


def test_a_peers_source_bounds_nothing_but_peers() -> None:
    c = Criterion.of(outlier_fraction=0.9, ceiling=480, source="peers")
    assert c.source is not None and c.source.kind == "peers" and c.judges_peers
    for raw, message in (
        ({"min": 250, "outlier_fraction": 0.9, "source": "peers"},
         "c.source: peers judges against the part's peers only, but the criterion sets min"),
        ({"ceiling": 480, "source": "peers"}, "c.source: peers, but the criterion has no outlier_fraction or "
                                               "outlier_multiple"),
        ({"min": 1, "source": "published"}, "c.source: published needs note"),
    ):
        with pytest.raises(CriterionError) as err:
            Criterion.parse(raw, "c")
        assert str(err.value).startswith(message), (raw, str(err.value))


def test_parse_refuses_what_no_figure_can_meet() -> None:
    for raw, message in (
        ({"min": 9, "max": 1}, "c: min 9 is above max 1: no figure can pass"),
        ({"min": 700, "ceiling": 600}, "c: min 700 is above ceiling 600"),
        ({"outlier_fraction": 0}, "c.outlier_fraction: must lie in (0, 1], got 0"),
        ({"outlier_fraction": 1.2}, "c.outlier_fraction: must lie in (0, 1], got 1.2"),
        ({"outlier_multiple": 1}, "c.outlier_multiple: must lie in (1, 100], got 1"),
        ({"min": float("inf")}, "c.min: must be a finite number, got inf"),
        ({"min": True}, "c.min: must be a finite number, got True"),
        ({"minimum": 1}, "c.minimum: unknown key; a criterion takes min, max, ceiling"),
        ({"unit": 3}, "c.unit: must be a string, got 3"),
        ([1, 2], "c: must be a mapping of min, max"),
    ):
        with pytest.raises(CriterionError) as err:
            Criterion.parse(raw, "c")
        assert str(err.value).startswith(message), (raw, str(err.value))
    assert Criterion.of(outlier_fraction=1).get("outlier_fraction") == 1.0  # the whole median is allowed
    assert Criterion.parse(None, "c") == Criterion()


def test_description_margin_and_direction() -> None:
    c = Criterion.of(min=700, ceiling=989, outlier_fraction=0.9)
    assert c.text() == ">= 700, ceiling 989, >= 90% of peers' median"
    assert Criterion().text() == "not judged" and not Criterion().judged
    assert c.margin_pct(770) == pytest.approx(10.0)
    assert c.margin_pct(600) == pytest.approx(-14.2857, rel=1e-3)
    assert Criterion.of(max=50).margin_pct(40) == pytest.approx(20.0)
    assert Criterion.of(min=40, max=50).margin_pct(45) == pytest.approx(10.0)  # the tighter one
    assert Criterion.of(ceiling=50).margin_pct(45) is None
    assert (c.higher_is_better, Criterion.of(max=50).higher_is_better, Criterion.of(ceiling=5).higher_is_better) \
        == (True, False, None)


def test_the_worst_figure_stands_for_the_metric() -> None:
    assert Criterion.of(min=1).stand_in([3, 1, 2]) == 1
    assert Criterion.of(max=9).stand_in([3, 1, 2]) == 3
    assert Criterion.of(ceiling=9).stand_in([3, 1, 2]) == 3
    assert Criterion().stand_in([3, 1, 2]) == 2  # unjudged: the median


def test_results_json_round_trip() -> None:
    c = Criterion.of(min=700, ceiling=989, outlier_fraction=0.9, unit="TFLOPS", description="dense bf16")
    assert c.as_json() == {"min": 700.0, "ceiling": 989.0, "outlier_fraction": 0.9, "unit": "TFLOPS",
                           "severity": "fail"}
    back = Criterion.from_json({**c.as_json(), "some_future_key": 1})
    assert back.as_json() == c.as_json() and back.text() == c.text()
    assert Criterion.from_json(None) == Criterion()


def test_every_bound_documents_its_key() -> None:
    assert list(BOUNDS) == ["min", "max", "ceiling", "outlier_fraction", "outlier_multiple"]
    assert all(KEYS[k] for k in BOUNDS)


def test_results_schema_knows_every_bound() -> None:
    """results.schema.json refuses keys it does not list: a new bound must be added there too."""
    import json
    from pathlib import Path

    schema = json.loads((Path(__file__).resolve().parents[2] / "clustergate" / "results.schema.json").read_text())
    assert set(BOUNDS) <= set(schema["$defs"]["criterion"]["properties"])


def test_severity_and_source_are_parsed_and_carried() -> None:
    c = Criterion.of(min=40, severity="warn", source="estimate")
    assert c.as_json() == {"min": 40.0, "severity": "warn", "source": "estimate"}
    measured = Criterion.of(min=700, source={"kind": "measured", "tool": "mamf-finder", "machine": "8x H200",
                                             "date": dt.date(2026, 1, 10), "n": 8})
    assert measured.severity == "fail"  # the default
    assert measured.source_text() == "measured (mamf-finder, 8x H200, 2026-01-10, n=8)"
    assert Criterion.from_json(measured.as_json()).as_json() == measured.as_json()
    assert Criterion.of(min=1).source_text() == "" and "source" not in Criterion.of(min=1).as_json()
    for raw, message in (
        ({"min": 1, "severity": "fatal"}, "c.severity: must be fail or warn, got 'fatal'"),
        ({"min": 1, "source": "guess"}, "c.source: kind must be one of spec, measured, published, peers, estimate, "
                                        "site, got 'guess'"),
        ({"min": 1, "source": "measured"}, "c.source: measured needs tool, machine, date, n: write source: "
                                           "{kind: measured, tool: ..., machine: ..., date: ..., n: ...}"),
        ({"min": 1, "source": {"kind": "spec", "page": 3}}, "c.source: unknown key 'page'"),
        ({"min": 1, "source": {"kind": "measured", "tool": "t", "machine": "m", "date": "d", "n": 0}},
         "c.source: n must be a whole number >= 1, got 0"),
    ):
        with pytest.raises(CriterionError) as err:
            Criterion.parse(raw, "c")
        assert str(err.value).startswith(message), (raw, str(err.value))


def test_a_warn_criterion_warns_and_never_fails_except_on_a_wrong_unit() -> None:
    warn = Criterion.of(min=700, severity="warn", unit="TFLOPS")
    assert warn.weigh(figures(800, 650), "gpu") == [([], []), ([], ["expected >= 700"])]
    assert warn.weigh([Figure(800, "GFLOPS", 0)], "gpu") == [(["recorded in 'GFLOPS', the profile expects "
                                                              "'TFLOPS'"], [])]
    assert Criterion.of(min=700).weigh(figures(650), "gpu") == [(["expected >= 700"], [])]
