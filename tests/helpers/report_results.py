"""A recorded run of four ranks on two nodes, every kind of row the report draws (a failed figure, a warning,
curves): the report's tests read it as results.json."""

from __future__ import annotations

from typing import Any


def per_rank(values: list[float], failing: tuple[int, ...] = ()) -> list[dict[str, Any]]:
    return [{"rank": r, "host": f"node-{r // 2}", "node_rank": r // 2, "gpu_index": r % 2, "gpu_serial": f"SN{r}",
             "gpu_uuid": f"GPU-{r}", "value": v, "passed": r not in failing} for r, v in enumerate(values)]


def metric(name: str, value: float, criterion: dict[str, Any], passed: bool = True, scope: str = "gpu",
           values: list[float] | None = None, failing: tuple[int, ...] = ()) -> dict[str, Any]:
    return {"name": name, "value": value, "unit": "TFLOPS" if "tflops" in name else "GB/s", "scope": scope,
            "description": "", "criterion": criterion, "passed": passed,
            "per_rank": per_rank(values, failing) if values else []}


RESULTS: dict[str, Any] = {
    "schema": 1, "verdict": "reject", "profile": "h100-sxm-80gb", "sign_off": True, "level": "standard",
    "started": "2026-01-01T00:00:00+00:00", "duration_s": 754.2, "world_size": 4, "error": None,
    "nodes": [{"host": f"node-{n}", "node_rank": n, "ranks": [2 * n, 2 * n + 1],
               "gpus": [{"index": i, "uuid": f"GPU-{2 * n + i}", "serial": f"SN{2 * n + i}", "name": "NVIDIA H100",
                         "rank": 2 * n + i, "local_rank": i} for i in range(2)]} for n in range(2)],
    "environment": {"torch": "2.11.0", "cuda": "13.0", "nccl": "2.27.3", "driver": "580.1", "python": "3.11.7"},
    "tests": [
        {"nodeid": "acceptance/test_matmul.py::test_bf16", "outcome": "failed", "duration_s": 30.0,
         "failed_ranks": [3], "problems": [],
         "message": "[call] 1 metric check failed:\n  matmul_bf16_tflops=600 TFLOPS, expected >= 700 [h100-sxm-80gb, "
                    "rank 3 node-1 gpu 1 serial SN3]",
         "metrics": [metric("matmul_bf16_tflops", 600.0, {"min": 700, "outlier_fraction": 0.9}, passed=False,
                            values=[790.0, 780.0, 785.0, 600.0], failing=(3,))],
         "details": {"curves": {"shapes": [{"n": 4096, "tflops": 700.0}, {"n": 8192, "tflops": 780.0}]}}},
        {"nodeid": "acceptance/test_nccl.py::test_allreduce", "outcome": "passed", "duration_s": 20.0,
         "failed_ranks": [], "problems": [], "message": "",
         "metrics": [metric("allreduce_busbw_gbps", 371.0, {"min": 350, "ceiling": 480}, scope="world",
                            values=[371.0])],
         "details": {"curve": [{"size": 1 << 20, "time": 1e-4, "algbw": 10.0, "busbw": 17.5},
                               {"size": 1 << 30, "time": 5e-3, "algbw": 212.0, "busbw": 371.0}],
                     "matrix": {"labels": ["a", "b"], "values": [[None, 48.0], [47.5, None]], "unit": "GB/s"},
                     "loss": [2.0, 1.5, 1.2], "notes": ["not", "a", "curve"], "clocks": {"sm": 1980}}},
        {"nodeid": "acceptance/test_hbm.py::test_hbm", "outcome": "passed", "duration_s": 5.0, "failed_ranks": [],
         "problems": [], "message": "",
         "metrics": [metric("hbm_bandwidth_tbps", 3.0, {"min": 2.5}, values=[3.0, 3.01, 3.02, 2.6])],
         "details": {}},
    ],
}
