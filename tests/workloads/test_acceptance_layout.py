"""The acceptance suite's shape: every test file has its place in the run order."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from acceptance.conftest import RUN_ORDER
from clustergate.trust import manifest

from torchrun_job import job_env

ACCEPTANCE = Path(__file__).resolve().parents[2] / "acceptance"


def test_every_acceptance_file_is_in_the_run_order_and_nothing_else() -> None:
    files = sorted(p.stem for p in ACCEPTANCE.glob("test_*.py"))
    assert sorted(RUN_ORDER) == files, (
        f"acceptance/conftest.py RUN_ORDER lists {sorted(RUN_ORDER)}, the files are {files}: add a new file where "
        "it belongs (cheapest and most basic first)")
    assert len(set(RUN_ORDER)) == len(RUN_ORDER)


def _compute_order(level: str) -> list[str]:
    root = ACCEPTANCE.parent
    proc = subprocess.run([sys.executable, "-m", "pytest", str(ACCEPTANCE / "test_gpu_compute.py"), "--collect-only",
                           "-q", "-p", "no:cacheprovider", "--profile", "cpu", "--level", level],
                          cwd=root, env={**job_env(), "CUDA_VISIBLE_DEVICES": ""}, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return [line.split("::", 1)[1] for line in proc.stdout.splitlines() if "::" in line]


def test_the_sustained_hold_warms_the_sweeps_below_extended_and_soaks_after_them_at_it() -> None:
    """Below --level extended the short sustained hold (and the power read through it) runs first and is the matmul
    sweeps' warm-up; at extended the hold is a thermal soak and runs right after the last sweep, before the rest."""
    sweeps = [f"test_matmul_tflops[{d}]" for d in ("bf16", "fp16", "tf32", "fp8")]
    soak = ["test_sustained_matmul", "test_power_under_load"]
    shipped = [t.nodeid.split("::", 1)[1] for t in manifest.shipped().tests if "test_gpu_compute.py" in t.nodeid]
    assert shipped[:6] == soak + sweeps, shipped  # the run order below extended (the manifest's is collected so)
    extended = _compute_order("extended")
    assert extended[:6] == sweeps + soak and extended[6:] == shipped[6:], extended
