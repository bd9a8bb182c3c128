"""Whether this is a GPU node, asked without torch or CUDA: the rule that keeps a GPU node whose driver or CUDA
is broken from being judged as a machine without GPUs.

An NVIDIA device exists where NVML lists a GPU, a ``/dev/nvidia<N>`` device file exists, the driver lists a GPU
(``/proc/driver/nvidia/gpus``), or a PCI device of vendor 0x10de is on the bus (``/sys/bus/pci/devices``: the bus
lists a GPU whatever its driver's state); the site expects GPUs where ``CLUSTERGATE_GPUS_PER_NODE`` (the launchers'
setting) is above 0, or where the launcher gave the job GPUs (``LAUNCHER_GPU_VARIABLES``: Slurm's, the Kubernetes
device plugin's). On such a node the
profile is the GPU model's, or the fallback where no model can be read (``clustergate.criteria.thresholds``'s
``select``), never the CPU profile; a GPU that NVML (``clustergate health``) or torch (the run) cannot use is a
failure that names the driver or CUDA (``NvidiaDevices.broken``). Only ``--profile cpu`` says otherwise.

Files are read under a root directory (``workloads.node.discovery.host_root``), so the suite's tests plant
a PCI tree; NVML is asked through whatever module the caller passes (a fake one in the tests).
"""

from __future__ import annotations

import importlib.util
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workloads.node.discovery import _read
from workloads.node.host_config import NVIDIA_VENDOR

DISPLAY_CLASS = 0x03
"""PCI base class 'display controller': what a GPU enumerates as (0x0300 VGA, 0x0302 3D controller)."""
EXPECTED_GPUS_ENV = "CLUSTERGATE_GPUS_PER_NODE"
"""GPUs the site says this node has (the launchers set it; node.sh requires it)."""
_DEVICE_FILE = re.compile(r"nvidia\d+$")
LAUNCHER_GPU_VARIABLES = ("SLURM_GPUS_ON_NODE", "SLURM_JOB_GPUS", "SLURM_STEP_GPUS", "SLURM_GPUS_PER_NODE",
                          "SLURM_GPUS_PER_TASK", "SLURM_GPUS", "NVIDIA_VISIBLE_DEVICES")
"""What a launcher sets where it gave the job GPUs: Slurm's GPU allocation (a count, ``type:count``, or GPU
indexes), and the device list the NVIDIA device plugin gives a Kubernetes container (GPU UUIDs or indexes)."""
NO_DEVICES = ("", "0", "none", "void", "all")
"""Launcher values that request no GPU: nothing, zero, the container toolkit's "none"/"void", and "all", which
CUDA base images set whether or not the container got any GPU (one it did get shows as /dev/nvidia<N>)."""


@dataclass(frozen=True, slots=True)
class NvidiaDevices:
    """What says this node has NVIDIA GPUs, read without torch."""

    nvml_gpus: tuple[str, ...]
    """The name of each GPU NVML lists, by NVML index (empty where NVML does not answer)."""
    nvml_error: str | None
    """Why NVML did not answer (the library or driver absent or broken); None where it did."""
    device_files: tuple[str, ...]
    """``/dev/nvidia<N>``: the driver's device nodes, one per GPU it has bound."""
    pci_gpus: tuple[str, ...]
    """PCI addresses of NVIDIA display-class devices: the GPUs on the bus."""
    pci_other: tuple[str, ...]
    """PCI addresses of other NVIDIA devices (NVSwitches; a GPU's audio or USB function)."""
    expected: int | None
    """$CLUSTERGATE_GPUS_PER_NODE where set to a whole number."""
    driver_gpus: tuple[str, ...] = ()
    """``/proc/driver/nvidia/gpus/<PCI address>``: the GPUs the NVIDIA kernel driver has probed."""
    requested: tuple[str, ...] = ()
    """``NAME=value`` of each launcher variable that gave the job GPUs (``LAUNCHER_GPU_VARIABLES``)."""

    @property
    def present(self) -> bool:
        """An NVIDIA device exists here, or the site expects GPUs: never a node for the CPU profile."""
        return bool(self.nvml_gpus or self.device_files or self.driver_gpus or self.pci_gpus or self.pci_other
                    or (self.expected or 0) > 0 or self.requested)

    def shape_gpus(self, visible: int | None = None) -> int | None:
        """The GPU count a profile's node shape is chosen by (``clustergate.criteria.thresholds``'s ``select``): the
        site's ``CLUSTERGATE_GPUS_PER_NODE`` where set, so that a node that lost GPUs is judged as the shape the site
        bought and fails its GPU count, never passes as a smaller shape; else the GPUs this process may use
        (``visible``: CUDA's count, which honours CUDA_VISIBLE_DEVICES), else the GPUs NVML lists; None where no
        GPU is seen."""
        if self.expected:
            return self.expected
        if visible:
            return visible
        return len(self.nvml_gpus) or None

    @property
    def model(self) -> str | None:
        """The GPU model as NVML names it (its first GPU), for the profile's ``match``; None where unknown."""
        return self.nvml_gpus[0] if self.nvml_gpus else None

    def evidence(self) -> str:
        """What says so, in words: 'NVML lists 8 GPUs; /dev/nvidia0-7; 8 GPUs and 4 other devices of vendor
        0x10de on the PCI bus; CLUSTERGATE_GPUS_PER_NODE=8'."""
        said = []
        if self.nvml_gpus:
            said.append(f"NVML lists {len(self.nvml_gpus)} GPUs ({self.nvml_gpus[0]})")
        if self.device_files:
            shown = self.device_files[:3]
            said.append(", ".join(shown) + (f" and {len(self.device_files) - 3} more" if len(shown) < len(
                self.device_files) else ""))
        if self.driver_gpus:
            said.append(f"/proc/driver/nvidia/gpus lists {len(self.driver_gpus)} GPUs")
        if self.pci_gpus or self.pci_other:
            said.append(f"{len(self.pci_gpus)} GPUs and {len(self.pci_other)} other devices of vendor 0x10de on the "
                        f"PCI bus ({(self.pci_gpus or self.pci_other)[0]}{', ...' if len(self.pci_gpus) > 1 else ''})")
        if self.expected:
            said.append(f"{EXPECTED_GPUS_ENV}={self.expected}")
        said += self.requested
        return "; ".join(said) or "no NVIDIA device"

    def broken(self, what: str) -> str:
        """The failure of a GPU node whose GPUs cannot be used: ``what`` says by whom ('torch sees no CUDA device',
        'NVML does not answer: ...')."""
        return (f"this is a GPU node ({self.evidence()}) but {what}: the NVIDIA driver or CUDA is broken (nvidia-smi "
                "says which: is the driver loaded, and does it match its libraries; for a run: is torch a CUDA "
                "build?). "
                "A GPU node that cannot use its GPUs fails; only --profile cpu runs the CPU suite on it")


def pci_nvidia(root: Path) -> tuple[list[str], list[str]]:
    """(NVIDIA GPUs, other NVIDIA devices) on the PCI bus, by address."""
    gpus, other = [], []
    for dev in sorted((root / "sys/bus/pci/devices").glob("*")):
        vendor, cls = _read(dev, "vendor"), _read(dev, "class")
        try:
            if not vendor or int(vendor, 16) != NVIDIA_VENDOR:
                continue
            is_gpu = cls is not None and int(cls, 16) >> 16 == DISPLAY_CLASS
        except ValueError:
            continue
        (gpus if is_gpu else other).append(dev.name)
    return gpus, other


def device_files(root: Path) -> list[str]:
    """``/dev/nvidia<N>`` under ``root`` (not nvidiactl or nvidia-uvm: those exist with no GPU bound)."""
    try:
        names = os.listdir(root / "dev")
    except OSError:
        return []
    return sorted((f"/dev/{n}" for n in names if _DEVICE_FILE.match(n)), key=lambda p: int(p[len("/dev/nvidia"):]))


def driver_gpus(root: Path) -> list[str]:
    """The PCI addresses under ``root``/proc/driver/nvidia/gpus (the driver's own list: no driver, none)."""
    try:
        return sorted(os.listdir(root / "proc/driver/nvidia/gpus"))
    except OSError:
        return []


def launcher_requests(environ: dict[str, str] | None = None) -> list[str]:
    """``NAME=value`` of each launcher variable that gave this job GPUs."""
    environ = dict(os.environ) if environ is None else environ
    return [f"{name}={environ[name]}" for name in LAUNCHER_GPU_VARIABLES
            if environ.get(name, "").strip().lower() not in NO_DEVICES]


def expected_gpus() -> int | None:
    raw = os.environ.get(EXPECTED_GPUS_ENV, "").strip()
    return int(raw) if raw.isdigit() else None


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def nvml_gpus(nvml: Any) -> tuple[list[str], str | None]:
    """(the name of each GPU NVML lists, why NVML could not be asked or None) from an initialised NVML module.

    A GPU whose name cannot be read is listed as 'unknown (<error>)': it exists all the same."""
    try:
        count = int(nvml.nvmlDeviceGetCount())
    except nvml.NVMLError as exc:
        return [], f"NVML could not count the GPUs: {type(exc).__name__}: {exc}"
    names = []
    for index in range(count):
        try:
            names.append(_text(nvml.nvmlDeviceGetName(nvml.nvmlDeviceGetHandleByIndex(index))))
        except nvml.NVMLError as exc:
            names.append(f"unknown ({type(exc).__name__}: {exc})")
    return names, None


def nvml_installed() -> bool:
    """Whether nvidia-ml-py (the ``pynvml`` module) can be imported: without it NVML cannot be asked at all."""
    try:
        return importlib.util.find_spec("pynvml") is not None
    except ValueError:  # a module entry of None (an import made to fail on purpose)
        return False


def open_nvml() -> tuple[Any | None, str | None]:
    """(pynvml, initialised; None) or (None, why not): the module missing, or the library or driver absent."""
    try:
        import pynvml
    except ImportError as exc:
        return None, f"nvidia-ml-py is not installed (import pynvml: {exc})"
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound, _DriverNotLoaded, ...: the reason is the finding
        return None, f"NVML does not answer ({type(exc).__name__}: {exc})"
    return pynvml, None


def find(root: Path, nvml: Any | None = None, nvml_error: str | None = None) -> NvidiaDevices:
    """This node's evidence of NVIDIA GPUs. ``nvml``: an initialised NVML module to ask (``open_nvml``), or None
    with ``nvml_error`` saying why there is none; both left out: NVML is opened here."""
    if nvml is None and nvml_error is None:
        nvml, nvml_error = open_nvml()
    names: list[str] = []
    if nvml is not None:
        names, nvml_error = nvml_gpus(nvml)
    gpus, other = pci_nvidia(root)
    return NvidiaDevices(nvml_gpus=tuple(names), nvml_error=nvml_error, device_files=tuple(device_files(root)),
                         pci_gpus=tuple(gpus), pci_other=tuple(other), expected=expected_gpus(),
                         driver_gpus=tuple(driver_gpus(root)), requested=tuple(launcher_requests()))
