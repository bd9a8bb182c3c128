"""Who this rank is: host, GPU identity (index, UUID, serial, name) and software versions.

The GPU is looked up in NVML by its UUID as CUDA reports it, so the index and serial are the
physical GPU's even when CUDA_VISIBLE_DEVICES renumbers devices.
"""

from __future__ import annotations

import contextlib
import os
import platform
import sys
from dataclasses import asdict, dataclass
from importlib import metadata
from typing import Any

import torch

from workloads.node.discovery import HOST_ROOT_ENV
from workloads.node.gpu_presence import NvidiaDevices
from workloads.node.name import node_name


@dataclass(frozen=True, slots=True)
class GpuIdentity:
    index: int | None
    """NVML index: the physical GPU number nvidia-smi shows."""
    uuid: str | None
    serial: str | None
    name: str
    pci_bus_id: str | None = None


@dataclass(frozen=True, slots=True)
class RankIdentity:
    rank: int
    local_rank: int
    node_rank: int
    host: str
    gpu: GpuIdentity | None
    nvml_error: str | None = None
    """Why NVML could not describe the GPU (shown in the report; tests needing NVML fail on it)."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def nvml_gpu(device: torch.device) -> tuple[GpuIdentity | None, str | None]:
    """Identity of a CUDA device through NVML; (None, reason) where NVML cannot say."""
    props = torch.cuda.get_device_properties(device)
    cuda_uuid = getattr(props, "uuid", None)
    uuid = f"GPU-{cuda_uuid}" if cuda_uuid is not None else None
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByUUID(uuid) if uuid else \
            pynvml.nvmlDeviceGetHandleByIndex(device.index)
        try:
            serial: str | None = _text(pynvml.nvmlDeviceGetSerial(handle))
        except pynvml.NVMLError:
            serial = None  # not every board exposes a serial (e.g. some PCIe cards)
        return GpuIdentity(
            index=int(pynvml.nvmlDeviceGetIndex(handle)),
            uuid=_text(pynvml.nvmlDeviceGetUUID(handle)),
            serial=serial,
            name=_text(pynvml.nvmlDeviceGetName(handle)),
            pci_bus_id=_text(pynvml.nvmlDeviceGetPciInfo(handle).busId),
        ), None
    except Exception as exc:  # ImportError, NVMLError: fall back to what CUDA knows, say why
        return GpuIdentity(index=device.index, uuid=uuid, serial=None, name=props.name), \
            f"NVML unavailable: {type(exc).__name__}: {exc}"


def rank_identity(rank: int, local_rank: int, node_rank: int, device: torch.device) -> RankIdentity:
    if device.type != "cuda":
        return RankIdentity(rank, local_rank, node_rank, node_name(), None)
    gpu, error = nvml_gpu(device)
    return RankIdentity(rank, local_rank, node_rank, node_name(), gpu, error)


def gpu_model(found: NvidiaDevices) -> str | None:
    """The GPU model a run's profile is chosen by: NVML's name (``found``), else the name CUDA gives (NVML can be
    missing where CUDA works: a container given the driver's compute libraries only); None where neither knows one."""
    if found.model is not None:
        return found.model
    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None


def visible_gpus() -> int:
    """The CUDA GPUs this process may use (CUDA_VISIBLE_DEVICES honoured; counted through NVML where torch can, so
    no CUDA context is made): the count a run's profile shape is chosen by (``NvidiaDevices.shape_gpus``)."""
    return torch.cuda.device_count()


def gpu_node_problem(found: NvidiaDevices, device: torch.device) -> str | None:
    """Why a run on a GPU node cannot be judged: an NVIDIA device exists, or the site expects GPUs
    (``found``, workloads.node.gpu_presence), but this rank's torch sees no CUDA device; None otherwise."""
    if device.type == "cuda" or not found.present:
        return None
    return found.broken(f"torch {torch.__version__} (CUDA {torch.version.cuda}) sees no CUDA device "
                        f"(torch.cuda.is_available() is {torch.cuda.is_available()})")


OPTIONAL_PACKAGES = ("deepspeed",)
"""Packages of the optional extras whose absence lets a test skip (``clustergate.trust.skip_facts``: package_missing):
the record names the version of each that is installed, so a skip for one that is there contradicts it."""


RECORDED_VARIABLES = ("SLURM_JOB_ID", "TORCHELASTIC_RUN_ID", "CUDA_VISIBLE_DEVICES", HOST_ROOT_ENV, "PYTHONPATH",
                      "PYTEST_ADDOPTS", "PYTEST_PLUGINS")
"""Variables recorded as they were set (redacted by value like the rest of the record): the job, the GPUs a rank
was given, where the host's files were read (a container's view of the host), and what could change the code or
plugins a run loads (the attestation judges those; the record shows how they were asked for)."""


def environment() -> dict[str, str]:
    """Software versions that decide what a figure means, the optional packages installed among them (read from
    their metadata, never imported: importing DeepSpeed costs seconds)."""
    env = {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "platform": platform.platform(),
        "host": node_name(),
    }
    if torch.cuda.is_available():
        env["cuda"] = str(torch.version.cuda)
        env["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        try:
            import pynvml

            pynvml.nvmlInit()
            env["driver"] = _text(pynvml.nvmlSystemGetDriverVersion())
        except Exception as exc:
            env["driver"] = f"unknown (NVML: {exc})"
    for package in OPTIONAL_PACKAGES:
        with contextlib.suppress(metadata.PackageNotFoundError):
            env[package] = metadata.version(package)
    for var in RECORDED_VARIABLES:
        if var in os.environ:
            env[var] = os.environ[var]
    return env
