"""PCIe Access Control Services on the path between each GPU and its nearest network adapter.

With ACS redirection on, a switch sends peer-to-peer traffic (GPUDirect RDMA between GPU and NIC)
up to the root complex instead of across the switch: NCCL's troubleshooting guide asks for it off
(``lspci -vvv`` shows ``ACSCtl: SrcValid-``). The ACS control register is read from each bridge's
config space (``/sys/bus/pci/devices/<bdf>/config``, the ACS extended capability 0x000D, control at
+6); the extended space is readable by root only, and a shorter file says so. Paths come from the
sysfs device tree: ``/sys/bus/pci/devices/<bdf>`` links to ``/sys/devices/pci0000:00/<rp>/<usp>/...``.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from workloads.node.discovery import sysfs_bus_id

ACS_CAP_ID = 0x000D
EXTENDED_START = 0x100
ACS_BITS = {0: "SrcValid", 1: "TransBlk", 2: "ReqRedir", 3: "CmpltRedir", 4: "UpstreamFwd", 5: "EgressCtrl",
            6: "DirectTrans"}
REDIRECTING = 0b111101
"""SrcValid, ReqRedir, CmpltRedir, UpstreamFwd, EgressCtrl: the bits that must be off for peer traffic."""
_BDF = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")


def acs_control(config: bytes) -> int | None:
    """The ACS control register from a device's config space; None where the device has no ACS capability.

    Raises ValueError when only the first 256 bytes (or 64, as non-root) could be read.
    """
    if len(config) <= EXTENDED_START:
        raise ValueError(f"only {len(config)} bytes of config space readable (the extended space needs root)")
    offset, seen = EXTENDED_START, set()
    while offset and offset not in seen and offset + 8 <= len(config):
        seen.add(offset)
        header = int.from_bytes(config[offset:offset + 4], "little")
        if header in (0, 0xFFFFFFFF):
            return None
        if header & 0xFFFF == ACS_CAP_ID:
            return int.from_bytes(config[offset + 6:offset + 8], "little")
        offset = header >> 20 & 0xFFC
    return None


def bit_names(control: int) -> list[str]:
    return [name for bit, name in ACS_BITS.items() if control >> bit & 1]


def device_path(root: Path, bdf: str) -> list[str]:
    """[root port, ..., the device] from the sysfs device tree (empty where the device is unknown)."""
    link = root / "sys/bus/pci/devices" / sysfs_bus_id(bdf)
    try:
        target = os.readlink(link)
    except OSError:
        return []
    return [p for p in Path(target).parts if _BDF.match(p)]


def nearest(gpu: list[str], nics: dict[str, list[str]]) -> tuple[str, list[str]] | None:
    """The NIC sharing the longest part of the GPU's path, and the bridges between them (those below the
    last shared one, and that one); None without NICs."""
    best: tuple[int, str] | None = None
    for nic, path in sorted(nics.items()):
        shared = 0
        while shared < min(len(gpu), len(path)) and gpu[shared] == path[shared]:
            shared += 1
        if best is None or shared > best[0]:
            best = (shared, nic)
    if best is None:
        return None
    shared, nic = best
    path = nics[nic]
    start = max(shared - 1, 0)
    bridges = list(dict.fromkeys(gpu[start:-1] + path[start:-1]))
    return nic, bridges


def infiniband_devices(root: Path) -> dict[str, str]:
    """{'mlx5_0': '0000:3b:00.0'} from /sys/class/infiniband/<hca>/device."""
    out = {}
    for hca in sorted((root / "sys/class/infiniband").glob("*")):
        try:
            out[hca.name] = Path(os.readlink(hca / "device")).name
        except OSError:
            continue
    return out


def gpu_nic_paths(root: Path, gpu_bus_ids: list[str]) -> tuple[list[dict[str, Any]], str | None]:
    """For each GPU: its nearest InfiniBand adapter and the ACS state of every bridge between them."""
    hcas = infiniband_devices(root)
    if not hcas:
        return [], "no InfiniBand adapter under /sys/class/infiniband: no GPU-NIC path to check"
    nic_paths = {f"{hca} ({bdf})": device_path(root, bdf) for hca, bdf in hcas.items()}
    out = []
    for bus in gpu_bus_ids:
        gpu_path = device_path(root, bus)
        found = nearest(gpu_path, {k: v for k, v in nic_paths.items() if v}) if gpu_path else None
        if found is None:
            out.append({"gpu": sysfs_bus_id(bus), "nic": None, "bridges": [],
                        "problem": f"no sysfs path for GPU {bus} or any adapter"})
            continue
        nic, bridges = found
        states = []
        for bridge in bridges:
            try:
                control = acs_control((root / "sys/bus/pci/devices" / bridge / "config").read_bytes())
                states.append({"bridge": bridge, "acs": None if control is None else bit_names(control),
                               "redirecting": bool(control and control & REDIRECTING)})
            except (OSError, ValueError) as exc:
                states.append({"bridge": bridge, "unreadable": str(exc)})
        out.append({"gpu": sysfs_bus_id(bus), "nic": nic, "bridges": states})
    return out, None
