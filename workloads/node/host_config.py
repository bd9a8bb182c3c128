"""Host settings that decide how a GPU node performs, read from /proc and /sys under a root directory:
automatic NUMA balancing, the CPU frequency governor, the IOMMU mode, NVSwitches and the fabric
manager process. Each reader returns (value, why it cannot be read): None with a reason is never
taken as a pass. The suite's tests replay captured trees from tests/data/.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from workloads.node.discovery import _read, sysfs_bus_id

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
