"""What the GPU acceptance tests share: profile questions, gathered snapshots, one verdict per check.

Every helper that talks to other ranks is called on every rank, and nothing here raises on some
ranks before the last exchange: a rank whose workload failed still joins the gather, then raises.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from clustergate.criteria.thresholds import expects_gpus
from clustergate.run.recorder import Recorder
from workloads.gpu import inventory as gpu_inventory
from workloads.gpu.health import Check
from workloads.result import Result, WorkloadError

CPU_SKIP = "cpu profile: no GPU"
PER_RANK_DROP = ("intervals",)
"""Long per-rank series kept only in rank 0's own details, not in the gathered table."""


def expects_gpu(cg: Recorder) -> bool:
    """Every profile but the CPU one (gpus_per_node: 0) expects a GPU per rank."""
    return expects_gpus(cg.setting("gpus_per_node", None))


def skip_on_cpu_profile(cg: Recorder, why: str = "") -> None:
    if not expects_gpu(cg):
        cg.skip(CPU_SKIP + (f" ({why})" if why else ""), fact="no_gpu")


def require_device(cg: Recorder, *, gpu_only: bool = False) -> None:
    """CPU profile: skip GPU-only tests. GPU profile: fail each rank without a GPU, naming it."""
    if gpu_only:
        skip_on_cpu_profile(cg)
    if not expects_gpu(cg):
        return
    mine = None
    if cg.device.type != "cuda":
        mine = (f"profile {cg.profile_name!r} expects a GPU per rank, but this rank has none "
                f"(torch.cuda.is_available() is {torch.cuda.is_available()}, torch {torch.__version__}, "
                f"CUDA {torch.version.cuda}): check nvidia-smi, the driver, a CUDA build of torch and "
                "CUDA_VISIBLE_DEVICES, or run with --profile cpu")
    everyone = cg.all_ranks(mine)
    if mine:
        pytest.fail(mine, pytrace=False)
    bad = [r for r, problem in enumerate(everyone) if problem]
    if bad:
        cg.skip(f"not measured: ranks {bad} have no GPU", fact=None)  # those ranks fail the test


def snapshots(cg: Recorder, *, pcie_load_s: float = 0.0) -> list[dict[str, Any]]:
    """Every rank's GPU snapshot, on every rank."""
    try:
        mine = gpu_inventory.snapshot(cg.device, pcie_load_s=pcie_load_s)
    except Exception as exc:  # must still join the gather; the checks fail this rank on it
        mine = {"rank": cg.rank, "host": cg.identities[cg.rank]["host"], "gpu": None,
                "nvml": {"ok": False, "error": f"snapshot failed: {type(exc).__name__}: {exc}"},
                "cuda_device_count": torch.cuda.device_count() if torch.cuda.is_available() else 0}
    return cg.all_ranks(mine)


def where(cg: Recorder, rank: int) -> dict[str, Any]:
    ident = cg.identities[rank]
    gpu = ident.get("gpu") or {}
    return {"rank": rank, "host": ident["host"], "gpu_index": gpu.get("index"), "gpu_serial": gpu.get("serial")}


def settle(cg: Recorder, checks: list[Check], title: str) -> None:
    """One verdict from every rank's check (every rank holds the same list).

    The per-rank table goes into the report; a rank whose check failed fails (the plugin names its
    host, GPU index and serial); if none failed but NVML could not say on some rank, the test is
    skipped on every rank with that reason, never passed.
    """
    cg.record_result(Result(metrics=(), details={title: [{**where(cg, r), **c.as_dict()}
                                                         for r, c in enumerate(checks)]}))
    unsupported = [r for r, c in enumerate(checks) if c.status == "unsupported"]
    mine = checks[cg.rank]
    if mine.status == "fail":
        also = f" (not supported on ranks {unsupported})" if unsupported else ""
        pytest.fail(f"{title}: {mine.message}{also}", pytrace=False)
    if any(c.status == "fail" for c in checks):
        return  # the failing ranks fail the test and are named there
    if unsupported:
        first = unsupported[0]
        cg.skip(f"{title}: not supported on {len(unsupported)}/{len(checks)} ranks (first rank {first} on "
                f"{cg.identities[first]['host']}): {checks[first].message}", fact="unsupported")


def measure(cg: Recorder, workload: Callable[[], Result]) -> Result | None:
    """Run a workload on this rank, gather every rank's details, then record (or raise)."""
    try:
        result, error = workload(), None
    except Exception as exc:  # re-raised below, once this rank has joined the gather
        result, error = None, exc
    brief = {"error": f"{type(error).__name__}: {error}"} if error else \
        {k: v for k, v in result.details.items() if k not in PER_RANK_DROP}  # type: ignore[union-attr]
    everyone = cg.all_ranks(brief)
    if isinstance(error, WorkloadError):
        pytest.fail(str(error), pytrace=False)  # its message says what was checked, seen, and what to try
    if error is not None:
        raise error
    assert result is not None
    cg.record_result(result)
    cg.record_result(Result(metrics=(), details={"per_rank": [{**where(cg, r), **d} for r, d in enumerate(everyone)]}))
    return result
