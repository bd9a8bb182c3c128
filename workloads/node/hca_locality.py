"""The GPU nearest each HCA, from the sysfs PCI tree: the one under the deepest common PCI bridge, then the one
on the HCA's NUMA node.

``/sys/class/infiniband/<hca>/device`` links to the HCA's PCI function and ``/sys/bus/pci/devices/<bdf>`` to
its place in the tree (``/sys/devices/pci0000:00/<root port>/<switch>/.../<bdf>``): two devices under one PCIe
switch share more of that path than two under different root ports (``nvidia-smi topo -m``'s PIX/PXB against
NODE/SYS). This is the GPU whose memory a per-HCA GPUDirect test reads, as NCCL pairs each GPU with its
closest NIC.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from workloads.node.discovery import gpu_locality, sysfs_bus_id
from workloads.node.pcie_acs import device_path, infiniband_devices


def _shared(a: list[str], b: list[str]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def nearest_gpu(root: Path, hca: str, gpus: dict[str, str]) -> dict[str, Any]:
    """The GPU of ``gpus`` ({label: PCI bus id}) nearest the HCA, with the bridge they share and both NUMA nodes.

    Deepest shared bridge first, then the same NUMA node, then the first label; ``gpu`` None without GPUs or
    where the HCA has no PCI device.
    """
    bdf = infiniband_devices(root).get(hca)
    out: dict[str, Any] = {"hca": hca, "hca_bus_id": bdf, "hca_numa_node": None, "gpu": None, "gpu_bus_id": None,
                           "gpu_numa_node": None, "common_bridge": None}
    if bdf is None:
        return out
    hca_path = device_path(root, bdf)
    hca_numa = gpu_locality(root, bdf)["numa_node"]
    out["hca_numa_node"] = hca_numa
    ranked = []
    for order, (label, bus) in enumerate(gpus.items()):
        path = device_path(root, bus)
        numa = gpu_locality(root, bus)["numa_node"]
        depth = _shared(hca_path, path)
        ranked.append((-depth, numa != hca_numa or numa is None, order, label, bus, numa, path[:depth]))
    if not ranked:
        return out
    _, _, _, label, bus, numa, common = min(ranked)
    return {**out, "gpu": label, "gpu_bus_id": sysfs_bus_id(bus), "gpu_numa_node": numa,
            "common_bridge": common[-1] if common else None}
