"""PCIe Advanced Error Reporting counters of every PCI device, from sysfs.

The kernel's AER driver counts each error a device reports in
``/sys/bus/pci/devices/<bdf>/aer_dev_{correctable,nonfatal,fatal}`` (one ``Name count`` per line,
ending with a ``TOTAL_ERR_*`` line; Linux 4.19 and later). A device without those files has no AER
capability, or the firmware kept AER for itself (``_OSC`` in dmesg). Read under a root directory, so
the suite's tests replay captured trees from tests/data/.
"""

from __future__ import annotations

from pathlib import Path

from workloads.node.discovery import _read

KINDS = {"correctable": "TOTAL_ERR_COR", "nonfatal": "TOTAL_ERR_NONFATAL", "fatal": "TOTAL_ERR_FATAL"}
"""AER file suffix -> the line that totals it."""

CLASSES = {0x0300: "VGA controller", 0x0302: "GPU", 0x0200: "Ethernet NIC", 0x0207: "InfiniBand NIC",
           0x0108: "NVMe", 0x0604: "PCIe bridge", 0x0680: "bridge (NVSwitch on NVIDIA boards)"}
VENDORS = {0x10DE: "NVIDIA", 0x15B3: "NVIDIA Networking (Mellanox)", 0x8086: "Intel", 0x1022: "AMD",
           0x1000: "Broadcom", 0x14E4: "Broadcom"}


def parse_aer_file(text: str) -> dict[str, int]:
    """'RxErr 0\\nBadTLP 3\\n...\\nTOTAL_ERR_COR 3' -> {'RxErr': 0, 'BadTLP': 3, ..., 'TOTAL_ERR_COR': 3}."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit():
            out[parts[0]] = int(parts[1])
    return out


def read_aer(root: Path) -> dict[str, dict[str, int]]:
    """{bdf: {'fatal.TOTAL_ERR_FATAL': n, 'correctable.BadTLP': n, ...}} for every device with AER files."""
    devices: dict[str, dict[str, int]] = {}
    for dev in sorted((root / "sys/bus/pci/devices").glob("*")):
        counters: dict[str, int] = {}
        for kind in KINDS:
            text = _read(dev, f"aer_dev_{kind}")
            if text is not None:
                counters.update({f"{kind}.{name}": n for name, n in parse_aer_file(text).items()})
        if counters:
            devices[dev.name] = counters
    return devices


def describe(root: Path, bdf: str) -> str:
    """'NVIDIA GPU' / 'NVIDIA Networking (Mellanox) InfiniBand NIC' / 'PCIe bridge' from class and vendor."""
    dev = root / "sys/bus/pci/devices" / bdf
    cls, vendor = _read(dev, "class"), _read(dev, "vendor")
    try:
        kind = CLASSES.get(int(cls, 16) >> 8, f"class {cls.strip()}") if cls else "device"
        who = VENDORS.get(int(vendor, 16), vendor.strip()) if vendor else ""
    except ValueError:
        return "device"
    return f"{who} {kind}".strip()


def snapshot(root: Path) -> tuple[dict[str, dict[str, int]], dict[str, str], str | None]:
    """(counters, description of each device, why nothing could be read or None)."""
    devices = read_aer(root)
    if not devices:
        return {}, {}, (f"no PCI device under {root / 'sys/bus/pci/devices'} exposes aer_dev_* counters (a kernel "
                        "without AER, a VM, or firmware-first error handling: see 'AER' and '_OSC' in dmesg)")
    return devices, {bdf: describe(root, bdf) for bdf in devices}, None


METRICS: dict[str, tuple[tuple[str, ...], str]] = {
    "pcie_aer_fatal_delta": (("fatal.TOTAL_ERR_FATAL",), "aer_fatal"),
    "pcie_aer_nonfatal_delta": (("nonfatal.TOTAL_ERR_NONFATAL",), "aer_nonfatal"),
    "pcie_aer_correctable_delta": (("correctable.TOTAL_ERR_COR",), "aer_correctable"),
}
"""Metric -> (the total counted, its failure category in workloads.faults)."""
