"""Per-GPU compute, memory and host-link figures, judged per GPU.

Each figure is judged against the profile's minimum and, through ``outlier_fraction``, against
the median of the node's and the cluster's GPUs, so a slow GPU is named even above the minimum.
Compute and memory run on every GPU of a node at once; the host link is judged on each GPU alone
and reported for the node with every GPU copying at once. Under the cpu profile these run for real
on the CPU with small sizes (fp8 and power skip: no fp8 units, no power sensor). Under a GPU profile
a rank without a GPU fails, saying so.
"""

from __future__ import annotations

from collections import Counter

import pytest

from acceptance.gpu_helpers import CPU_SKIP, expects_gpu, measure, require_device
from clustergate.run.recorder import Recorder
from workloads.gpu import burn_in, hbm, hostlink, matmul

BURN_IN_LIMIT_S = 3600
"""The sustained test's own time limit at extended, where it holds the profile's burn_in_s (which must leave it a
margin); below extended it runs seconds, and its limit follows its measured time (clustergate.run.testlimit)."""

MATMUL_DTYPES = [pytest.param(d, id=d, marks=pytest.mark.metrics(f"matmul_{d}_tflops")) for d in matmul.DTYPES]
SUSTAINED_DTYPE = "bf16"


@pytest.mark.metrics(burn_in.metric_name(SUSTAINED_DTYPE))
@pytest.mark.time_limit(BURN_IN_LIMIT_S, levels=["extended"])
def test_sustained_matmul(cg: Recorder) -> None:
    """A matmul shape held back to back (seconds below --level extended, the profile's burn_in_s at it): the
    sustained TFLOPS per GPU, every product compared with the first. Below extended it runs before the matmul
    sweeps and warms the GPU for them (their warm-up counts it); at extended it runs after them and holds their
    best shape (acceptance/conftest.py)."""
    require_device(cg)
    seconds = float(cg.setting("burn_in_s"))
    if cg.level == "extended" and seconds > BURN_IN_LIMIT_S - 300:
        pytest.fail(f"profile burn_in_s={seconds:g} leaves under 300 s of the sustained test's "
                    f"{BURN_IN_LIMIT_S} s limit; lower it", pytrace=False)
    cfg = burn_in.Config.for_level(cg.level, cg.device, seconds, SUSTAINED_DTYPE,
                                   best=matmul.best_shape(cg.device, SUSTAINED_DTYPE))
    measure(cg, lambda: burn_in.run(cfg))


@pytest.mark.metrics("sustained_power_w", "sustained_power_fraction", "sustained_sm_clock_mhz")
def test_power_under_load(cg: Recorder) -> None:
    """Power draw against the enforced limit, SM clock and clock event reasons through the sustained matmul:
    a software power cap is expected at full load; hardware slowdown, thermal slowdown or power brake fail."""
    require_device(cg, gpu_only=True)
    run = burn_in.last_run(cg.device)
    cg.skip_unless_everywhere(run is not None, "the sustained matmul did not finish on every rank",
                              fact=None)  # test_sustained_matmul failed or did not run: nothing to read
    assert run is not None
    measure(cg, lambda: burn_in.power_result(run, on_gpu=cg.device.type == "cuda"))


@pytest.mark.parametrize("dtype", MATMUL_DTYPES)
def test_matmul_tflops(cg: Recorder, dtype: str) -> None:
    """Dense matmul TFLOPS per GPU the MAMF way (best shape's median), checked against float64 first; the same
    calls by the host's clock must reach the profile's matmul_wallclock_fraction of it (a GPU shared with
    another job keeps its per-call figure but not its wall-clock one)."""
    require_device(cg)
    if dtype == "fp8":
        if not expects_gpu(cg):
            cg.skip(f"{CPU_SKIP} (fp8 matmul needs fp8 tensor cores)", fact="no_gpu")
        why = matmul.fp8_unsupported(cg.device)
        cg.skip_unless_everywhere(why is None, f"fp8 not measured: {why}", fact="unsupported")
    cfg = matmul.Config.for_level(cg.level, cg.device, dtype, peak_tflops=cg.setting(f"peak_{dtype}_tflops", None),
                                  wallclock_fraction=cg.setting("matmul_wallclock_fraction", None))
    measure(cg, lambda: matmul.run(cfg))


@pytest.mark.metrics("hbm_bandwidth_tbps")
def test_hbm_bandwidth(cg: Recorder) -> None:
    """Device-to-device copy bandwidth per GPU (bytes read + written), copy checked exactly."""
    require_device(cg)
    cfg = hbm.Config.for_level(cg.level, cg.device)
    measure(cg, lambda: hbm.run(cfg))


HOST_LINK = [pytest.param(d, id=d, marks=pytest.mark.metrics(hostlink.metric_name(d, "alone")))
             for d in hostlink.DIRECTIONS]
HOST_LINK_ALL = [pytest.param(d, id=d, marks=pytest.mark.metrics(hostlink.metric_name(d, "together")))
                 for d in hostlink.DIRECTIONS]


@pytest.mark.parametrize("direction", HOST_LINK)
def test_host_link(cg: Recorder, direction: str) -> None:
    """Pinned host memory to the GPU and back, each GPU alone (one per node at a time, the others waiting):
    a downtrained link or a GPU on the wrong NUMA node is named."""
    require_device(cg)
    cfg = hostlink.Config.for_level(cg.level, cg.device, direction, "alone")
    measure(cg, lambda: hostlink.run(cfg))


@pytest.mark.parametrize("direction", HOST_LINK_ALL)
def test_host_link_all_gpus(cg: Recorder, direction: str) -> None:
    """The same copies on every GPU of a node at once (per node: its slowest GPU): what a shared PCIe
    switch, socket or virtualised host leaves each GPU when all load at once."""
    require_device(cg)
    # Every rank holds the same identities, so every rank decides alike.
    if max(Counter(ident["node_rank"] for ident in cg.identities).values()) == 1:
        cg.skip("one GPU per node: test_host_link measured each alone, which is every GPU of its node at once",
                fact="one_gpu_per_node")
    cfg = hostlink.Config.for_level(cg.level, cg.device, direction, "together")
    measure(cg, lambda: hostlink.run(cfg))
