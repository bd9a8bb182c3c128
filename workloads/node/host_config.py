"""Host settings that decide how a GPU node performs, read from /proc and /sys under a root directory:
automatic NUMA balancing, the CPU frequency governor, the IOMMU mode, NVSwitches and the fabric
manager process. Each reader returns (value, why it cannot be read): None with a reason is never
taken as a pass. The suite's tests replay captured trees from tests/data/.

``NODE_SEEN`` turns each into what the profile's ``expect:`` key judges (clustergate.criteria.expect.check): a
``Seen``, read alike by the acceptance test of that key and by ``clustergate health``.
"""

from __future__ import annotations

import platform
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from workloads.node import pcie_acs
from workloads.node.discovery import _read, read_gpudirect, sysfs_bus_id

Seen = tuple[Any, str]
"""(the value an ``expect:`` key judges, or None where it cannot be read; what was seen, or why not)."""

NVIDIA_VENDOR = 0x10DE
BRIDGE_OTHER_CLASS = 0x0680
"""PCI class 'bridge, other': how NVSwitches on HGX baseboards enumerate."""


def numa_balancing(root: Path) -> tuple[bool | None, str | None]:
    text = _read(root, "proc/sys/kernel/numa_balancing")
    if text is None:
        return None, f"{root / 'proc/sys/kernel/numa_balancing'} absent (a kernel built without NUMA balancing)"
    return text.strip() not in ("0", ""), None


def cpu_governors(root: Path) -> tuple[dict[str, int] | None, str | None]:
    """{governor: number of CPUs using it}."""
    found = Counter((_read(d, "scaling_governor") or "").strip()
                    for d in (root / "sys/devices/system/cpu").glob("cpu[0-9]*/cpufreq"))
    found.pop("", None)
    if not found:
        return None, ("no cpufreq scaling_governor under /sys/devices/system/cpu/cpu*/cpufreq (a VM, or frequency "
                      "scaling owned by the firmware)")
    return dict(found), None


def _cmdline_iommu(root: Path) -> list[str]:
    words = (_read(root, "proc/cmdline") or "").split()
    return [w for w in words if "iommu" in w]


def iommu_mode(root: Path, bus_ids: list[str]) -> tuple[str | None, dict[str, Any], str | None]:
    """('off' | 'passthrough' | 'translated', what it was read from, why not).

    From the IOMMU groups of the given devices (their group's ``type``: ``identity`` is passthrough,
    ``DMA``/``DMA-FQ`` translated), else of every group; no groups at all means the IOMMU is off.
    """
    groups = root / "sys/kernel/iommu_groups"
    detail: dict[str, Any] = {"cmdline": _cmdline_iommu(root)}
    if not groups.is_dir() or not any(groups.iterdir()):
        detail["groups"] = 0
        return "off", detail, None
    mine = [root / "sys/bus/pci/devices" / sysfs_bus_id(b) / "iommu_group" for b in bus_ids]
    paths = [p for p in mine if p.exists()] or list(groups.iterdir())
    types = Counter((_read(p, "type") or "").strip() for p in paths)
    detail.update(groups=len(list(groups.iterdir())), types=dict(types), of="the GPUs and NICs" if mine else "all")
    if "" in types:
        if any(w in ("iommu=pt", "iommu.passthrough=1") for w in detail["cmdline"]):
            return "passthrough", detail, None
        return None, detail, ("IOMMU groups without a 'type' file (kernel older than 5.11) and no iommu=pt on "
                              "the kernel command line")
    if set(types) <= {"identity"}:
        return "passthrough", detail, None
    return "translated", detail, None


def nvswitches(root: Path) -> list[str]:
    """PCI addresses of the NVSwitches on this node (NVIDIA devices of class 'bridge, other')."""
    out = []
    for dev in sorted((root / "sys/bus/pci/devices").glob("*")):
        vendor, cls = _read(dev, "vendor"), _read(dev, "class")
        try:
            if vendor and cls and int(vendor, 16) == NVIDIA_VENDOR and int(cls, 16) >> 8 == BRIDGE_OTHER_CLASS:
                out.append(dev.name)
        except ValueError:
            continue
    return out


def processes_named(root: Path, name: str) -> list[int] | None:
    """PIDs whose comm is ``name`` (None where /proc cannot be listed). A container sees only its own."""
    proc = root / "proc"
    try:
        pids = [p for p in proc.iterdir() if p.name.isdigit()]
    except OSError:
        return None
    return sorted(int(p.name) for p in pids if (_read(p, "comm") or "").strip() == name)


# ---- what each node-wide expect: key judges --------------------------------------------------------

def acs_seen(root: Path, buses: list[str]) -> Seen:
    """Whether PCIe ACS redirects traffic on the path between any GPU (``buses``) and its nearest NIC."""
    if not buses:
        return None, "no GPU on this node: no GPU-NIC path"
    paths, why = pcie_acs.gpu_nic_paths(root, buses)
    if why:
        return None, why
    unread = [f"{b['bridge']}: {b['unreadable']}" for p in paths for b in p["bridges"] if "unreadable" in b]
    if unread:
        return None, f"ACS not readable on {len(unread)} bridges, e.g. {unread[0]}"
    on = [f"GPU {p['gpu']} -> {p['nic']}: bridge {b['bridge']} ACSCtl {'+'.join(b['acs'])}"
          for p in paths for b in p["bridges"] if b.get("redirecting")]
    return bool(on), "; ".join(on) or f"{sum(len(p['bridges']) for p in paths)} bridges checked, no redirection"


def iommu_seen(root: Path, buses: list[str]) -> Seen:
    nics = list(pcie_acs.infiniband_devices(root).values())
    mode, detail, why = iommu_mode(root, buses + nics)
    return (mode, f"{mode} ({detail})") if mode else (None, why or "unknown")


def numa_seen(root: Path, _: list[str]) -> Seen:
    on, why = numa_balancing(root)
    return (on, f"kernel.numa_balancing={int(on)}") if on is not None else (None, why or "")


def governor_seen(root: Path, _: list[str]) -> Seen:
    found, why = cpu_governors(root)
    if found is None:
        return None, why or ""
    shown = ", ".join(f"{g} on {n} CPUs" for g, n in sorted(found.items()))
    return (next(iter(found)) if len(found) == 1 else "mixed: " + shown), shown


NODE_SEEN: dict[str, Callable[[Path, list[str]], Seen]] = {
    "acs": acs_seen, "iommu": iommu_seen, "numa_balancing": numa_seen, "cpu_governor": governor_seen}
"""expect: key -> its reader, given the host root and the node's GPU bus ids."""

CudaAttributes = Callable[[], "tuple[dict[str, bool] | None, str | None]"]


def gpudirect_seen(root: Path, buses: list[str], cuda_attributes: CudaAttributes) -> Seen:
    """GPUDirect RDMA can work: a peer-memory module loaded, or the CUDA driver's dma-buf on a kernel >= 5.12.

    ``cuda_attributes`` asks the CUDA driver (``workloads.gpu.gpu_config.cuda_attributes``, or why not); it is
    called only where no peer-memory module settles it (initialising CUDA costs time on a node of 8 GPUs)."""
    if not pcie_acs.infiniband_devices(root):
        return None, "no InfiniBand adapter on this node: GPUDirect RDMA has no NIC to serve"
    if not buses:
        return None, "no GPU on this node"
    peermem = read_gpudirect(root)
    attrs, why = (None, "not asked: a peer-memory module is loaded") if peermem["loaded"] else cuda_attributes()
    kernel = tuple(int(x) for x in platform.release().split("-")[0].split(".")[:2] if x.isdigit())
    dma_buf = bool(attrs and attrs["dma_buf"]) and kernel >= (5, 12)
    return peermem["loaded"] or dma_buf, (f"peer memory modules {peermem['modules'] or 'none'}; CUDA dma-buf "
                                          f"{attrs['dma_buf'] if attrs else why}, kernel {platform.release()}")
