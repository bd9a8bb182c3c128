"""Thermal margin under load and power limits: how close a GPU runs to its slowdown, and what it may draw.

A GPU that stays out of slowdown through a short hold but only a few degrees from it slows a long job (NVIDIA's
NVSentinel watches the margin, ``GpuThermalMarginWatch``, NVIDIA/NVSentinel PR #1371); a GPU whose enforced power
limit is set below its default, or below its peers', runs slower than they do and passes every check that holds
its draw to its own limit (the same for the clocks: azurehpc-health-checks' ``azure_gpu_app_clocks.nhc`` holds
every GPU's application clocks at their maximum). Nothing here sets a limit: a capped GPU fails, named.

The margin is NVML's margin temperature (degrees C to the nearest slowdown threshold), sampled with the clocks
through the sustained hold (``workloads.clocks.ClockSampler``); its minimum is the figure. The power limits are
the snapshot's (``workloads.gpu.inventory``): enforced, default, and the board's constraints. Pure functions
over those readings; where NVML does not offer one (a driver before 570, a VM) they say which, never a figure.
"""

from __future__ import annotations

from typing import Any

from workloads.result import Metric, Result, WorkloadError

MARGIN_METRIC = "thermal_margin_min_c"
LIMIT_METRIC = "power_limit_w"
DEFAULT_FRACTION_METRIC = "power_limit_default_fraction"


def margin_missing(run: dict[str, Any]) -> str | None:
    """Why the sustained hold has no margin reading (None where it has one): NVML does not offer it. Clocks nobody
    could watch on a GPU are a failure instead (``margin_result``)."""
    clocks = run["clocks"]
    if clocks.get("status") != "sampled" or "margin_temperature_c" in clocks:
        return None
    return f"{run['what']}: NVML margin temperature {clocks.get('margin_temperature_status', 'not sampled')}"


def margin_result(run: dict[str, Any]) -> Result:
    """The least margin to slowdown seen through the sustained hold, per GPU (WorkloadError where the clocks could
    not be watched on a GPU)."""
    clocks = run["clocks"]
    if clocks.get("status") != "sampled":
        raise WorkloadError(f"{run['what']}: the margin temperature could not be watched ({clocks.get('status')}): "
                            "install nvidia-ml-py")
    margin = clocks["margin_temperature_c"]
    details = {"margin_temperature_c": margin, "temperature_c": clocks.get("temperature_c"),
               "power_w": clocks.get("power_w"), "samples": clocks.get("samples")}
    return Result(metrics=(Metric(MARGIN_METRIC, float(margin["min"]), "C", "gpu",
                                  "least NVML margin temperature (degrees to the nearest slowdown threshold) "
                                  "through the sustained matmul, 0.1 s samples"),), details=details)


def limits_missing(snap: dict[str, Any], fields: tuple[str, ...]) -> str | None:
    """Why a rank's snapshot lacks one of the power-limit ``fields`` (None where it has them all)."""
    gpu = snap.get("gpu")
    if gpu is None or not (snap.get("nvml") or {}).get("ok"):
        return f"no NVML reading: {(snap.get('nvml') or {}).get('error')}"
    gone = [f"{f}: {(snap.get('unsupported') or {}).get(f) or (snap.get('errors') or {}).get(f) or 'not read'}"
            for f in fields if gpu.get(f) is None]
    return "; ".join(gone) or None


def limits_details(snap: dict[str, Any]) -> dict[str, Any]:
    """The power limits a snapshot read, for the report's per-rank table."""
    gpu = snap.get("gpu") or {}
    return {k: gpu.get(k) for k in ("power_limit_w", "power_limit_default_w", "power_limit_min_w",
                                    "power_limit_max_w")}


def enforced_result(snap: dict[str, Any]) -> Result:
    """The enforced power limit per GPU: the criterion's outlier bound holds it to the node's and the fleet's GPUs."""
    return Result(metrics=(Metric(LIMIT_METRIC, float(snap["gpu"]["power_limit_w"]), "W", "gpu",
                                  "enforced power limit (NVML), held to the node's other GPUs"),),
                  details={"power_limits": limits_details(snap)})


def default_fraction_result(snap: dict[str, Any]) -> Result:
    """The enforced power limit over the GPU's default (NVML's power management default): below 1 the GPU was
    capped (nvidia-smi -pl, a site's power policy)."""
    gpu = snap["gpu"]
    fraction = float(gpu["power_limit_w"]) / float(gpu["power_limit_default_w"])
    return Result(metrics=(Metric(DEFAULT_FRACTION_METRIC, fraction, "fraction", "gpu",
                                  "enforced power limit / the GPU's default power limit (NVML)"),),
                  details={"power_limits": limits_details(snap)})
