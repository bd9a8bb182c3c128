"""clustergate.record.actions: every failure category has an action, every metric and acceptance test a category,
and a run's failures become steps, most urgent first."""

from __future__ import annotations

import ast

import yaml
from cluster_runs import node_results
from fleet_data import SERIALS, later, real_run

from clustergate.criteria import expect
from clustergate.record import actions
from clustergate.record.actions import Action
from workloads import faults

from torchrun_job import ROOT


def test_every_category_has_a_response_and_no_name_is_taken_twice() -> None:
    assert not set(faults.CATEGORIES) & set(actions.FIGURE_CATEGORIES)
    every = {*faults.CATEGORIES, *actions.FIGURE_CATEGORIES}
    assert set(actions.RESPONSES) == every
    for name in every:
        c, r = actions.category(name), actions.response(name)
        assert c.meaning and c.next_step and r.action in Action and r.escalate != r.action
    assert actions.response("row_remap_failure") == actions.Response(Action.VENDOR)
    assert actions.response("uncorrectable_ecc") == actions.Response(Action.RESET, Action.VENDOR)


def test_every_metric_of_every_profile_has_a_category() -> None:
    profiles = yaml.safe_load((ROOT / "thresholds.yaml").read_text())["profiles"]
    metrics = {m for p in profiles.values() for m in p.get("metrics") or {}}
    unknown = sorted(m for m in metrics if actions.category_of_metric(m) == "unknown")
    assert not unknown, f"give these metrics a category in clustergate/record/actions.py: {unknown}"
    assert actions.category_of_metric("intranode_allreduce_latency_us") == "nvlink_bandwidth"
    assert actions.category_of_metric("net_sendrecv_bw_gbps") == "fabric_bandwidth"
    assert actions.category_of_metric("lora_eval_loss_drop") == "training"
    assert actions.category_of_metric("no_such_metric") == "unknown"


def test_counter_metrics_take_the_category_their_tests_judge_by() -> None:
    from workloads.gpu import error_counters
    from workloads.node import ib_counters, pcie_aer

    for table in (error_counters.METRICS, ib_counters.METRICS, pcie_aer.METRICS):
        for metric, (_, category) in table.items():
            assert actions.category_of_metric(metric) == category, metric


def acceptance_tests() -> list[str]:
    """``FILE::FUNCTION`` of every test function in acceptance/."""
    found = []
    for path in sorted((ROOT / "acceptance").glob("test_*.py")):
        tree = ast.parse(path.read_text())
        found += [f"{path.name}::{node.name}" for node in tree.body
                  if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")]
    return found


def test_every_acceptance_test_has_a_category() -> None:
    tests = acceptance_tests()
    assert len(tests) > 50
    missing = [t for t in tests if t not in actions.TEST_CATEGORY and t not in actions.EXPECT_TESTS]
    assert not missing, f"give these tests a category in clustergate/record/actions.py: {missing}"
    assert not set(actions.TEST_CATEGORY) - set(tests), "TEST_CATEGORY names tests that no longer exist"
    for key, rule in expect.RULES.items():
        test = "test_gpu_setting" if rule.scope == "gpu" and key != "fabric_manager" else "test_node_setting"
        assert actions.category_of_test(f"acceptance/test_node_config.py::{test}[{key}]") == rule.category
    assert actions.category_of_test("acceptance/test_gpu_compute.py::test_matmul_tflops[bf16]") == "gpu_compute"
    assert actions.category_of_test("elsewhere/test_x.py::test_y") == "unknown"


def test_dcgm_severities() -> None:
    assert actions.from_dcgm("ISOLATE") is Action.ISOLATE and actions.from_dcgm("DCGM_ERROR_RESET") is Action.RESET
    assert actions.from_dcgm("triage") is Action.RETEST and actions.from_dcgm("NONE") is None
    assert actions.from_dcgm(None) is None


def test_a_failed_figure_names_its_part_and_step() -> None:
    run = node_results("gpu07", 3, {("matmul_bf16_tflops", 3): 0.5})
    [s] = actions.steps(run)
    assert (s.action, s.escalate, s.category) == (Action.RETEST, Action.VENDOR, "gpu_compute")
    assert s.test == "acceptance/test_gpu_compute.py::test_matmul_tflops[bf16]"
    assert s.where == "gpu07 gpu 3 serial 1654000033"
    assert s.text().startswith("retest: GPU compute below its criterion (matmul TFLOPS) [gpu07 gpu 3 serial "
                               "1654000033]: read the clocks") and s.text().endswith("; if it recurs: vendor")
    assert actions.steps(node_results("gpu08", 4)) == []
    assert actions.steps(real_run()) == []


def test_recorded_evidence_comes_first_and_the_most_urgent_leads() -> None:
    run = later(real_run(), "2027-01-01T00:00:00+00:00", scale={("hbm_bandwidth_tbps", SERIALS[0]): 1e-4})
    run["tests"].append({
        "nodeid": "acceptance/test_errors_after.py::test_no_xid_errors_during_run", "outcome": "failed",
        "duration_s": 1.0, "failed_ranks": [1], "message": "", "problems": [], "metrics": [],
        "details": {"evidence": [
            {"metric": "xid_critical_events", "category": "gpu_off_bus", "status": "fail", "where": "rank 1 gpu-node-07"
             " gpu 1 serial 1652823054301", "evidence": ["XID 79 (GPU has fallen off the bus) [kernel log]: ..."]},
            {"metric": "xid_other_events", "category": "application", "status": "ok", "where": "rank 0",
             "evidence": []}]}})
    run["tests"].append({"nodeid": "acceptance/test_node_config.py::test_node_setting[iommu]", "outcome": "failed",
                         "duration_s": 0.1, "failed_ranks": [0], "message": "", "problems": [], "metrics": [],
                         "details": {}})
    found = actions.steps(run)
    assert [(s.action, s.category) for s in found] == [(Action.ISOLATE, "gpu_off_bus"), (Action.CONFIG, "config_iommu"),
                                                      (Action.RETEST, "gpu_memory_bandwidth")]
    assert found[0].where.endswith("serial 1652823054301") and actions.most_urgent(found) is Action.ISOLATE
    assert actions.most_urgent([]) is None


def test_run_errors_interruptions_and_failed_drift() -> None:
    run = {**real_run(), "error": "rank 1 (gpu-node-07) was lost", "verdict": "reject"}
    run["tests"] = [*run["tests"], {**run["tests"][0], "nodeid": "acceptance/test_world.py::test_allreduce_is_exact",
                                    "outcome": "interrupted", "metrics": []}]
    run["drift"] = {"findings": [{"metric": "hbm_bandwidth_tbps", "severity": "fail", "host": "gpu-node-07",
                                  "fraction": 0.12, "test": "acceptance/test_gpu_compute.py::test_hbm_bandwidth"},
                                 {"metric": "matmul_bf16_tflops", "severity": "warn", "host": "gpu-node-07",
                                  "fraction": 0.07}]}
    found = actions.steps(run)
    assert [s.category for s in found] == ["run_error", "run_error", "gpu_memory_bandwidth"]
    assert found[2].where == "gpu-node-07: 12% below its first accepted figure"
    assert found[0].as_json()["action"] == "retest" and found[0].as_json()["escalate"] == "isolate"


def test_an_interrupted_run_is_run_again_not_a_node_to_isolate() -> None:
    """No rank caused the ending (results.json's ``interrupted``: Ctrl-C, a signal from outside): the run and the test
    it was in are run again, with nothing to escalate to; the summary counts the selected tests that never ran."""
    from clustergate.report.summary import summary_lines

    run = {**real_run(), "error": "interrupted by SIGINT on rank 0 (gpu-node-07) during the session",
           "verdict": "reject", "interrupted": True}
    run["tests"] = [run["tests"][0], {**run["tests"][0], "nodeid": "acceptance/test_world.py::test_allreduce_is_exact",
                                      "outcome": "interrupted", "metrics": []}]
    run["selection"] = {**run.get("selection", {}), "selected": 9}
    found = actions.steps(run)
    assert [(s.action, s.category, s.escalate) for s in found] == [(Action.RETEST, "interrupted", None)] * 2
    run["actions"] = actions.section(run)
    lines = summary_lines(run)
    assert "tests: 1 interrupted, 1 passed, 7 never ran" in lines, lines
    assert not [line for line in lines if "isolate" in line], lines


def test_the_terminal_and_the_report_say_what_to_do() -> None:
    from clustergate.report import html
    from clustergate.report.summary import summary_lines

    run = later(real_run(), "2026-12-01T00:00:00+00:00", scale={("hbm_bandwidth_tbps", SERIALS[0]): 0.01})
    run["actions"] = actions.section(run)
    [step] = run["actions"]
    assert step["text"] == actions.step("gpu_memory_bandwidth", step["test"], step["where"]).text()
    lines = summary_lines(run)
    failed = next(i for i, line in enumerate(lines) if line.startswith("  FAILED test_hbm_bandwidth"))
    assert f"    do: {step['text']}" in lines[failed:]
    page = html.summary(run)
    assert "What to do" in page and step["next_step"] in page
