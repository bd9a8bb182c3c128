"""metrics.prom (clustergate.report.openmetrics) parsed back with prometheus_client's OpenMetrics parser, and with its
Prometheus text parser (the format node_exporter's textfile collector reads), for a real node run, a merge
and a sign-off."""

from __future__ import annotations

from pathlib import Path

import pytest
from fleet_data import HOST, SERIALS, later, merged_docs, parts, real_run
from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics
from prometheus_client.parser import text_string_to_metric_families as prometheus_text
from trust_runs import node_run, recorded  # noqa: F401  (node_run: the fixture)

from clustergate.report.openmetrics import FAMILIES, render
from clustergate.store.rows import seconds


def samples(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """name -> [(labels, value)], by the OpenMetrics parser; the Prometheus text parser must read the same."""
    families = list(openmetrics(text))
    parsed = {f.name: [(s.labels, s.value) for s in f.samples] for f in families}
    assert all(f.type == "gauge" for f in families)
    # node_exporter's textfile collector refuses samples with timestamps: the run's time is a sample of its own
    assert all(s.timestamp is None for f in families for s in f.samples)
    assert {f.name: [(s.labels, s.value) for s in f.samples] for f in prometheus_text(text)} == parsed
    assert text.endswith("# EOF\n")
    return parsed


def test_a_node_run_gives_one_sample_per_part_and_metric() -> None:
    run = real_run()
    got = samples(render(run))
    values = {(s["host"], s["gpu"], s["serial"], s["metric"], s["unit"]): v for s, v in got["clustergate_metric_value"]}
    expected = {(p["host"], "" if m["scope"] != "gpu" else str(p["gpu_index"]),
                 "" if m["scope"] != "gpu" else p["gpu_serial"], m["name"], m["unit"]): p["value"]
                for t in run["tests"] for m in t["metrics"] for p in m["per_rank"]}
    assert values == expected and len(values) == parts(run)
    assert (HOST, "1", SERIALS[1], "matmul_bf16_tflops", "TFLOPS") in values
    assert (HOST, "", "", "intranode_allreduce_busbw_gbps", "GB/s") in values
    assert {v for _, v in got["clustergate_metric_verdict"]} == {0.0}
    assert got["clustergate_verdict"] == [({"kind": "run", "verdict": v}, 1.0 if v == "accept" else 0.0)
                                          for v in ("running", "accept", "reject", "partial", "unjudged")]
    assert got["clustergate_run_timestamp_seconds"] == [({"kind": "run"}, seconds(run["started"]))]
    assert got["clustergate_run_duration_seconds"] == [({"kind": "run"}, run["duration_s"])]
    assert got["clustergate_run_info"] == [({"kind": "run", "profile": "cpu", "level": "quick", "version": "0.1.0"},
                                            1.0)]
    assert "clustergate_metric_drift_fraction" not in got  # no drift judged: no family


def test_a_cpu_runs_file_as_written_holds_every_ranks_figure(node_run: Path) -> None:  # noqa: F811
    """README's command 1 (2 CPU ranks, no GPU index): the file the run wrote, not one rendered here, has a series
    per rank and figure, ``gpu="rank N"`` (both ranks' figures once made one series, and the run could not write
    the file after its first figure)."""
    run = recorded(node_run)
    got = samples((node_run / "metrics.prom").read_text())
    values = {(s["host"], s["gpu"], s["metric"]): v for s, v in got["clustergate_metric_value"]}
    expected = {(p["host"], f"rank {p['rank']}" if m["scope"] == "gpu" else "", m["name"]): p["value"]
                for t in run["tests"] for m in t["metrics"] for p in m["per_rank"]}
    assert values == expected
    assert ("cg-a", "rank 1", "matmul_bf16_tflops") in values


def test_failed_and_warned_figures_and_drift() -> None:
    run = later(real_run(), "2027-01-01T00:00:00+00:00", scale={("hbm_bandwidth_tbps", SERIALS[0]): 1e-4})
    run["drift"] = {"store": "fleet.db", "fraction": 0.05, "severity": "warn", "findings": [
        {"metric": "matmul_bf16_tflops", "host": HOST, "gpu_index": 1, "serial": SERIALS[1], "unit": "TFLOPS",
         "fraction": 0.1}]}
    got = samples(render(run))
    verdicts = {(s["serial"], s["metric"]): v for s, v in got["clustergate_metric_verdict"]}
    assert verdicts[SERIALS[0], "hbm_bandwidth_tbps"] == 2 and verdicts[SERIALS[1], "hbm_bandwidth_tbps"] == 0
    assert ({"kind": "run", "verdict": "reject"}, 1.0) in got["clustergate_verdict"]
    assert got["clustergate_metric_drift_fraction"] == [({"host": HOST, "gpu": "1", "serial": SERIALS[1],
                                                          "metric": "matmul_bf16_tflops", "unit": "TFLOPS"}, 0.1)]


def test_drift_on_a_node_without_gpus_names_each_rank_as_its_figures_do() -> None:
    """Two CPU ranks drifted: one series each, labelled as their figures are (``rank N``); a node's figure has none."""
    run = real_run()
    finding = {"metric": "matmul_bf16_tflops", "host": HOST, "gpu_index": None, "serial": None, "unit": "TFLOPS",
               "scope": "gpu", "fraction": 0.1}
    run["drift"] = {"findings": [{**finding, "rank": 0}, {**finding, "rank": 1, "fraction": 0.2},
                                 {**finding, "scope": "node", "rank": 0, "metric": "hbm_bandwidth_tbps"}]}
    got = samples(render(run))
    assert [(s["gpu"], s["metric"], v) for s, v in got["clustergate_metric_drift_fraction"]] == [
        ("rank 0", "matmul_bf16_tflops", 0.1), ("rank 1", "matmul_bf16_tflops", 0.2), ("", "hbm_bandwidth_tbps", 0.1)]


def test_label_values_are_escaped() -> None:
    run = real_run()
    odd = 'gpu "07"\\rack\nB'  # no node may be named so (workloads.node.name): the escaping must still hold
    run["nodes"][0]["host"] = odd  # a figure of the whole job names the run's first node
    for test in run["tests"]:
        for m in test["metrics"]:
            for p in m["per_rank"]:
                p["host"] = odd
            m["unit"] = 'T"B\\s'
    text = render(run)
    assert '\\"07\\"\\\\rack\\nB' in text
    got = samples(text)
    assert {s["host"] for s, _ in got["clustergate_metric_value"]} == {odd}
    assert {s["unit"] for s, _ in got["clustergate_metric_value"]} == {'T"B\\s'}


def test_a_metric_recorded_by_two_tests_is_refused() -> None:
    run = real_run()
    twin = {**run["tests"][0], "nodeid": "acceptance/test_other.py::test_twin"}
    run["tests"].append(twin)
    with pytest.raises(ValueError, match="metric matmul_bf16_tflops of gpu-node-07 is recorded by "
                                         r"acceptance/test_gpu_compute.py::test_matmul_tflops\[bf16\] and "
                                         "acceptance/test_other.py::test_twin"):
        render(run)


def test_a_merge_gives_the_fleet_and_each_node(tmp_path_factory: pytest.TempPathFactory) -> None:
    cluster, signoff, _ = merged_docs(tmp_path_factory)
    got = samples(render(cluster))
    assert ({"kind": "cluster", "verdict": "reject"}, 1.0) in got["clustergate_verdict"]
    assert dict((s["host"], v) for s, v in got["clustergate_node_accepted"]) == {"m1": 1.0, "m2": 0.0, "m3": 0.0}
    counts = {s["status"]: v for s, v in got["clustergate_cluster_nodes"]}
    assert counts == {k: float(v) for k, v in cluster["counts"].items() if v is not None}
    stats = {(s["metric"], s["stat"]): v for s, v in got["clustergate_fleet_metric"]}
    hbm = next(f for f in cluster["fleet"] if f["metric"] == "hbm_bandwidth_tbps")
    assert stats["hbm_bandwidth_tbps", "median"] == hbm["median"] and stats["hbm_bandwidth_tbps", "count"] == 24
    assert stats["hbm_bandwidth_tbps", "floor"] == hbm["floor"]
    outliers = {(s["host"], s["gpu"], s["metric"]): (s, v) for s, v in got["clustergate_fleet_outlier_value"]}
    assert {h for h, _, m in outliers if m == "hbm_bandwidth_tbps"} == {"m2"}
    label, value = outliers["m3", "3", "matmul_bf16_tflops"]
    assert label["serial"] == "1654000033" and label["severity"] == "fail" and value < 400
    assert "clustergate_metric_value" not in got  # each node's own file carries its GPUs' figures
    assert got["clustergate_run_timestamp_seconds"] == [({"kind": "cluster"}, seconds(cluster["created"]))]


def test_a_signoff(tmp_path_factory: pytest.TempPathFactory) -> None:
    _, signoff, _ = merged_docs(tmp_path_factory)
    got = samples(render(signoff))
    assert got["clustergate_node_accepted"] == [({"kind": "signoff", "host": "solo"}, 1.0)]
    assert ({"kind": "signoff", "verdict": "accept"}, 1.0) in got["clustergate_verdict"]
    assert got["clustergate_run_info"][0][0]["kind"] == "signoff"


def test_a_family_is_written_alike_by_a_run_a_merge_and_a_signoff(tmp_path_factory: pytest.TempPathFactory) -> None:
    """node_exporter reads every file of its directory as one exposition: a family with two HELP texts (or TYPEs)
    loses its series of every file but one (tests/report/test_openmetrics_node_exporter.py runs it)."""
    cluster, signoff, _ = merged_docs(tmp_path_factory)
    heads: dict[str, set[str]] = {}
    for text in (render(real_run()), render(cluster), render(signoff)):
        for line in text.splitlines():
            if line.startswith(("# HELP ", "# TYPE ")):
                heads.setdefault(line.split()[2], set()).add(line)
        for name, got in samples(text).items():
            assert {tuple(labels) for labels, _ in got} == {FAMILIES[name].labels}, name
    assert {name: len(lines) for name, lines in heads.items()} == {name: 2 for name in heads}
    assert {"clustergate_verdict", "clustergate_run_info", "clustergate_node_accepted"} <= set(heads)
