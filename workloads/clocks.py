"""Clock sampling: SM and memory clocks, clock event reasons, power and temperature next to a figure.

A low TFLOPS or bandwidth figure under a thermal or power cap is a different finding from a slow
part, so every workload that times the GPU can sample its clocks alongside:
``with ClockSampler(device) as clocks: ...; clocks.summary()``. Shared by every area (the GPU
workloads and training alike); NVML's reason bits live here once.
"""

from __future__ import annotations

import statistics
import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch is imported where a CUDA device is asked about: the NVML readers run without it
    import torch

# NVML clock event ("throttle") reason bits, as nvml.h defines them (stable ABI values).
CLOCK_EVENT_REASONS = {
    0x1: "gpu_idle", 0x2: "applications_clocks_setting", 0x4: "sw_power_cap", 0x8: "hw_slowdown",
    0x10: "sync_boost", 0x20: "sw_thermal_slowdown", 0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown", 0x100: "display_clock_setting",
}
BAD_CLOCK_EVENTS = 0x8 | 0x20 | 0x40 | 0x80
"""Reasons that mean a fault or a cooling/power problem (a power cap under load is normal)."""


def reason_names(mask: int) -> list[str]:
    return [name for bit, name in CLOCK_EVENT_REASONS.items() if mask & bit]


def init_nvml() -> Any:
    """pynvml, initialised (ImportError or NVMLError where there is none)."""
    import pynvml

    pynvml.nvmlInit()
    return pynvml


def device_handle(nvml: Any, device: torch.device) -> Any:
    """NVML's handle of a CUDA device, by UUID (CUDA and NVML may number GPUs differently)."""
    import torch

    uuid = getattr(torch.cuda.get_device_properties(device), "uuid", None)
    if uuid is not None:
        return nvml.nvmlDeviceGetHandleByUUID(f"GPU-{uuid}")
    return nvml.nvmlDeviceGetHandleByIndex(device.index or 0)


class ClockSampler:
    """Samples SM/memory clocks, clock event reasons, power and temperature in a thread.

    Use around a measurement: ``with ClockSampler(device) as clocks: ...; clocks.summary()``.
    On CPU, or without NVML, the summary says so instead of inventing figures.
    """

    def __init__(self, device: torch.device, period_s: float = 0.1) -> None:
        self.device, self.period_s = device, period_s
        self.samples: list[dict[str, float]] = []
        self.status = "sampled"
        self.margin_status = "sampled"
        """Whether NVML's margin temperature (degrees to the nearest slowdown threshold) is read with each sample:
        a driver before 570, or a VM, does not offer it, which says so here and leaves the other readings be."""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> ClockSampler:
        if self.device.type != "cuda":
            self.status = "not applicable: CPU device"
            return self
        try:
            nvml = init_nvml()
            handle = device_handle(nvml, self.device)
        except Exception as exc:
            self.status = f"NVML unavailable: {type(exc).__name__}: {exc}"
            return self
        self._thread = threading.Thread(target=self._loop, args=(nvml, handle), daemon=True)
        self._thread.start()
        return self

    def _loop(self, nvml: Any, handle: Any) -> None:
        reasons = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
            nvml.nvmlDeviceGetCurrentClocksThrottleReasons
        while not self._stop.is_set():
            try:
                sample = {
                    "sm_clock_mhz": nvml.nvmlDeviceGetClockInfo(handle, 1),
                    "mem_clock_mhz": nvml.nvmlDeviceGetClockInfo(handle, 2),
                    "reasons": int(reasons(handle)),
                    "power_w": nvml.nvmlDeviceGetPowerUsage(handle) / 1000,
                    "temperature_c": nvml.nvmlDeviceGetTemperature(handle, 0),
                }
            except nvml.NVMLError as exc:
                self.status = f"NVML error while sampling: {type(exc).__name__}: {exc}"
                return
            if self.margin_status == "sampled":
                self._margin(nvml, handle, sample)
            self.samples.append(sample)
            self._stop.wait(self.period_s)

    def _margin(self, nvml: Any, handle: Any, sample: dict[str, float]) -> None:
        """The margin temperature into ``sample``, or why it cannot be read into ``margin_status`` (then never
        asked again: a missing reading is the same on every call)."""
        fn = getattr(nvml, "nvmlDeviceGetMarginTemperature", None)
        if fn is None:
            self.margin_status = "not supported: this nvidia-ml-py has no nvmlDeviceGetMarginTemperature"
            return
        try:
            value = fn(handle)
        except nvml.NVMLError as exc:
            self.margin_status = f"not supported: nvmlDeviceGetMarginTemperature: {type(exc).__name__}: {exc}"
            return
        sample["margin_temperature_c"] = float(getattr(value, "marginTemperature", value))

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def summary(self) -> dict[str, Any]:
        out = summarize_clock_samples(self.samples, self.status)
        if out.get("samples") and "margin_temperature_c" not in out:
            out["margin_temperature_status"] = self.margin_status
        return out


def summarize_clock_samples(samples: list[dict[str, float]], status: str = "sampled") -> dict[str, Any]:
    """Min/median/max of each sampled quantity, and the fraction of samples each reason was set."""
    if not samples:
        return {"status": status if status != "sampled" else "no samples (run shorter than one period)"}
    out: dict[str, Any] = {"status": status, "samples": len(samples)}
    for key in ("sm_clock_mhz", "mem_clock_mhz", "power_w", "temperature_c", "margin_temperature_c"):
        values = [s[key] for s in samples if key in s]
        if not values:  # the margin where NVML does not offer it (ClockSampler says why)
            continue
        out[key] = {"min": min(values), "median": statistics.median(values), "max": max(values)}
    seen: dict[str, float] = {}
    for bit, name in CLOCK_EVENT_REASONS.items():
        share = sum(1 for s in samples if int(s["reasons"]) & bit) / len(samples)
        if share:
            seen[name] = round(share, 3)
    out["clock_event_reasons"] = seen
    out["bad_clock_events"] = [name for bit, name in CLOCK_EVENT_REASONS.items()
                               if bit & BAD_CLOCK_EVENTS and name in seen]
    return out
