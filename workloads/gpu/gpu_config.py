"""A GPU's configuration as the profile's ``expect:`` section judges it: driver, CUDA and NCCL versions,
persistence mode, its NVSwitch fabric state, and GPUDirect RDMA support (dma-buf or peer memory).

``read(nvml, handle, ...)`` takes the NVML module as an argument (a fake one in the suite's tests) and
returns plain data, with every field NVML or CUDA could not give in ``unsupported``/``errors``.
"""

from __future__ import annotations

import ctypes
from typing import Any

from workloads.gpu.inventory import _cuda_version, _Reader, _text
from workloads.node.host_config import Seen

FABRIC_STATES = {0: "not supported", 1: "not started", 2: "in progress", 3: "completed"}
"""nvmlGpuFabricState_t: 'completed' means the fabric manager has set up this GPU's NVSwitch routes."""
CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED = 116
CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED = 124
"""cuda.h CUdevice_attribute values."""


def _fabric(nvml: Any, handle: Any) -> dict[str, Any]:
    """NVML's GPU fabric info (Hopper and later): state, and the status of the fabric manager's setup."""
    versioned = getattr(nvml, "nvmlDeviceGetGpuFabricInfoV", None)
    if versioned is None and not hasattr(nvml, "nvmlDeviceGetGpuFabricInfo"):
        raise nvml.NVMLError(3)  # NOT_SUPPORTED: an nvidia-ml-py older than the fabric API
    if versioned is not None:
        info = nvml.c_nvmlGpuFabricInfoV_t()
        versioned(handle, ctypes.byref(info) if isinstance(info, ctypes.Structure) else info)
    else:
        info = nvml.c_nvmlGpuFabricInfo_t()
        nvml.nvmlDeviceGetGpuFabricInfo(handle, ctypes.byref(info) if isinstance(info, ctypes.Structure) else info)
    state = int(info.state)
    return {"state": FABRIC_STATES.get(state, str(state)), "status": int(info.status)}


def read(nvml: Any, handle: Any) -> dict[str, Any]:
    r = _Reader(nvml)
    r.read("driver", nvml.nvmlSystemGetDriverVersion, convert=_text)
    r.read("cuda", nvml.nvmlSystemGetCudaDriverVersion, convert=lambda v: _cuda_version(int(v)))
    r.read("persistence_mode", nvml.nvmlDeviceGetPersistenceMode, handle, convert=lambda v: int(v) == 1)
    r.read("fabric", _fabric, nvml, handle)
    return {"values": r.values, "unsupported": r.unsupported, "errors": r.errors}


def field_seen(read: dict[str, Any], name: str) -> Seen:
    """One field of ``read`` (or ``read_device``) as an ``expect:`` key judges it."""
    if "error" in read:
        return None, read["error"]
    if name in read["values"]:
        return read["values"][name], str(read["values"][name])
    return None, read["unsupported"].get(name) or read["errors"].get(name) or f"{name} not read"


def fabric_seen(read: dict[str, Any], nvswitches: list[str], fabric_managers: list[int] | None) -> Seen:
    """Whether the fabric manager has set up this GPU's NVSwitch fabric (NVML: completed, status 0).

    ``nvswitches``: the node's NVSwitches (``host_config.nvswitches``); ``fabric_managers``: the pids of
    nv-fabricmanager processes visible (None: /proc not listable). A node without NVSwitches needs none."""
    fabric, why = field_seen(read, "fabric")
    state = (fabric or {}).get("state")
    if not nvswitches and state in (None, "not supported"):
        return None, (f"no NVSwitch on this node (no NVIDIA bridge-class PCI device; NVML fabric: {state or why}): "
                      "no fabric manager needed")
    if fabric is None:
        return None, f"{len(nvswitches)} NVSwitches, but NVML cannot say the fabric state: {why}"
    up = state == "completed" and fabric["status"] == 0
    return up, (f"fabric {state}, status {fabric['status']}; {len(nvswitches)} NVSwitches; nv-fabricmanager "
                f"processes visible: {fabric_managers if fabric_managers is not None else 'unknown'}")


def cuda_attributes(ordinal: int) -> tuple[dict[str, bool] | None, str | None]:
    """GPUDirect RDMA and dma-buf support of a CUDA device, asked of the CUDA driver (libcuda)."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        return None, f"libcuda.so.1 not loadable: {exc}"
    if cuda.cuInit(0) != 0:
        return None, "cuInit failed"
    dev = ctypes.c_int()
    if cuda.cuDeviceGet(ctypes.byref(dev), ordinal) != 0:
        return None, f"cuDeviceGet({ordinal}) failed"
    out = {}
    for name, attr in (("gpudirect_rdma", CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED),
                       ("dma_buf", CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED)):
        value = ctypes.c_int()
        if cuda.cuDeviceGetAttribute(ctypes.byref(value), attr, dev) != 0:
            return None, f"cuDeviceGetAttribute({attr}) failed (driver older than the attribute)"
        out[name] = bool(value.value)
    return out, None


def read_device(device: Any) -> dict[str, Any]:
    """``read`` plus the CUDA attributes and torch's NCCL for this rank's GPU, or {'error': why}."""
    import torch

    from workloads.clocks import device_handle, init_nvml

    if getattr(device, "type", "cpu") != "cuda":
        return {"error": "no GPU on this rank"}
    try:
        nvml = init_nvml()
        out = read(nvml, device_handle(nvml, device))
    except Exception as exc:  # ImportError, NVMLError
        return {"error": f"NVML unavailable: {type(exc).__name__}: {exc}"}
    out["values"]["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    attrs, why = cuda_attributes(device.index or 0)
    if attrs is None:
        out["errors"]["cuda_attributes"] = why
    else:
        out["values"].update(attrs)
    return out
