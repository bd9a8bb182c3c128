"""Thermal margin under load and power limits, per GPU (workloads.gpu.limits).

The margin to the nearest slowdown threshold is read through the sustained hold (test_gpu_compute.py's
test_sustained_matmul samples it with the clocks; this file runs after it), its minimum judged against the
profile; the enforced power limit is held to the GPU's default and to the node's and the fleet's other GPUs
(its criterion's outlier bound). Under the cpu profile these skip (no GPU); where NVML does not offer a reading
(a driver before 570, a VM) the test skips naming it.
"""

from __future__ import annotations

import pytest

from acceptance.gpu_helpers import measure, require_device, snapshots
from clustergate.run.recorder import Recorder
from workloads.gpu import burn_in, limits


@pytest.mark.metrics(limits.MARGIN_METRIC)
def test_thermal_margin_under_load(cg: Recorder) -> None:
    """The least NVML margin temperature through the sustained matmul: a GPU that holds its clocks but runs a few
    degrees from slowdown fails (NVSentinel's GpuThermalMarginWatch watches the same margin)."""
    require_device(cg, gpu_only=True)
    run = burn_in.last_run(cg.device)
    cg.skip_unless_everywhere(run is not None, "the sustained matmul did not finish on every rank",
                              fact=None)  # test_sustained_matmul failed or did not run: nothing to read
    assert run is not None
    missing = limits.margin_missing(run)
    cg.skip_unless_everywhere(missing is None, str(missing), fact="unsupported")
    measure(cg, lambda: limits.margin_result(run))


def _limits(cg: Recorder, fields: tuple[str, ...]) -> dict:
    """This rank's snapshot, once every rank's has ``fields``: a rank without NVML fails, a reading NVML does not
    offer on any rank skips naming it (every rank decides alike from the same gathered snapshots)."""
    require_device(cg, gpu_only=True)
    snaps = snapshots(cg)
    missing = [limits.limits_missing(s, fields) for s in snaps]
    broken = [r for r, s in enumerate(snaps) if s.get("gpu") is None or not (s.get("nvml") or {}).get("ok")]
    if cg.rank in broken:
        pytest.fail(f"power limits: {missing[cg.rank]}", pytrace=False)
    if broken:
        cg.skip(f"not measured: ranks {broken} have no NVML reading", fact=None)  # those ranks fail the test
    gone = [r for r, why in enumerate(missing) if why]
    if gone:
        cg.skip(f"NVML cannot read the power limits on {len(gone)}/{len(snaps)} ranks (first rank {gone[0]} on "
                f"{snaps[gone[0]].get('host')}): {missing[gone[0]]}", fact="unsupported")
    return snaps[cg.rank]


@pytest.mark.metrics(limits.LIMIT_METRIC)
def test_power_limit_alike(cg: Recorder) -> None:
    """The enforced power limit per GPU: one capped below the node's other GPUs (or the fleet's) fails, named
    (as azurehpc-health-checks' azure_gpu_app_clocks.nhc holds every GPU's application clocks at their maximum)."""
    snap = _limits(cg, ("power_limit_w",))
    measure(cg, lambda: limits.enforced_result(snap))


@pytest.mark.metrics(limits.DEFAULT_FRACTION_METRIC)
def test_power_limit_default(cg: Recorder) -> None:
    """The enforced power limit against the GPU's default (NVML): a GPU capped below its default fails."""
    snap = _limits(cg, ("power_limit_w", "power_limit_default_w"))
    measure(cg, lambda: limits.default_fraction_result(snap))
