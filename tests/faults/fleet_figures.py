import json
import os

import pytest

FIGURES = json.loads(os.environ["CLUSTERGATE_PLANTED_FIGURES"])
"""{metric: [rank 0's figure, rank 1's, ...]}: what each rank records, as if its GPU had measured it."""
UNITS = {"matmul_bf16_tflops": "TFLOPS", "hbm_bandwidth_tbps": "TB/s"}


@pytest.mark.metrics(*UNITS)
def test_gpu_figures(cg) -> None:
    for name, unit in UNITS.items():
        cg.record(name, FIGURES[name][cg.rank], unit)
