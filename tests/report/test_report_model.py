"""The report's pure parts: criteria rows, margins, tables, figure detection, terminal summary, PNGs."""

from __future__ import annotations

import base64
import copy
from typing import Any

import pytest
from complete_runs import without_gpus
from report_results import RESULTS

from clustergate.report import figures, hooks, html, model, tables
from clustergate.report.summary import summary_lines


def test_criteria_rows_put_failures_first_and_name_the_worst_part() -> None:
    rows = model.criteria_rows(RESULTS)
    assert [r.metric for r in rows] == ["matmul_bf16_tflops", "allreduce_busbw_gbps", "hbm_bandwidth_tbps"]  # by margin
    assert not rows[0].passed and rows[0].where == "1/4 GPUs fail; worst rank 3 node-1 gpu 1 serial SN3"
    assert rows[1].where == "whole job" and rows[1].margin_pct == pytest.approx(6.0)


def test_a_cpu_run_names_ranks_not_gpus_and_its_title_says_dry_run() -> None:
    """A CPU run's parts are ranks (no GPU index): "2 ranks", never "2 GPUs"; its report is a run's, not a sign-off,
    and says it is a dry run."""
    cpu = without_gpus(copy.deepcopy(RESULTS))
    cpu["profile"] = "cpu"
    rows = {r.metric: r for r in model.criteria_rows(cpu)}
    assert rows["matmul_bf16_tflops"].where == "1/4 ranks fail; worst rank 3 node-1"
    assert rows["hbm_bandwidth_tbps"].where.startswith("4 ranks; worst rank ")
    assert hooks.title(cpu) == "clustergate run: profile cpu (dry run, no GPU)"
    assert hooks.title(RESULTS) == "clustergate run: profile h100-sxm-80gb"


def test_gpu_and_node_tables_highlight_failures_and_outliers() -> None:
    table = tables.gpu_table(RESULTS)
    assert table.columns[:4] == ["rank", "host", "gpu", "serial"]
    states = {(row[0].text, table.columns[i]): c.state for row in table.rows for i, c in enumerate(row)}
    assert states[("3", "matmul_bf16_tflops")] == "fail"
    assert states[("3", "hbm_bandwidth_tbps")] == "outlier"  # 2.6 vs median 3.005: 13% worse
    assert states[("0", "hbm_bandwidth_tbps")] == ""
    assert table.rows[3][-1].text == "test_bf16"
    nodes = tables.node_table(RESULTS)
    assert nodes.columns == ["", "node 0", "node 1"]
    worst = next(row for row in nodes.rows if row[0].text == "matmul_bf16_tflops (worst GPU)")[2]
    assert worst.state == "fail" and "node-1:1" in worst.text
    assert nodes.rows[-1][2].text == "3" and nodes.rows[-1][2].state == "fail"


def test_facts_name_hosts_gpus_versions() -> None:
    f = model.facts(RESULTS)
    assert f["gpus"] == "4 x NVIDIA H100" and f["hosts"] == "2 nodes: node-0, node-1"
    assert f["duration"] == "0h12m34.2s" and "nccl 2.27.3" in f["versions"]


def test_figures_follow_the_details_conventions() -> None:
    first, second = (figures.test_figures(t["details"]) for t in RESULTS["tests"][:2])
    assert [(f.x_field, f.y_field) for f in first] == [("n", "tflops")]
    kinds = [(type(f).__name__, getattr(f, "y_field", "")) for f in second]
    assert kinds == [("CurveFigure", "busbw"), ("MatrixFigure", ""), ("CurveFigure", "loss")]
    assert second[0].log_x and second[1].values[0] == (None, 48.0)
    (overview,) = figures.busbw_overview(RESULTS)
    assert len(overview.series) == 1 and overview.title == "busbw against size"
    bars = figures.gpu_bars(RESULTS)
    assert [b.states for b in bars][0] == ("ok", "ok", "ok", "fail")
    one_gpu = {**RESULTS, "tests": [{**t, "metrics": [{**m, "per_rank": (m.get("per_rank") or [])[:1]}
                                                      for m in t.get("metrics", [])]} for t in RESULTS["tests"]]}
    assert bars and figures.gpu_bars(one_gpu) == []  # nothing to compare a lone GPU with
    alike = copy.deepcopy(RESULTS)  # every GPU reads the same and passes: no GPU stands out, no chart
    for t in alike["tests"]:
        for m in t.get("metrics", []):
            for p in m.get("per_rank") or []:
                p.update(value=m["per_rank"][0]["value"], passed=True)
    assert figures.gpu_bars(alike) == []
    failing = copy.deepcopy(alike)  # the same value on every GPU, but failing: charted
    first = next(m for t in failing["tests"] for m in t.get("metrics", []) if len(m.get("per_rank") or []) > 1)
    first["per_rank"][0]["passed"] = False
    assert len(figures.gpu_bars(failing)) == 1
    assert figures.test_figures({"curves": [{"name": "x", "points": [{"step": 1}]}], "m": {"values": "no"}}) == []


def test_loss_shapes() -> None:
    for loss in ([3.0, 2.0], [{"step": 0, "loss": 3.0}, {"step": 5, "loss": 2.0}],
                 {"steps": [0, 5], "values": [3.0, 2.0]}):
        (fig,) = figures.loss_figures({"train_loss": loss})
        assert fig.series[0].y == (3.0, 2.0)
    (fig,) = figures.loss_figures({"losses": {"rank 0": [3.0, 2.0], "eval": [3.1, 2.5]}})
    assert [s.label for s in fig.series] == ["rank 0", "eval"]


def test_pngs_are_drawn() -> None:
    specs = [*figures.test_figures(RESULTS["tests"][1]["details"]), *figures.gpu_bars(RESULTS)]
    for spec in specs:
        data = base64.b64decode(html.png_of(spec))
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000


def test_summary_html_escapes_and_embeds_only_data() -> None:
    results = copy.deepcopy(RESULTS)
    results["tests"][0]["message"] += "\n<script>alert(1)</script>"
    page = html.summary(results)
    assert "<script>alert" not in page and "&lt;script&gt;" in page
    assert "REJECT" in page and 'src="data:image/png;base64,' in page
    assert "http://" not in page and "https://" not in page


def test_summary_lines_say_verdict_failures_and_where() -> None:
    lines = summary_lines(RESULTS)
    assert lines[0].startswith("REJECT   profile h100-sxm-80gb   level standard   4 ranks on 2 nodes")
    assert "4 x NVIDIA H100" in lines[0]
    fail = next(line for line in lines if "matmul_bf16_tflops" in line)
    assert "FAIL" in fail and "-14.3%" in fail and "serial SN3" in fail
    assert any("ranks: rank 3 node-1 gpu 1 serial SN3" in line for line in lines)
    unjudged = summary_lines({**RESULTS, "sign_off": False, "verdict": "accept"})
    assert "no sign-off criteria" in unjudged[1]


def collective_rows(peak: float) -> list[dict[str, Any]]:
    """The rows workloads/interconnect/collectives.py records per group (its field names)."""
    return [{"bytes": b, "requested_bytes": b, "algo": "Ring/Simple", "time_us": b / peak / 1e3, "time_min_us": 1.0,
             "time_max_us": 2.0, "time_mean_us": 1.5, "algbw_gbps": peak / 2 * b / (b + 2**20),
             "busbw_gbps": peak * b / (b + 2**20), "busbw_mean_gbps": peak * b / (b + 2**20) * 0.98}
            for b in (2**20, 2**24, 2**28)]


def test_figures_from_the_workloads_shapes() -> None:
    """The shapes the suite's workloads record today are drawn without any adapter."""
    coll = figures.test_figures({"collective": "all_reduce", "curves": {"node 0 (8 ranks)": collective_rows(370),
                                                                        "node 1 (8 ranks)": collective_rows(360)}})
    assert [(f.y_field, f.y_unit, f.x_field, len(f.series)) for f in coll] == [("busbw", "GB/s", "bytes", 2)]
    hbm = figures.test_figures({"sizes": [{"bytes": 2**30, "copy_tbps": 3.0, "read_tbps": 3.2, "write_tbps": 2.9},
                                          {"bytes": 2**32, "copy_tbps": 3.1, "read_tbps": 3.3, "write_tbps": 3.0}],
                                "clocks": {"sm_clock_mhz": {"median": 1980}}})
    assert [(f.y_unit, [s.label for s in f.series]) for f in hbm] == [("TB/s", ["copy_tbps", "read_tbps",
                                                                                "write_tbps"])]
    host = figures.test_figures({"sizes": [{"bytes": 2**26, "gbps": 50.1, "gbps_min": 49.0, "gbps_max": 51.0,
                                            "copies": 20, "pinned": True}] * 2})
    assert [(f.y_unit, len(f.series)) for f in host] == [("GB/s", 3)]
    intra = figures.matrix_figures({"matrix": {"node 0": [[None, 48.0], [47.0, None]], "node 1": [[None, 1.0],
                                                                                                  [2.0, None]]}})
    assert [m.title for m in intra] == ["node 0", "node 1"]
    inter = figures.matrix_figures({"matrix": {"nodes_slowest_rail": [[None, 45.0], [44.0, None]],
                                               "rails": {"0-1": [45.0, 46.0]}}})
    assert [m.title for m in inter] == ["nodes_slowest_rail"]
    (lora,) = figures.loss_figures({"lora": {"loss_curve": [1.7, 1.0, 0.4], "pretrain_loss_curve": [2.0, 1.9],
                                             "eval_loss_before": 1.8}})
    assert [s.label for s in lora.series] == ["lora.loss_curve", "lora.pretrain_loss_curve"]
    assert figures.test_figures({"shapes": [{"shape": [4096, 4096, 4096], "tflops": 700.0}] * 2}) == []
    tests = [{"nodeid": f"a::test_bw[node-{c}]", "details": {"collective": c, "scope": "node", "curves": {
        "node 0 (8 ranks)": collective_rows(370), "node 1 (8 ranks)": collective_rows(300)}}}
        for c in ("all_reduce", "all_gather")] + [{"nodeid": "a::test_bw[world-all_reduce]", "details": {
            "scope": "world", "curves": {"whole job (16 ranks)": collective_rows(350)}}}]
    node, world = figures.busbw_overview({"tests": tests})
    assert node.title == "busbw against size, node scope" and node.y_unit == "GB/s"
    assert [(s.label, s.group) for s in node.series][:3] == [
        ("all_reduce", "node 0 (8 ranks)"), ("all_reduce", "node 1 (8 ranks)"), ("all_gather", "node 0 (8 ranks)")]
    assert [s.label for s in world.series] == ["world-all_reduce"]  # no collective named: the test's parameters
    (mixed,) = figures.busbw_overview({"tests": [{"nodeid": "a::test_x", "details": {"curves": {
        "all_reduce": collective_rows(370), "all_gather": collective_rows(300)}}}]})
    assert [s.label for s in mixed.series] == ["all_reduce", "all_gather"]  # several curves name themselves


def test_a_warning_is_amber_everywhere_and_changes_no_verdict() -> None:
    data = copy.deepcopy(RESULTS)
    hbm = data["tests"][2]["metrics"][0]
    hbm["criterion"] = {"min": 2.8, "severity": "warn", "source": "estimate"}
    hbm["warned"] = True
    hbm["per_rank"][3]["warned"] = True
    data["warnings"] = [{"test": data["tests"][2]["nodeid"], "metric": "hbm_bandwidth_tbps", "value": 2.6,
                         "criterion": ">= 2.8", "where": "rank 3 node-1 gpu 1 serial SN3"}]
    row = next(r for r in model.criteria_rows(data) if r.metric == "hbm_bandwidth_tbps")
    assert (row.result, row.source, row.where) == ("WARN", "estimate", "1/4 GPUs warn; worst rank 3 node-1 gpu 1 "
                                                                       "serial SN3")
    assert [r.result for r in model.criteria_rows(data)][:2] == ["FAIL", "WARN"]  # failures, then warnings
    cells = {c.text: c.state for row in tables.gpu_table(data).rows for c in row}
    assert cells["2.6 GB/s"] == "warn"
    lines = summary_lines(data)
    assert "warnings: 1 (a warn criterion missed; the verdict does not use them)" in lines
    assert "  WARN hbm_bandwidth_tbps = 2.6 (>= 2.8) at rank 3 node-1 gpu 1 serial SN3" in lines
    page = html.summary(data)
    assert "<h3>Warnings</h3>" in page and 'class="num cg-warn">2.6<' in page
    assert data["verdict"] == RESULTS["verdict"]  # nothing here recomputes or touches it
