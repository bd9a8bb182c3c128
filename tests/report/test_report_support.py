"""The report's expected-configuration and vendor-support sections, from a results.json dict."""

from __future__ import annotations

from clustergate.report import html, support

RESULTS = {
    "schema": 1, "verdict": "reject", "profile": "h100-sxm-80gb", "level": "standard", "world_size": 2,
    "environment": {"driver": "550.54.15", "cuda": "12.4", "nccl": "2.21.5", "torch": "2.13.0"},
    "nodes": [{"host": "gpu-07", "node_rank": 0, "ranks": [0, 1], "gpus": []}],
    "hardware_inventory": {
        "gpus": [{"host": "gpu-07", "index": 3, "serial": "1652923017345", "uuid": "GPU-5e1f",
                  "pci_bus_id": "00000000:18:00.0", "name": "NVIDIA H100 80GB HBM3", "vbios_version": "96.00.74.00.0D",
                  "inforom_image": "G520.0200.00.05", "board_part_number": "692-2G520-0200-000"}],
        "nodes": [{"host": "gpu-07",
                   "xids_before_run": [{"bus_id": "0000:18:00.0", "code": 63, "text": "Row <Remapper>"}]}],
    },
    "tests": [
        {"nodeid": "acceptance/test_errors_after.py::test_ecc_errors_during_run", "outcome": "failed", "metrics": [],
         "details": {"evidence": [
             {"metric": "ecc_uncorrected_delta", "where": "rank 1 gpu-07 gpu 3 serial 1652923017345", "label": "gpu 3",
              "value": 2.0, "unit": "count", "status": "fail", "evidence": ["ecc_uncorrected_volatile 0 -> 2 (+2)"],
              "next_step": "uncorrectable ECC error in GPU memory: drain the GPU and reset it"},
             {"metric": "ecc_corrected_delta", "where": "rank 0 gpu-07 gpu 2", "label": "gpu 2", "value": 0.0,
              "unit": "count", "status": "ok", "evidence": [], "next_step": ""}]}},
        {"nodeid": "acceptance/test_node_config.py::test_node_setting[numa_balancing]", "outcome": "failed",
         "metrics": [], "details": {"expect": {"setting": "numa_balancing", "what": "automatic NUMA balancing",
                                               "expected": "false", "rows": [
                                                   {"where": "node 0 (gpu-07)", "seen": "kernel.numa_balancing=1",
                                                    "status": "fail"}]}}},
        {"nodeid": "acceptance/test_dcgm.py::test_dcgm_diagnostic[memory]", "outcome": "failed", "metrics": [],
         "details": {"dcgm": [{"where": "gpu 1", "test": "memory", "status": "fail",
                               "message": "Found 3 faulty memory elements on GPU 1 (DCGM error 52)"}]}},
    ],
}


def test_sections_collect_what_support_asks_for() -> None:
    out = "".join(support.sections(RESULTS))
    assert "<h3>Expected configuration</h3>" in out and "kernel.numa_balancing=1" in out
    for text in ("1652923017345", "96.00.74.00.0D", "G520.0200.00.05", "692-2G520-0200-000", "driver 550.54.15",
                 "ecc_uncorrected_volatile 0 -&gt; 2 (+2)", "drain the GPU and reset it",
                 "Found 3 faulty memory elements on GPU 1"):
        assert text in out, text
    assert "Row &lt;Remapper&gt;" in out  # escaped
    assert "ecc_corrected_delta" not in out  # a counter that did not grow is not listed


def test_nothing_to_show_adds_nothing_and_the_summary_carries_the_sections() -> None:
    assert support.sections({"tests": [], "environment": {}}) == []
    assert "<h3>For vendor support</h3>" in html.summary(RESULTS)
