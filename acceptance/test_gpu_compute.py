"""Per-GPU compute, memory and host-link figures, every GPU of a node at once, judged per GPU.

Each figure is judged against the profile's minimum and, through ``outlier_fraction``, against
the median of the node's and the cluster's GPUs, so a slow GPU is named even above the minimum.
Under the cpu profile these run for real on the CPU with small sizes (fp8 skips: no fp8 units).
Under a GPU profile a rank without a GPU fails, saying so.
"""

from __future__ import annotations

import pytest

from acceptance.gpu_helpers import CPU_SKIP, expects_gpu, measure, require_device
from clustergate.recorder import Recorder
from workloads.gpu import burn_in, hbm, hostlink, matmul

BURN_IN_LIMIT_S = 3600
"""The burn-in test's own time limit; the profile's burn_in_s must leave it a margin."""

MATMUL_DTYPES = [pytest.param(d, id=d, marks=pytest.mark.metrics(f"matmul_{d}_tflops")) for d in matmul.DTYPES]


@pytest.mark.parametrize("dtype", MATMUL_DTYPES)
def test_matmul_tflops(cg: Recorder, dtype: str) -> None:
    """Dense matmul TFLOPS per GPU (best of a small shape sweep), checked against float64 first."""
    require_device(cg)
    if dtype == "fp8":
        if not expects_gpu(cg):
            pytest.skip(f"{CPU_SKIP} (fp8 matmul needs fp8 tensor cores)")
        why = matmul.fp8_unsupported(cg.device)
        cg.skip_unless_everywhere(why is None, f"fp8 not measured: {why}")
    cfg = matmul.Config.for_level(cg.level, cg.device, dtype, peak_tflops=cg.setting(f"peak_{dtype}_tflops", None))
    measure(cg, lambda: matmul.run(cfg))


@pytest.mark.metrics("hbm_bandwidth_tbps")
def test_hbm_bandwidth(cg: Recorder) -> None:
    """Device-to-device copy bandwidth per GPU (bytes read + written), copy checked exactly."""
    require_device(cg)
    cfg = hbm.Config.for_level(cg.level, cg.device)
    measure(cg, lambda: hbm.run(cfg))


@pytest.mark.metrics("h2d_bandwidth_gbps")
def test_host_to_device_bandwidth(cg: Recorder) -> None:
    """Pinned host to GPU bandwidth, every GPU at once (a shared switch or wrong NUMA node shows)."""
    require_device(cg)
    cfg = hostlink.Config.for_level(cg.level, cg.device, "h2d")
    measure(cg, lambda: hostlink.run(cfg))


@pytest.mark.metrics("d2h_bandwidth_gbps")
def test_device_to_host_bandwidth(cg: Recorder) -> None:
    """GPU to pinned host bandwidth, every GPU at once."""
    require_device(cg)
    cfg = hostlink.Config.for_level(cg.level, cg.device, "d2h")
    measure(cg, lambda: hostlink.run(cfg))


@pytest.mark.metrics("burn_in_tflops")
@pytest.mark.time_limit(BURN_IN_LIMIT_S)
def test_burn_in(cg: Recorder) -> None:
    """Sustained matmul for the profile's burn_in_s: every product compared, no slowdown (extended only)."""
    if cg.level != "extended":
        pytest.skip(f"burn-in runs at --level extended only (this run: {cg.level})")
    require_device(cg)
    seconds = float(cg.setting("burn_in_s"))
    if seconds > BURN_IN_LIMIT_S - 300:
        pytest.fail(f"profile burn_in_s={seconds:g} leaves under 300 s of the burn-in test's "
                    f"{BURN_IN_LIMIT_S} s limit; lower it", pytrace=False)
    cfg = burn_in.Config.for_level(cg.level, cg.device, seconds)
    measure(cg, lambda: burn_in.run(cfg))
