"""What NVML says about this rank's GPU: inventory, health counters, links, clocks, versions.

``snapshot(device)`` returns a plain JSON-serialisable dict; every judgement is a pure function
over such dicts (``workloads.gpu.health``), so captured snapshots replay without a GPU. A field
NVML does not support lands in ``snapshot["unsupported"]`` ("not supported"), a field NVML failed
to read in ``snapshot["errors"]``: neither is ever silently taken as healthy.

Run alone: torchrun --nproc-per-node=8 -m workloads.gpu.inventory [--pcie-load] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from workloads.clocks import device_handle, init_nvml
from workloads.node.name import node_name

if TYPE_CHECKING:  # torch only where a CUDA device is read: the NVML readers run without it (clustergate health)
    import torch

SCHEMA = 1
NOT_SUPPORTED = "not supported"

_NOT_SUPPORTED_CODES = (3, 13)  # NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_FUNCTION_NOT_FOUND
_NO_SUCH_LINK_CODES = (2, 3)  # INVALID_ARGUMENT, NOT_SUPPORTED: the link does not exist


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _cuda_version(v: int) -> str:
    return f"{v // 1000}.{v % 1000 // 10}"


class _Reader:
    """Calls NVML, sorting each failure into 'not supported' or an error, field by field."""

    def __init__(self, nvml: Any) -> None:
        self.nvml = nvml
        self.values: dict[str, Any] = {}
        self.unsupported: dict[str, str] = {}
        self.errors: dict[str, str] = {}

    def read(self, fields: str | tuple[str, ...], fn: Callable[..., Any] | None, *args: Any,
             convert: Callable[[Any], Any] = lambda v: v) -> None:
        names = (fields,) if isinstance(fields, str) else fields
        if fn is None:  # an nvidia-ml-py older than the call: NVML cannot be asked
            self.unsupported.update({name: f"{NOT_SUPPORTED} (this nvidia-ml-py lacks the call)" for name in names})
            return
        try:
            raw = fn(*args)
        except self.nvml.NVMLError as exc:
            code = getattr(exc, "value", None)
            for name in names:
                if code in _NOT_SUPPORTED_CODES:
                    self.unsupported[name] = f"{NOT_SUPPORTED} ({exc})"
                else:
                    self.errors[name] = f"{type(exc).__name__}: {exc}"
            return
        out = convert(raw)
        self.values.update(dict(zip(names, out, strict=True)) if len(names) > 1 else {names[0]: out})


def read_identity(r: _Reader, h: Any) -> None:
    """Which GPU this is: name, UUID, serial, NVML index, PCI address, VBIOS."""
    nvml = r.nvml
    r.read("name", nvml.nvmlDeviceGetName, h, convert=_text)
    r.read("uuid", nvml.nvmlDeviceGetUUID, h, convert=_text)
    r.read("serial", nvml.nvmlDeviceGetSerial, h, convert=_text)
    r.read("index", nvml.nvmlDeviceGetIndex, h, convert=int)
    r.read("pci_bus_id", lambda: nvml.nvmlDeviceGetPciInfo(h).busId, convert=_text)
    r.read("vbios_version", nvml.nvmlDeviceGetVbiosVersion, h, convert=_text)
    # The InfoROM's image version (G520.0282.02.02) and its OEM object's: what nvidia-smi -q shows as the InfoROM.
    r.read("inforom_image_version", getattr(nvml, "nvmlDeviceGetInforomImageVersion", None), h, convert=_text)
    r.read("inforom_oem_version", getattr(nvml, "nvmlDeviceGetInforomVersion", None), h, 0,  # NVML_INFOROM_OEM
           convert=_text)


def read_gpu(nvml: Any, handle: Any) -> tuple[dict[str, Any], dict[str, str], dict[str, str]]:
    """Every field this suite judges or records, from one NVML device handle."""
    r, h = _Reader(nvml), handle
    read_identity(r, h)
    r.read("nvml_memory_total_bytes", lambda: nvml.nvmlDeviceGetMemoryInfo(h).total, convert=int)
    r.read(("ecc_mode_current", "ecc_mode_pending"), nvml.nvmlDeviceGetEccMode, h,
           convert=lambda v: (bool(v[0]), bool(v[1])))
    r.read("ecc_uncorrected_volatile", nvml.nvmlDeviceGetTotalEccErrors, h, 1, 0, convert=int)  # UNCORRECTED, VOLATILE
    r.read("ecc_corrected_volatile", nvml.nvmlDeviceGetTotalEccErrors, h, 0, 0, convert=int)
    r.read("retired_pages_pending", nvml.nvmlDeviceGetRetiredPagesPendingStatus, h, convert=bool)
    r.read(("remapped_rows_correctable", "remapped_rows_uncorrectable", "remap_pending", "remap_failure"),
           nvml.nvmlDeviceGetRemappedRows, h, convert=lambda v: (int(v[0]), int(v[1]), bool(v[2]), bool(v[3])))
    reasons = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
        nvml.nvmlDeviceGetCurrentClocksThrottleReasons
    r.read("clock_event_reasons", reasons, h, convert=int)
    r.read("pcie_gen_current", nvml.nvmlDeviceGetCurrPcieLinkGeneration, h, convert=int)
    r.read("pcie_width_current", nvml.nvmlDeviceGetCurrPcieLinkWidth, h, convert=int)
    r.read("pcie_gen_max", nvml.nvmlDeviceGetMaxPcieLinkGeneration, h, convert=int)
    r.read("pcie_width_max", nvml.nvmlDeviceGetMaxPcieLinkWidth, h, convert=int)
    r.read("pcie_gen_gpu_max", nvml.nvmlDeviceGetGpuMaxPcieLinkGeneration, h, convert=int)
    r.read(("mig_mode_current", "mig_mode_pending"), nvml.nvmlDeviceGetMigMode, h,
           convert=lambda v: (int(v[0]), int(v[1])))
    r.read("temperature_c", nvml.nvmlDeviceGetTemperature, h, 0, convert=int)  # NVML_TEMPERATURE_GPU
    r.read("temperature_slowdown_c", nvml.nvmlDeviceGetTemperatureThreshold, h, 1, convert=int)
    r.read("power_w", nvml.nvmlDeviceGetPowerUsage, h, convert=lambda mw: mw / 1000)
    r.read("power_limit_w", nvml.nvmlDeviceGetEnforcedPowerLimit, h, convert=lambda mw: mw / 1000)
    r.read("power_limit_default_w", getattr(nvml, "nvmlDeviceGetPowerManagementDefaultLimit", None), h,
           convert=lambda mw: mw / 1000)
    r.read(("power_limit_min_w", "power_limit_max_w"), getattr(nvml, "nvmlDeviceGetPowerManagementLimitConstraints",
                                                                None), h, convert=lambda v: (v[0] / 1000, v[1] / 1000))
    r.read("sm_clock_mhz", nvml.nvmlDeviceGetClockInfo, h, 1, convert=int)  # NVML_CLOCK_SM
    r.read("mem_clock_mhz", nvml.nvmlDeviceGetClockInfo, h, 2, convert=int)  # NVML_CLOCK_MEM
    r.read("sm_clock_max_mhz", nvml.nvmlDeviceGetMaxClockInfo, h, 1, convert=int)
    r.read("mem_clock_max_mhz", nvml.nvmlDeviceGetMaxClockInfo, h, 2, convert=int)
    _read_nvlinks(r, h)
    return r.values, r.unsupported, r.errors


def _read_nvlinks(r: _Reader, handle: Any) -> None:
    """Per-link state: links that do not exist answer 'invalid argument' or 'not supported'."""
    nvml = r.nvml
    states: list[dict[str, Any]] = []
    for link in range(int(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18))):
        try:
            states.append({"link": link, "active": int(nvml.nvmlDeviceGetNvLinkState(handle, link)) == 1})
        except nvml.NVMLError as exc:
            if getattr(exc, "value", None) not in _NO_SUCH_LINK_CODES:
                r.errors["nvlink_states"] = f"link {link}: {type(exc).__name__}: {exc}"
                return
    if states:
        r.values["nvlink_states"] = states
    else:
        r.unsupported["nvlink_states"] = f"{NOT_SUPPORTED} (NVML reports no NVLink on this GPU)"


def _pcie_under_load(nvml: Any, handle: Any, device: torch.device, seconds: float) -> dict[str, int]:
    """Highest PCIe generation/width seen while host-to-device copies run.

    An idle GPU trains its link down to save power (Gen1 at idle is normal): only a link under
    load says what it can reach.
    """
    import torch

    host = torch.empty(64 << 20, dtype=torch.uint8).pin_memory()
    dev = torch.empty(host.shape, dtype=torch.uint8, device=device)
    gen = width = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for _ in range(4):
            dev.copy_(host, non_blocking=True)
        gen = max(gen, int(nvml.nvmlDeviceGetCurrPcieLinkGeneration(handle)))
        width = max(width, int(nvml.nvmlDeviceGetCurrPcieLinkWidth(handle)))
        torch.cuda.synchronize(device)
    return {"pcie_gen_current": gen, "pcie_width_current": width}


def nvml_snapshot(nvml: Any, handle: Any) -> dict[str, Any]:
    """One GPU as NVML alone describes it, in ``snapshot``'s layout, so ``workloads.gpu.health`` judges it alike:
    no torch, no CUDA context (``clustergate health``). ``gpu`` holds NVML's fields (its name, and its memory
    total as ``nvml_memory_total_bytes``); ``software`` the driver and the CUDA version it supports."""
    values, unsupported, errors = read_gpu(nvml, handle)
    software: dict[str, Any] = {}
    for key, fn, convert in (("driver", nvml.nvmlSystemGetDriverVersion, _text),
                             ("cuda_driver", nvml.nvmlSystemGetCudaDriverVersion, lambda v: _cuda_version(int(v)))):
        try:
            software[key] = convert(fn())
        except nvml.NVMLError as exc:
            errors[key] = f"{type(exc).__name__}: {exc}"
    return {"schema": SCHEMA, "gpu": values, "unsupported": unsupported, "errors": errors, "software": software,
            "nvml": {"ok": True, "error": None}}


def snapshot(device: torch.device, *, pcie_load_s: float = 0.0) -> dict[str, Any]:
    """This rank's view of its GPU and node, as plain data (see the module docstring)."""
    import torch

    from workloads.common import place

    here = place()
    snap: dict[str, Any] = {
        "schema": SCHEMA, "rank": here.rank, "local_rank": here.local_rank, "node_rank": here.node_rank,
        "host": node_name(), "device": str(device),
        "cuda_device_count": torch.cuda.device_count() if torch.cuda.is_available() else 0,
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "software": {"torch": torch.__version__, "torch_cuda": torch.version.cuda},
        "nvml": {"ok": False, "error": None}, "gpu": None, "unsupported": {}, "errors": {},
    }
    if device.type != "cuda":
        snap["nvml"]["error"] = (f"torch {torch.__version__} (CUDA {torch.version.cuda}) sees no CUDA device: "
                                 f"torch.cuda.is_available() is {torch.cuda.is_available()}")
        return snap
    props = torch.cuda.get_device_properties(device)
    snap["software"]["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    gpu: dict[str, Any] = {"name": props.name, "memory_total_bytes": int(props.total_memory),
                           "capability": f"{props.major}.{props.minor}", "sm_count": props.multi_processor_count}
    if getattr(props, "uuid", None) is not None:
        gpu["uuid"] = f"GPU-{props.uuid}"
    snap["gpu"] = gpu
    try:
        nvml = init_nvml()
        handle = device_handle(nvml, device)
        snap["nvml"]["device_count"] = int(nvml.nvmlDeviceGetCount())
        snap["software"]["driver"] = _text(nvml.nvmlSystemGetDriverVersion())
    except Exception as exc:  # ImportError or NVMLError: the reason is reported, the checks fail on it
        snap["nvml"]["error"] = f"NVML unavailable: {type(exc).__name__}: {exc}"
        return snap
    values, snap["unsupported"], snap["errors"] = read_gpu(nvml, handle)
    try:
        snap["software"]["cuda_driver"] = _cuda_version(int(nvml.nvmlSystemGetCudaDriverVersion()))
    except nvml.NVMLError as exc:
        snap["errors"]["cuda_driver"] = f"{type(exc).__name__}: {exc}"
    gpu.update(values)
    if pcie_load_s > 0:
        try:
            gpu.update(_pcie_under_load(nvml, handle, device, pcie_load_s))
            gpu["pcie_measured_under_load"] = True
        except nvml.NVMLError as exc:
            snap["errors"]["pcie_gen_current"] = f"under load: {type(exc).__name__}: {exc}"
    snap["nvml"]["ok"] = True
    return snap


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pcie-load", type=float, default=0.5, metavar="SECONDS",
                        help="read the PCIe link while copying for this long (0: idle reading)")
    parser.add_argument("--out", default=None,
                        help="write every rank's snapshot as JSON here (rank 0), in the layout tests/data/gpu uses")
    args = parser.parse_args()
    from workloads.common import distributed, gather_objects

    with distributed() as here:
        mine = snapshot(here.device, pcie_load_s=args.pcie_load)
        everyone = gather_objects(mine)
        if here.rank == 0:
            # The layout tests/data/gpu/*.json replay: a capture can be dropped in as it is.
            text = json.dumps({"source": f"captured by workloads.gpu.inventory on {mine['host']} "
                                         f"({here.world_size} ranks, {time.strftime('%Y-%m-%d')})",
                               "snapshots": everyone}, indent=1)
            if args.out:
                with open(args.out, "w") as f:
                    f.write(text + "\n")
            else:
                print(text)


if __name__ == "__main__":
    main()
