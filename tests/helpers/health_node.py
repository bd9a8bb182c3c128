"""A made-up GPU node for ``clustergate health``: NVML (tests/helpers/fake_nvml/pynvml.py) and the files it reads.

``GpuNode`` builds, under one root directory, what $CLUSTERGATE_HOST_ROOT points the check at: the PCI bus
(GPUs, NVSwitches), /dev/nvidia<N>, /dev/kmsg, /proc (boot id, NUMA balancing, processes), cpufreq, IOMMU
groups and InfiniBand ports; and the JSON description the fake NVML answers from. Every part is healthy for
the shipped h100-sxm-80gb profile until a test plants a fault (``gpu(i)``'s state, a file); ``run`` starts the
real command in a subprocess, as a scheduler would.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
FAKE_NVML = Path(__file__).resolve().parent / "fake_nvml"
BUSES = ("0000:18:00.0", "0000:2a:00.0", "0000:3a:00.0", "0000:5d:00.0", "0000:9a:00.0", "0000:ab:00.0",
         "0000:ba:00.0", "0000:db:00.0")
"""The GPUs' PCI addresses, as on an HGX H100 baseboard."""
NVSWITCHES = ("0000:05:00.0", "0000:06:00.0", "0000:07:00.0", "0000:08:00.0")
HOST = "gpu-node-07"
SITE = """
  site:
    extends: h100-sxm-80gb
    settings:
      ib_ports_per_node: 2
      ib_rate_gbps: 400
      min_driver_version: "535"
"""
"""A site profile over the shipped H100 one that also judges InfiniBand ports and a driver minimum."""


def kmsg(*messages: str, first: int = 1200) -> str:
    """/dev/kmsg records: 'priority,sequence,microseconds,-;message'."""
    return "".join(f"4,{first + i},{(first + i) * 1000},-;{m}\n" for i, m in enumerate(messages))


def xid(bus: str, code: int, text: str) -> str:
    """A kernel log line of an XID on the GPU at ``bus`` (sysfs form), as the driver writes it."""
    return f"NVRM: Xid (PCI:{bus[:-2]}): {code}, pid='<unknown>', name=<unknown>, {text}"


class GpuNode:
    def __init__(self, root: Path, gpus: int = 8) -> None:
        self.root = root
        self.spec: dict[str, Any] = {"gpus": []}
        for i in range(gpus):
            self.spec["gpus"].append({"answers": {
                "nvmlDeviceGetIndex": i, "nvmlDeviceGetSerial": f"16529230173{i:02d}",
                "nvmlDeviceGetUUID": f"GPU-5e1f9b2a-77c1-4f0e-9d1e-2b7c3a9e4d{i:02d}",
                "pci_bus_id": "0000" + BUSES[i]}, "state": {}})
            self._pci(BUSES[i], "0x030200")
            self.write(f"dev/nvidia{i}", "")
        for bus in NVSWITCHES:
            self._pci(bus, "0x068000")
        self.write("dev/kmsg", kmsg("NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.54.15"))
        self.write("proc/sys/kernel/random/boot_id", "3f1c2b9e-7a41-4d0e-9c55-0a6b1f2e8d47\n")
        self.write("proc/sys/kernel/numa_balancing", "0\n")
        self.write("proc/4100/comm", "nv-fabricmanager\n")
        self.write("proc/4100/status", "Name:\tnv-fabricmanager\nPid:\t4100\nPPid:\t1\n")
        for cpu in range(4):
            self.write(f"sys/devices/system/cpu/cpu{cpu}/cpufreq/scaling_governor", "performance\n")
        self.write("sys/kernel/iommu_groups/0/type", "identity\n")
        for hca in ("mlx5_0", "mlx5_1"):
            self.ib_port(hca)

    def write(self, rel: str, text: str) -> Path:
        path = self.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return path

    def _pci(self, bus: str, cls: str, vendor: str = "0x10de") -> None:
        self.write(f"sys/bus/pci/devices/{bus}/vendor", vendor + "\n")
        self.write(f"sys/bus/pci/devices/{bus}/class", cls + "\n")

    def ib_port(self, hca: str, state: str = "4: ACTIVE", rate: str = "400 Gb/sec (4X NDR)") -> None:
        base = f"sys/class/infiniband/{hca}/ports/1"
        for name, text in (("state", state), ("phys_state", "5: LinkUp"), ("rate", rate),
                           ("link_layer", "InfiniBand")):
            self.write(f"{base}/{name}", text + "\n")

    def gpu(self, index: int) -> dict[str, Any]:
        """GPU ``index``'s description for the fake NVML (``answers``, ``state``, ``counters``, ``fail``, ...)."""
        return self.spec["gpus"][index]

    def process(self, pid: int, comm: str, ppid: int = 1) -> None:
        self.write(f"proc/{pid}/comm", comm + "\n")
        self.write(f"proc/{pid}/status", f"Name:\t{comm}\nPid:\t{pid}\nPPid:\t{ppid}\n")

    def site_thresholds(self) -> Path:
        """The shipped thresholds.yaml with the ``site`` profile added."""
        path = self.root.parent / "site-thresholds.yaml"  # beside the host's tree, not in it
        path.write_text((ROOT / "thresholds.yaml").read_text() + SITE)
        return path

    def env(self, **extra: str) -> dict[str, str]:
        spec = self.root.parent / "nvml.json"  # beside the host's tree, not in it
        spec.write_text(json.dumps(self.spec))
        base = {k: v for k, v in os.environ.items() if not k.startswith(("CLUSTERGATE_", "SLURM"))}
        return {**base, "PYTHONPATH": os.pathsep.join([str(FAKE_NVML), str(ROOT)]),
                "CLUSTERGATE_FAKE_NVML": str(spec), "CLUSTERGATE_HOST_ROOT": str(self.root),
                "CLUSTERGATE_NODE_NAME": HOST, **extra}

    def run(self, *args: str, env: dict[str, str] | None = None, timeout: float = 60,
            real_nvml: bool = False) -> subprocess.CompletedProcess[str]:
        """``python -m clustergate health ARGS`` on this node (``real_nvml``: the machine's own pynvml)."""
        environ = self.env(**(env or {}))
        if real_nvml:
            environ["PYTHONPATH"] = str(ROOT)
        return subprocess.run([sys.executable, "-m", "clustergate", "health", *args], env=environ,
                              capture_output=True, text=True, timeout=timeout, cwd=self.root)
