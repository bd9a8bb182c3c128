"""GPU inventory and health through NVML, one hardware property per test, the bad GPU named.

Every rank reads its own GPU (workloads.gpu.inventory.snapshot); the snapshots are gathered to
every rank and judged by pure functions (workloads.gpu.health), so every rank reaches the same
verdict: a rank whose GPU fails a check fails the test (the report names its host, GPU index and
serial); where NVML cannot read a field the test is skipped saying so, never passed.
Under the cpu profile these tests skip ("cpu profile: no GPU"); under a GPU profile a rank
without a GPU, or without NVML, fails each of them with the reason.
"""

from __future__ import annotations

import pytest

from acceptance.evidence import host_root
from acceptance.gpu_helpers import settle, skip_on_cpu_profile, snapshots
from clustergate.run.recorder import Recorder
from workloads.gpu import health, processes
from workloads.result import Result

GiB = 1 << 30
PCIE_LOAD_S = 0.5
"""An idle GPU trains its PCIe link down: the link is read while copies run."""


def _snapshots(cg: Recorder, **kwargs: float) -> list[dict]:
    skip_on_cpu_profile(cg)
    return snapshots(cg, **kwargs)


def _needs(cg: Recorder, name: str) -> object:
    skip_on_cpu_profile(cg)
    value = cg.setting(name, None)
    if value is None:
        cg.skip(f"profile {cg.profile_name!r} sets no {name}: nothing to judge against", fact="not_required",
                setting=f"settings.{name}")
    return value


@pytest.mark.metrics("gpu_count")
def test_gpu_count(cg: Recorder) -> None:
    """GPUs per node equal the profile's gpus_per_node; a missing GPU fails (NVML and CUDA must agree)."""
    snaps = _snapshots(cg)
    mine = snaps[cg.rank]
    cg.record("gpu_count", mine.get("cuda_device_count", 0), "GPUs", scope="node",
              description="GPUs per node visible to CUDA")
    cg.record_result(Result(metrics=(), details={"snapshots": snaps}))  # the full inventory, for the report
    settle(cg, health.gpu_count_checks(snaps, cg.setting("gpus_per_node", None)), "gpu_count")


def test_gpu_model(cg: Recorder) -> None:
    """Every GPU is the profile's model (gpu_name is a substring of NVML's name)."""
    expected = _needs(cg, "gpu_name")
    snaps = _snapshots(cg)
    settle(cg, [health.check_model(s, str(expected)) for s in snaps], "gpu_model")


@pytest.mark.metrics("gpu_memory_gib")
def test_gpu_memory(cg: Recorder) -> None:
    """Memory visible to CUDA per GPU, judged against the profile's minimum."""
    snaps = _snapshots(cg)
    settle(cg, [health.check_gpu_present(s) for s in snaps], "gpu_memory")
    gpu = snaps[cg.rank]["gpu"]  # present: settle failed this rank otherwise
    cg.record("gpu_memory_gib", gpu["memory_total_bytes"] / GiB, "GiB",
              description="memory visible to CUDA per GPU (totalGlobalMem; NVML's total is in the inventory)")


def test_gpu_uuids_distinct(cg: Recorder) -> None:
    """Each rank on its own GPU: no UUID on two ranks."""
    settle(cg, health.check_uuids_distinct(_snapshots(cg)), "gpu_uuids")


@pytest.mark.metrics(processes.METRIC)
def test_no_foreign_gpu_processes(cg: Recorder) -> None:
    """Nothing but this job's ranks (and their children) runs on any GPU: a process of another job (NVML's
    compute and graphics process lists) fails its GPU, named with pid, name and memory. Early, before any
    figure is measured on a GPU another job shares."""
    skip_on_cpu_profile(cg)
    own = cg.all_ranks(processes.own_process(cg.device))
    try:
        listing = processes.read(cg.device, host_root())
    except Exception as exc:  # must still join the gather; the check fails this rank on it
        listing = processes.failed_read(exc)
    checks = [processes.judge(seen, own) for seen in cg.all_ranks(listing)]
    mine = checks[cg.rank].value
    if isinstance(mine, dict) and "foreign" in mine:
        cg.record(processes.METRIC, mine["foreign"], "count",
                  description="processes on the GPU that are not this job's ranks (NVML's process lists)")
    settle(cg, checks, "foreign_processes")


def test_ecc_enabled(cg: Recorder) -> None:
    settle(cg, [health.check_ecc_enabled(s) for s in _snapshots(cg)], "ecc_enabled")


def test_no_uncorrectable_ecc_errors(cg: Recorder) -> None:
    """No uncorrectable (volatile) ECC error since the driver loaded."""
    settle(cg, [health.check_no_uncorrectable_ecc(s) for s in _snapshots(cg)], "uncorrectable_ecc")


def test_no_pending_memory_repair(cg: Recorder) -> None:
    """No page retirement or row remapping waiting for a GPU reset."""
    settle(cg, [health.check_no_pending_memory_repair(s) for s in _snapshots(cg)], "pending_memory_repair")


def test_no_row_remap_failure(cg: Recorder) -> None:
    settle(cg, [health.check_no_remap_failure(s) for s in _snapshots(cg)], "row_remap_failure")


def test_no_clock_slowdown(cg: Recorder) -> None:
    """No hardware-slowdown, thermal or power-brake reason active; temperature, power, clocks recorded."""
    settle(cg, [health.check_no_throttle(s) for s in _snapshots(cg)], "clock_slowdown")


def test_pcie_link(cg: Recorder) -> None:
    """PCIe link under load at the profile's generation/width, else at the link's maximum."""
    snaps = _snapshots(cg, pcie_load_s=PCIE_LOAD_S)
    gen, width = cg.setting("pcie_generation", None), cg.setting("pcie_width", None)
    settle(cg, [health.check_pcie_link(s, gen, width) for s in snaps], "pcie_link")


def test_nvlinks_active(cg: Recorder) -> None:
    """The profile's nvlinks_per_gpu links active (without one: every link NVML lists)."""
    snaps = _snapshots(cg)
    settle(cg, [health.check_nvlinks(s, cg.setting("nvlinks_per_gpu", None)) for s in snaps], "nvlinks")


def test_mig_mode(cg: Recorder) -> None:
    expected = _needs(cg, "mig_mode")
    snaps = _snapshots(cg)
    settle(cg, [health.check_mig_mode(s, str(expected)) for s in snaps], "mig_mode")


def test_software_versions_identical(cg: Recorder) -> None:
    """Driver, CUDA (driver and torch's runtime) and NCCL the same on every rank of every node."""
    settle(cg, health.check_versions_identical(_snapshots(cg)), "software_versions")


def test_driver_version_minimum(cg: Recorder) -> None:
    minimum = _needs(cg, "min_driver_version")
    snaps = _snapshots(cg)
    settle(cg, [health.check_driver_at_least(s, str(minimum)) for s in snaps], "driver_minimum")

