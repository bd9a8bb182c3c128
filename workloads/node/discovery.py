"""What a node is made of: CPU, NUMA, memory, OS, GPU topology, InfiniBand, GPUDirect RDMA, mounts.

Everything is read from /proc and /sys (under ``Config.root``, so the suite's tests replay captured
files from tests/data/) with small pure parsers. ``nvidia-smi topo -m`` is kept as text: it is a
recorded artifact for people, never scraped by column; the NUMA affinity of a GPU comes from
/sys/bus/pci/devices/<bus id>/{numa_node,local_cpulist} instead.

Run alone (prints this node's discovery as JSON): python -m workloads.node.discovery
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from workloads.result import Result

if TYPE_CHECKING:  # the readers run without torch (clustergate health); only for_level takes a device
    import torch

SHARED_FS_TYPES = frozenset({
    "nfs", "nfs4", "lustre", "gpfs", "beegfs", "wekafs", "cifs", "smb3", "ceph", "glusterfs", "virtiofs",
    "fuse.ceph-fuse", "fuse.glusterfs", "fuse.juicefs", "fuse.gcsfuse", "fuse.mountpoint-s3", "fuse.blobfuse2",
    "fuse.weka", "fuse.sshfs", "panfs", "orangefs",
})
"""Filesystem types that are (or may be) shared between nodes: the mounts worth recording."""

GPUDIRECT_MODULES = ("nvidia_peermem", "nv_peer_mem")
"""Kernel modules that give NCCL GPUDirect RDMA over InfiniBand (nv_peer_mem is the old out-of-tree name)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Config:
    root: str = "/"
    """Filesystem root under which proc/ and sys/ are read; tests point it at captured samples."""
    topology: bool = True
    """Run ``nvidia-smi topo -m`` (when nvidia-smi exists) and keep its text."""
    pci_bus_ids: tuple[str, ...] = ()
    """PCI bus ids of this node's GPUs (NVML form is fine) whose NUMA locality to record."""
    command_timeout_s: float = 60.0
    """Limit for the external commands (nvidia-smi)."""

    @classmethod
    def for_level(cls, level: str, device: torch.device, pci_bus_ids: tuple[str, ...] = ()) -> Config:
        """Discovery reads files: the same at every level; no topology without a GPU."""
        from workloads.common import check_level

        check_level(level)
        return cls(topology=device.type == "cuda", pci_bus_ids=pci_bus_ids)


# ---- pure parsers (tested on tests/data) -------------------------------------------------------

def parse_cpulist(text: str) -> list[int]:
    """'0-3,8,10-11' (the kernel's cpulist format) -> [0, 1, 2, 3, 8, 10, 11]."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part:
            lo, hi = part.split("-", 1)
            cpus.update(range(int(lo), int(hi) + 1))
        else:
            cpus.add(int(part))
    return sorted(cpus)


def format_cpulist(cpus: Any) -> str:
    """The inverse of ``parse_cpulist``: a compact '0-3,8,10-11'."""
    ordered = sorted(set(cpus))
    runs: list[str] = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        runs.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(runs)


def parse_cpuinfo(text: str) -> dict[str, Any]:
    """CPU model, sockets, physical cores and logical CPUs from /proc/cpuinfo (x86 layout).

    Sockets and cores are None where the file lacks 'physical id' / 'core id' (arm64): the caller
    then reads /sys/devices/system/cpu/*/topology.
    """
    blocks = [b for b in text.strip().split("\n\n") if b.strip()]
    models: list[str] = []
    cores: set[tuple[str, str]] = set()
    sockets: set[str] = set()
    for block in blocks:
        fields: dict[str, str] = {}
        for line in block.splitlines():
            key, sep, value = line.partition(":")
            if sep:
                fields[key.strip()] = value.strip()
        if "processor" not in fields:
            continue
        if "model name" in fields:
            models.append(fields["model name"])
        if "physical id" in fields:
            sockets.add(fields["physical id"])
            cores.add((fields["physical id"], fields.get("core id", fields["processor"])))
    logical = sum(1 for b in blocks if b.lstrip().startswith("processor"))
    return {
        "model": models[0] if models else None,
        "sockets": len(sockets) or None,
        "cores": len(cores) or None,
        "logical_cpus": logical,
    }


def parse_meminfo_gib(text: str, key: str = "MemTotal") -> float | None:
    """A /proc/meminfo (or node meminfo: 'Node 0 MemTotal: ... kB') field in GiB."""
    for line in text.splitlines():
        name, sep, value = line.partition(":")
        if sep and name.split()[-1:] == [key]:
            number, *unit = value.split()
            factor = 1024 if unit and unit[0].lower() == "kb" else 1
            return round(int(number) * factor / 2**30, 2)
    return None


def parse_os_release(text: str) -> str | None:
    """PRETTY_NAME from /etc/os-release."""
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() == "PRETTY_NAME":
            return value.strip().strip('"')
    return None


def parse_modules(text: str) -> list[str]:
    """Loaded module names from /proc/modules (first field of each line)."""
    return [line.split()[0] for line in text.splitlines() if line.strip()]


def _unescape_mount(field: str) -> str:
    # /proc/mounts escapes space, tab, newline and backslash as octal (\040 ...).
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def parse_mounts(text: str, fs_types: frozenset[str] = SHARED_FS_TYPES) -> list[dict[str, str]]:
    """Mounts from /proc/mounts whose type is a shared filesystem."""
    out: list[dict[str, str]] = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 4 or parts[2] not in fs_types:
            continue
        out.append({"source": _unescape_mount(parts[0]), "mountpoint": _unescape_mount(parts[1]),
                    "fstype": parts[2], "options": parts[3]})
    return out


def parse_ib_rate(text: str) -> float | None:
    """'400 Gb/sec (4X NDR)' -> 400.0 (Gb/s)."""
    first = text.strip().split(" ", 1)[0]
    try:
        return float(first)
    except ValueError:
        return None


def parse_ib_state(text: str) -> str:
    """'4: ACTIVE' -> 'ACTIVE'; '5: LinkUp' -> 'LinkUp'."""
    return text.strip().split(":", 1)[-1].strip()


def sysfs_bus_id(bus_id: str) -> str:
    """NVML's '00000000:18:00.0' -> sysfs's '0000:18:00.0' (4-digit domain, lower case)."""
    bus_id = bus_id.strip().lower()
    domain, sep, rest = bus_id.partition(":")
    if not sep or not rest:
        return bus_id
    return f"{int(domain, 16):04x}:{rest}"


# ---- readers under a root ----------------------------------------------------------------------

HOST_ROOT_ENV = "CLUSTERGATE_HOST_ROOT"
"""Read the host's /proc, /sys and /dev/kmsg under this directory (a container that mounts them at /host, or
the suite's own tests with a captured tree)."""


def host_root() -> Path:
    """The directory the host's /proc, /sys and /dev are read under: $CLUSTERGATE_HOST_ROOT, else /."""
    return Path(os.environ.get(HOST_ROOT_ENV) or "/")


def _read(root: Path, rel: str) -> str | None:
    try:
        return (root / rel).read_text()
    except OSError:
        return None


def read_numa_nodes(root: Path) -> list[dict[str, Any]]:
    """NUMA nodes with their CPUs and memory, from /sys/devices/system/node/node*/."""
    base = root / "sys/devices/system/node"
    nodes: list[dict[str, Any]] = []
    for d in sorted(base.glob("node[0-9]*"), key=lambda p: int(p.name[4:])):
        cpus = _read(d, "cpulist")
        meminfo = _read(d, "meminfo")
        nodes.append({"node": int(d.name[4:]), "cpus": (cpus or "").strip(),
                      "memory_gib": parse_meminfo_gib(meminfo) if meminfo else None})
    return nodes


def read_cpu_topology(root: Path) -> dict[str, int | None]:
    """Sockets and cores from /sys/devices/system/cpu/cpu*/topology (for CPUs without them in cpuinfo)."""
    packages: set[str] = set()
    cores: set[tuple[str, str]] = set()
    for d in (root / "sys/devices/system/cpu").glob("cpu[0-9]*/topology"):
        pkg, core = _read(d, "physical_package_id"), _read(d, "core_id")
        if pkg is not None:
            packages.add(pkg.strip())
            cores.add((pkg.strip(), (core or d.parent.name).strip()))
    return {"sockets": len(packages) or None, "cores": len(cores) or None}


def read_infiniband(root: Path) -> list[dict[str, Any]]:
    """Every InfiniBand/RoCE port: device, port, state, physical state, rate and link layer."""
    ports: list[dict[str, Any]] = []
    for port in sorted((root / "sys/class/infiniband").glob("*/ports/*")):
        rate = _read(port, "rate") or ""
        ports.append({
            "device": port.parent.parent.name,
            "port": int(port.name) if port.name.isdigit() else port.name,
            "state": parse_ib_state(_read(port, "state") or "unknown"),
            "phys_state": parse_ib_state(_read(port, "phys_state") or "unknown"),
            "rate": rate.strip(),
            "rate_gbps": parse_ib_rate(rate),
            "link_layer": (_read(port, "link_layer") or "unknown").strip(),
        })
    return ports


def read_gpudirect(root: Path) -> dict[str, Any]:
    """Whether a GPUDirect RDMA module is loaded (/proc/modules, or /sys/module for a built-in)."""
    modules_text = _read(root, "proc/modules")
    loaded = set(parse_modules(modules_text)) if modules_text is not None else set()
    found = [m for m in GPUDIRECT_MODULES if m in loaded or (root / "sys/module" / m).is_dir()]
    return {"loaded": bool(found), "modules": found,
            "source": "/proc/modules" if modules_text is not None else "/sys/module (no /proc/modules)"}


def gpu_locality(root: Path, bus_id: str) -> dict[str, Any]:
    """A GPU's NUMA node and local CPUs from /sys/bus/pci/devices/<bus id>/ (-1 / absent: unknown)."""
    dev = root / "sys/bus/pci/devices" / sysfs_bus_id(bus_id)
    numa = _read(dev, "numa_node")
    local = _read(dev, "local_cpulist")
    node = int(numa) if numa is not None and numa.strip().lstrip("-").isdigit() else None
    return {"bus_id": sysfs_bus_id(bus_id), "numa_node": node if node is not None and node >= 0 else None,
            "local_cpus": local.strip() if local else None}


def nvidia_smi_topology(timeout_s: float = 60.0) -> dict[str, Any]:
    """``nvidia-smi topo -m`` as text (an artifact for people), or why there is none."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return {"text": None, "error": "nvidia-smi not found on PATH"}
    try:
        proc = subprocess.run([exe, "topo", "-m"], capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"text": None, "error": f"nvidia-smi topo -m: {exc}"}
    if proc.returncode != 0:
        return {"text": None, "error": f"nvidia-smi topo -m exited {proc.returncode}: {proc.stderr.strip()[:500]}"}
    return {"text": proc.stdout, "error": None}


def discover_node(cfg: Config) -> dict[str, Any]:
    """Everything this module knows about the node, as JSON-serialisable data."""
    root = Path(cfg.root)
    cpuinfo = _read(root, "proc/cpuinfo") or ""
    cpu = parse_cpuinfo(cpuinfo)
    if cpu["sockets"] is None:
        cpu.update(read_cpu_topology(root))
    meminfo = _read(root, "proc/meminfo")
    os_release = _read(root, "etc/os-release")
    kernel = _read(root, "proc/sys/kernel/osrelease")
    mounts = _read(root, "proc/mounts")
    return {
        "cpu": cpu,
        "numa_nodes": read_numa_nodes(root),
        "memory_gib": parse_meminfo_gib(meminfo) if meminfo else None,
        "os": parse_os_release(os_release) if os_release else None,
        "kernel": kernel.strip() if kernel else (platform.release() if cfg.root == "/" else None),
        "gpus": [gpu_locality(root, b) for b in cfg.pci_bus_ids],
        "topology": nvidia_smi_topology(cfg.command_timeout_s) if cfg.topology else
        {"text": None, "error": "not requested (no GPU)"},
        "infiniband": read_infiniband(root),
        "gpudirect_rdma": read_gpudirect(root),
        "mounts": parse_mounts(mounts) if mounts else [],
    }


def run(cfg: Config) -> Result:
    """Discover this node; the data goes into ``details`` (nothing here is judged)."""
    return Result(metrics=(), details={"node": discover_node(cfg)})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", default="/", help="read proc/ and sys/ under this directory (default /)")
    parser.add_argument("--no-topology", action="store_true", help="do not run nvidia-smi topo -m")
    parser.add_argument("--bus-id", action="append", default=[], help="a GPU PCI bus id to locate (repeatable)")
    args = parser.parse_args()
    cfg = Config(root=args.root, topology=not args.no_topology, pci_bus_ids=tuple(args.bus_id))
    print(json.dumps({"host": platform.node(), "affinity": format_cpulist(os.sched_getaffinity(0)),
                      **run(cfg).details}, indent=2))


if __name__ == "__main__":
    main()
