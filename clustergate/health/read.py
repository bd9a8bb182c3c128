"""What ``clustergate health`` reads of a node, as plain data: NVML for each GPU, files for the node.

Every reader is the one the acceptance suite's tests use (workloads.gpu.inventory, gpu_config and processes
through NVML; workloads.node.kernel_log, discovery and host_config from files), called without torch. What
cannot be read is kept with the reason, never taken as a pass. Only what the profile judges is read: a node
setting the profile's ``expect:`` leaves out costs nothing.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from clustergate.criteria.thresholds import Profile
from workloads.gpu import gpu_config, inventory, processes
from workloads.node import discovery, host_config, kernel_log
from workloads.node.discovery import _read
from workloads.node.gpu_presence import NvidiaDevices

GPU_EXPECT = ("driver", "cuda", "persistence_mode", "fabric_manager")
"""The expect: keys judged per GPU from NVML (NCCL's version and its GPUDirect use need torch: the run's)."""
NODE_EXPECT = (*host_config.NODE_SEEN, "gpudirect_rdma")
"""The expect: keys judged once per node from files."""


@dataclass(slots=True)
class GpuRead:
    """One GPU as NVML showed it."""

    index: int
    snapshot: dict[str, Any]
    """workloads.gpu.inventory.nvml_snapshot (or {"gpu": None, "nvml": {"error": ...}} where NVML could not open it)."""
    config: dict[str, Any]
    """workloads.gpu.gpu_config.read: driver, CUDA, persistence mode, fabric state."""
    processes: dict[str, Any]
    """workloads.gpu.processes.read_with: the processes on the GPU."""

    @property
    def identity(self) -> dict[str, Any]:
        gpu = self.snapshot.get("gpu") or {}
        return {"index": self.index, "serial": gpu.get("serial"), "uuid": gpu.get("uuid"),
                "pci_bus_id": gpu.get("pci_bus_id"), "name": gpu.get("name")}


@dataclass(slots=True)
class KernelLog:
    """The XIDs in the kernel log (since boot, or since the mark of an earlier healthy check)."""

    readable: bool
    reason: str | None = None
    source: str | None = None
    boot_id: str | None = None
    marker: float = -1.0
    """Where the log stands now (kmsg's record number or dmesg's seconds since boot)."""
    since: float | None = None
    """XIDs at or before this marker were left out (the earlier check's); None: since boot."""
    xids: list[dict[str, Any]] = field(default_factory=list)


@dataclass(slots=True)
class NodeRead:
    """Everything read, JSON-serialisable (``as_dict``) for the report directory."""

    host: str
    presence: NvidiaDevices
    nvml_error: str | None
    gpus: list[GpuRead] = field(default_factory=list)
    kernel: KernelLog | None = None
    infiniband: list[dict[str, Any]] | None = None
    nvswitches: list[str] = field(default_factory=list)
    fabric_managers: list[int] | None = None
    node_settings: dict[str, tuple[Any, str]] = field(default_factory=dict)
    """expect: key -> (value or None, what was seen or why not), for the node keys the profile sets."""

    def as_dict(self) -> dict[str, Any]:
        return json.loads(json.dumps(asdict(self), default=str))


def read_gpu(nvml: Any, index: int, root: Path) -> GpuRead:
    """One GPU by NVML index: its snapshot, configuration and processes."""
    try:
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
    except nvml.NVMLError as exc:
        why = f"NVML cannot open GPU {index}: {type(exc).__name__}: {exc}"
        return GpuRead(index, {"gpu": None, "nvml": {"ok": False, "error": why}}, {"error": why},
                       {"processes": [], "unsupported": None, "error": why})
    return GpuRead(index, inventory.nvml_snapshot(nvml, handle), gpu_config.read(nvml, handle),
                   processes.read_with(nvml, handle, root))


def boot_id(root: Path) -> str | None:
    text = _read(root, "proc/sys/kernel/random/boot_id")
    return text.strip() if text else None


def read_kernel_log(root: Path, since: dict[str, Any] | None) -> KernelLog:
    """XIDs in the kernel log; ``since`` (an earlier ``mark``) leaves out what that check already saw, where it is
    of this boot and this source."""
    records, source, problem = kernel_log.read(root)
    if problem:
        return KernelLog(readable=False, reason=problem)
    booted = boot_id(root)
    after = None
    if since and since.get("boot_id") == booted and since.get("source") == source:
        after = float(since.get("marker", -1.0))
    xids = [x.as_dict() for x in kernel_log.xid_lines(records) if after is None or x.marker > after]
    return KernelLog(readable=True, source=source, boot_id=booted, since=after, xids=xids,
                     marker=max((m for m, _ in records), default=-1.0))


def mark(log: KernelLog) -> dict[str, Any] | None:
    """Where the kernel log stood, for the next check's ``since`` (None where it could not be read)."""
    if not log.readable:
        return None
    return {"boot_id": log.boot_id, "source": log.source, "marker": log.marker}


def read_node(host: str, root: Path, presence: NvidiaDevices, nvml: Any | None, nvml_error: str | None,
              profile: Profile, *, gpus_expected: bool, kernel_since: dict[str, Any] | None = None) -> NodeRead:
    """What ``profile`` judges on this node. ``nvml``: an initialised NVML module, or None (``nvml_error`` says
    why); ``gpus_expected``: whether the profile judges GPUs at all."""
    node = NodeRead(host=host, presence=presence, nvml_error=nvml_error)
    if gpus_expected:
        if nvml is not None:
            node.gpus = [read_gpu(nvml, i, root) for i in range(len(presence.nvml_gpus))]
        node.kernel = read_kernel_log(root, kernel_since)
        if "fabric_manager" in profile.expect:
            node.nvswitches = host_config.nvswitches(root)
            node.fabric_managers = host_config.processes_named(root, "nv-fabricmanager")
    if profile.setting("ib_ports_per_node", None):
        node.infiniband = discovery.read_infiniband(root)
    buses = [g.identity["pci_bus_id"] for g in node.gpus if g.identity["pci_bus_id"]]
    for key in NODE_EXPECT:
        if key not in profile.expect:
            continue
        if key == "gpudirect_rdma":
            cuda = (lambda: gpu_config.cuda_attributes(0)) if node.gpus else (lambda: (None, "no GPU NVML can open"))
            node.node_settings[key] = host_config.gpudirect_seen(root, buses, cuda)
        else:
            node.node_settings[key] = host_config.NODE_SEEN[key](root, buses)
    return node
