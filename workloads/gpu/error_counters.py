"""A GPU's error counters through NVML, read before and after the run: ECC, memory repair, PCIe
replays, NVLink errors per link; and what a vendor's support asks for (serial, VBIOS, InfoROM, board).

``read(nvml, handle)`` takes the NVML module as an argument (the suite's tests pass a fake one) and
returns plain data: ``counters`` is a ``workloads.counters`` snapshot with part ``gpu`` for the board's
counters and ``link N`` for each NVLink. NVLink counters are read as NVML field values with the link
as scope (``NVML_FI_DEV_NVLINK_ERROR_DL_*``, what DCGM reads on Hopper), falling back to the older
``nvmlDeviceGetNvLinkErrorCounter``. A field NVML does not support lands in ``unsupported``, one it
failed to read in ``errors``: neither is ever taken as zero.
"""

from __future__ import annotations

from typing import Any

from workloads.gpu.inventory import _NO_SUCH_LINK_CODES, NOT_SUPPORTED, _Reader, _text, read_identity

GPU_PART = "gpu"
METRICS: dict[str, tuple[tuple[str, ...], str]] = {
    "ecc_uncorrected_delta": (("ecc_uncorrected_volatile",), "uncorrectable_ecc"),
    "ecc_corrected_delta": (("ecc_corrected_volatile",), "corrected_ecc"),
    "memory_repairs_delta": (("remapped_rows_correctable", "remapped_rows_uncorrectable", "retired_pages_sbe",
                              "retired_pages_dbe"), "memory_repair"),
    "nvlink_crc_errors_delta": (("crc",), "nvlink_crc"),
    "nvlink_replay_errors_delta": (("replay",), "nvlink"),
    "nvlink_recovery_errors_delta": (("recovery",), "nvlink"),
}
"""Metric -> (counters summed into it, its failure category in workloads.faults)."""

PENDING = ("remap_pending", "retired_pages_pending")
"""Memory repairs waiting for a GPU reset (states, judged after the run, not as growth)."""
SOURCES: dict[str, tuple[str, ...]] = {
    **{metric: names for metric, (names, _) in METRICS.items()},
    "memory_repair_pending": PENDING, "pcie_replays_per_min": ("pcie_replay",), "nvlink_crc_errors_per_s": ("crc",),
}
"""Every GPU metric -> the counters it is computed from (to say why a metric could not be read)."""

FIELD_DL_REPLAY, FIELD_DL_RECOVERY, FIELD_DL_CRC = 161, 162, 163
"""NVML_FI_DEV_NVLINK_ERROR_DL_{REPLAY,RECOVERY,CRC} (nvml.h), read with the link as scope id."""
LEGACY_COUNTERS = {"replay": (0,), "recovery": (1,), "crc": (2, 3)}
"""nvmlNvLinkErrorCounter_t: DL_REPLAY 0, DL_RECOVERY 1, DL_CRC_FLIT 2 + DL_CRC_DATA 3."""
_VALUE_FIELDS = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}


def _identity(r: _Reader, h: Any) -> None:
    """inventory's identity fields, and what a vendor's support asks for besides."""
    nvml = r.nvml
    read_identity(r, h)
    r.read("board_part_number", nvml.nvmlDeviceGetBoardPartNumber, h, convert=_text)
    r.read("inforom_image", nvml.nvmlDeviceGetInforomImageVersion, h, convert=_text)
    r.read("driver", nvml.nvmlSystemGetDriverVersion, convert=_text)


def _board_counters(r: _Reader, h: Any) -> None:
    nvml = r.nvml
    r.read("ecc_corrected_volatile", nvml.nvmlDeviceGetTotalEccErrors, h, 0, 0, convert=int)  # CORRECTED, VOLATILE
    r.read("ecc_uncorrected_volatile", nvml.nvmlDeviceGetTotalEccErrors, h, 1, 0, convert=int)
    r.read(("remapped_rows_correctable", "remapped_rows_uncorrectable", "remap_pending"),
           nvml.nvmlDeviceGetRemappedRows, h, convert=lambda v: (int(v[0]), int(v[1]), int(bool(v[2]))))
    r.read("retired_pages_sbe", nvml.nvmlDeviceGetRetiredPages, h, 0, convert=len)  # MULTIPLE_SINGLE_BIT
    r.read("retired_pages_dbe", nvml.nvmlDeviceGetRetiredPages, h, 1, convert=len)  # DOUBLE_BIT
    r.read("retired_pages_pending", nvml.nvmlDeviceGetRetiredPagesPendingStatus, h, convert=lambda v: int(bool(v)))
    r.read("pcie_replay", nvml.nvmlDeviceGetPcieReplayCounter, h, convert=int)


def _field(fv: Any) -> int | None:
    if int(getattr(fv, "nvmlReturn", 1)) != 0:
        return None
    return int(getattr(fv.value, _VALUE_FIELDS.get(int(fv.valueType), "ullVal")))


def _link_errors(nvml: Any, h: Any, link: int) -> tuple[dict[str, int] | None, str]:
    """One link's replay/recovery/CRC counts, or (None, why not)."""
    try:
        fvs = nvml.nvmlDeviceGetFieldValues(h, [(FIELD_DL_REPLAY, link), (FIELD_DL_RECOVERY, link),
                                                (FIELD_DL_CRC, link)])
        values = [_field(fv) for fv in fvs]
        if all(v is not None for v in values):
            return dict(zip(("replay", "recovery", "crc"), values, strict=True)), "field values"  # type: ignore[arg-type]
    except nvml.NVMLError:
        pass  # older drivers: the per-link error counter API below
    out: dict[str, int] = {}
    try:
        for name, codes in LEGACY_COUNTERS.items():
            out[name] = sum(int(nvml.nvmlDeviceGetNvLinkErrorCounter(h, link, c)) for c in codes)
    except nvml.NVMLError as exc:
        return None, f"{type(exc).__name__}: {exc}"
    return out, "nvmlDeviceGetNvLinkErrorCounter"


def _nvlinks(nvml: Any, h: Any) -> tuple[dict[str, dict[str, int]], str | None]:
    """Error counters of every NVLink the GPU has, or why there are none to read."""
    links: dict[str, dict[str, int]] = {}
    why = ""
    for link in range(int(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18))):
        try:
            nvml.nvmlDeviceGetNvLinkState(h, link)
        except nvml.NVMLError as exc:
            if getattr(exc, "value", None) in _NO_SUCH_LINK_CODES:
                continue
            return {}, f"link {link} state: {type(exc).__name__}: {exc}"
        values, how = _link_errors(nvml, h, link)
        if values is None:
            why = f"link {link}: {how}"
            continue
        links[f"link {link}"] = values
    if links:
        return links, None
    return {}, why or f"{NOT_SUPPORTED} (NVML reports no NVLink on this GPU)"


def read(nvml: Any, handle: Any) -> dict[str, Any]:
    """Counters, identity and what could not be read, as plain data."""
    r = _Reader(nvml)
    _identity(r, handle)
    identity = dict(r.values)
    r.values.clear()
    _board_counters(r, handle)
    counters: dict[str, dict[str, int]] = {GPU_PART: dict(r.values)}
    links, why = _nvlinks(nvml, handle)
    counters.update(links)
    if why:
        r.unsupported["nvlink"] = why
    return {"identity": identity, "counters": counters, "unsupported": dict(r.unsupported),
            "errors": dict(r.errors)}


def read_device(device: Any) -> dict[str, Any]:
    """``read`` for a CUDA device, or {'error': why} where NVML cannot be used."""
    from workloads.clocks import device_handle, init_nvml

    if getattr(device, "type", "cpu") != "cuda":
        return {"error": "no GPU on this rank"}
    try:
        nvml = init_nvml()
        return read(nvml, device_handle(nvml, device))
    except Exception as exc:  # ImportError, NVMLError: the reason is reported, the checks skip or fail on it
        return {"error": f"NVML unavailable: {type(exc).__name__}: {exc}"}

