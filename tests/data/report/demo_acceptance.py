"""A stand-in acceptance suite for the report's own tests: figures shaped as the workloads record them.

Synthetic, deterministic values (the report is under test, not the hardware). REPORT_DEMO_SCALE
scales every figure (to exercise --baseline); REPORT_DEMO_FAIL=1 plants a slow part on the last
rank and a workload that prints a secret from its environment (redaction must remove it).
"""

from __future__ import annotations

import os

import pytest

SCALE = float(os.environ.get("REPORT_DEMO_SCALE", "1"))
FAIL = os.environ.get("REPORT_DEMO_FAIL") == "1"
SIZES = [1 << k for k in range(10, 27, 2)]


def _curve(peak: float, factor: float) -> list[dict[str, float]]:
    points = []
    for size in SIZES:
        busbw = SCALE * peak * size / (size + (1 << 20))
        points.append({"size": size, "time": size * factor / (busbw * 1e9), "algbw": busbw / factor, "busbw": busbw})
    return points


@pytest.mark.metrics("demo_tflops", "demo_hbm_tbps")
def test_demo_gpu_figures(cg):
    """Per-GPU figures: one rank is slow when REPORT_DEMO_FAIL=1."""
    slow = FAIL and cg.rank == cg.world_size - 1
    cg.record("demo_tflops", SCALE * (100.0 + cg.rank) * (0.7 if slow else 1.0), "TFLOPS")
    cg.record("demo_hbm_tbps", SCALE * (3.0 - 0.05 * cg.rank) * (0.5 if slow else 1.0), "TB/s")
    if FAIL and cg.rank == 0:
        print(f"workload log: connecting with token {os.environ.get('MY_API_TOKEN', '')}")


@pytest.mark.metrics("demo_busbw_gbps")
def test_demo_collectives(cg):
    """busbw against size for two collectives, as the collectives workload records them."""
    curves = {"all_reduce world": _curve(40.0, 2.0), "all_gather world": _curve(30.0, 1.0)}
    cg.record("demo_busbw_gbps", curves["all_reduce world"][-1]["busbw"], "GB/s", scope="world")
    cg.details.update({"curves": curves, "units": {"size": "B", "busbw": "GB/s", "time": "s"}})


@pytest.mark.metrics("demo_pair_gbps")
def test_demo_pairs(cg):
    """A GPU-pair bandwidth matrix (node scope)."""
    n = 4
    values = [[None if i == j else SCALE * (45.0 + i + j) for j in range(n)] for i in range(n)]
    cg.record("demo_pair_gbps", min(v for row in values for v in row if v is not None), "GB/s", scope="node")
    cg.details["matrix"] = {"labels": [f"gpu{i}" for i in range(n)], "values": values, "unit": "GB/s",
                            "title": "send/recv GB/s, GPU pairs of node 0"}


@pytest.mark.metrics("demo_loss_drop")
def test_demo_training(cg):
    """A loss history (the LoRA / training workloads' shape)."""
    loss = [1.7 * 0.97 ** step + 0.3 for step in range(60)]
    cg.record("demo_loss_drop", (loss[0] - loss[-1]) / loss[0], "fraction", scope="world")
    cg.details.update({"loss": loss, "tables": {"clocks": [{"gpu": 0, "sm_mhz": 1980, "throttle": "none"}]}})
