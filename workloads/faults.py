"""The one table of failure categories and XID codes: what each means and what to do next.

Every failure message of the error-evidence and configuration checks names its category and ends with
the category's next step, so the person at the rack knows what to try. XIDs are the NVIDIA driver's
error codes (kernel log ``NVRM: Xid``, NVML's XID events); their meanings follow NVIDIA's XID catalog
(docs.nvidia.com/deploy/xid-errors, "Analyzing Xid Errors with the Xid Catalog"); ``critical`` marks
the codes that catalog treats as hardware, memory, link or firmware faults (they fail the run), the
others (application faults, informational events) are counted as warnings.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Category:
    meaning: str
    next_step: str


CATEGORIES: dict[str, Category] = {
    # GPU
    "gpu_off_bus": Category("the GPU fell off the PCIe bus",
                            "reseat or replace the GPU (check its power cables and riser), then reboot the node"),
    "uncorrectable_ecc": Category("uncorrectable ECC error in GPU memory",
                                  "drain the GPU and reset it (nvidia-smi -r) or reboot; RMA it if errors recur"),
    "corrected_ecc": Category("corrected (single-bit) ECC errors",
                              "monitor: the GPU still works; run dcgmi diag -r 3 if the rate grows"),
    "memory_repair": Category("a memory row was remapped (or a page retired) during the run",
                              "reset the GPU when convenient to apply it; RMA the GPU if remaps keep coming"),
    "row_remap_pending": Category("a row remap waits for a GPU reset",
                                  "reset the GPU (nvidia-smi -r) or reboot to apply it"),
    "row_remap_failure": Category("row remapping failed: no spare rows left", "RMA the GPU"),
    "memtest": Category("GPU memory returned a word other than the one written",
                        "reset the GPU and run again; RMA the GPU if it repeats (dcgmi diag -r 4 runs NVIDIA's "
                        "memtest)"),
    "pcie_replay": Category("PCIe replays above what the link's bit error rate allows",
                            "reseat the GPU and its riser; run the platform's PCIe diagnostics; if the fault is on "
                            "the board, run NVIDIA's field diagnostic"),
    "nvlink_crc": Category("NVLink CRC errors (corrected by retransmission)",
                           "monitor; above DCGM's 100/s limit, reseat the board or have the vendor check the "
                           "NVLink/NVSwitch baseboard"),
    "nvlink": Category("NVLink replay or recovery errors: a link retrained or resent",
                       "check nvidia-smi nvlink -e and the fabric manager log, reset the GPU; if a link keeps failing "
                       "have the vendor check the baseboard"),
    "thermal_power": Category("a thermal or power violation held the GPU back",
                              "check cooling (airflow, fans, inlet temperature) and the power supply; "
                              "nvidia-smi -q -d PERFORMANCE shows the reasons"),
    "firmware": Category("GPU firmware (GSP or micro-controller) error",
                         "reset the GPU; update the driver and VBIOS to the vendor's release; collect "
                         "nvidia-bug-report.sh for support if it recurs"),
    "driver": Category("NVIDIA driver error", "collect nvidia-bug-report.sh, reset the GPU, update the driver"),
    "recovery_action": Category("the driver asks for a recovery action",
                                "read 'GPU Recovery Action' in nvidia-smi -q and do it (GPU reset, drain and reboot)"),
    "application": Category("an application fault on the GPU (bad memory access, engine exception)",
                            "the suite's own workloads should not cause these: run again, and run dcgmi diag -r 3 "
                            "if it recurs on the same GPU"),
    "unknown_xid": Category("an XID this suite's table does not list",
                            "look it up in NVIDIA's XID catalog (docs.nvidia.com/deploy/xid-errors)"),
    # PCIe AER, InfiniBand
    "aer_fatal": Category("PCIe fatal uncorrectable errors (AER)",
                          "reseat the device named, check its slot, riser and cable; replace it if errors recur"),
    "aer_nonfatal": Category("PCIe non-fatal uncorrectable errors (AER)",
                             "reseat the device named and check its slot and riser; replace it if errors recur"),
    "aer_correctable": Category("PCIe correctable errors (AER)",
                                "monitor; reseat the device named if the count keeps growing"),
    "ib_link_down": Category("an InfiniBand link went down or changed state during the run",
                             "check the port's cable and transceiver (mlxlink -d DEV -p PORT -m) and the switch "
                             "port; replace the cable if it repeats"),
    "ib_link_errors": Category("physical-layer errors on an InfiniBand link (symbol errors, link recovery)",
                               "reseat or replace the cable and transceiver; check the link's BER with mlxlink"),
    "ib_receive_errors": Category("InfiniBand packets received with errors",
                                  "check the cable and the peer port (switch); replace the cable if it repeats"),
    "ib_discards": Category("InfiniBand packets discarded on transmit (congestion or a link going down)",
                            "check the switch port and the fabric's congestion control; check the link's state"),
    "rdma_bandwidth": Category("an HCA port's RDMA write bandwidth (perftest ib_write_bw) below its criterion, or "
                               "no figure from perftest",
                               "check the port's link (mlxlink -d DEV -p PORT -m), the HCA's and the GPU's PCIe links "
                               "(lspci -vv: speed and width), ACS on the GPU-HCA path and the GPU-NIC distance "
                               "(nvidia-smi topo -m); run ib_write_bw in loopback by hand"),
    "roce_gid": Category("a RoCE port has no usable RoCEv2 GID at the index NCCL uses (all zero, missing, RoCE v1)",
                         "give the port's network interface its address (ip addr; the GID follows it), check "
                         "show_gids and NCCL_IB_GID_INDEX / NCCL_IB_ADDR_FAMILY / NCCL_IB_ROCE_VERSION_NUM"),
    # Configuration (the profile's expect: section)
    "config_versions": Category("driver, CUDA or NCCL outside the profile's range",
                                "install the versions the profile names (or widen expect: if the site allows)"),
    "config_persistence": Category("GPU persistence mode is off",
                                   "enable nvidia-persistenced (systemctl enable --now nvidia-persistenced) or "
                                   "nvidia-smi -pm 1"),
    "config_fabric_manager": Category("the NVSwitch fabric is not up (fabric manager not running or not done)",
                                      "systemctl enable --now nvidia-fabricmanager (its version must equal the "
                                      "driver's); see its log in /var/log/fabricmanager.log"),
    "config_acs": Category("PCIe ACS redirects peer traffic between GPU and NIC through the root complex",
                           "disable ACS in the BIOS (or setpci -s BRIDGE ECAP_ACS+6.w=0 at boot); NCCL's "
                           "troubleshooting guide explains why"),
    "config_iommu": Category("IOMMU mode differs from the profile's",
                             "set it on the kernel command line (e.g. iommu=pt) and reboot"),
    "config_numa_balancing": Category("automatic NUMA balancing is on",
                                      "sysctl -w kernel.numa_balancing=0 (and in /etc/sysctl.d to keep it)"),
    "config_cpu_governor": Category("CPU frequency governor differs from the profile's",
                                    "cpupower frequency-set -g performance (or the BIOS power profile)"),
    "config_gpudirect": Category("GPUDirect RDMA not available or not used by NCCL",
                                 "load nvidia_peermem (modprobe nvidia_peermem) or use the open kernel module with "
                                 "dma-buf; check NCCL_NET_GDR_LEVEL, ACS and the GPU-NIC PCIe distance"),
    # DCGM's own error categories (dcgm_errors.h DCGM_FR_EC_*) map onto these
    "dcgm": Category("DCGM diagnostic failure", "follow DCGM's message; dcgmi diag -r 3 -v gives details"),
}


@dataclass(frozen=True, slots=True)
class Xid:
    code: int
    meaning: str
    category: str
    critical: bool


def _xids(*rows: tuple[int, str, str, bool]) -> dict[int, Xid]:
    return {code: Xid(code, meaning, category, critical) for code, meaning, category, critical in rows}


XIDS: dict[int, Xid] = _xids(
    (8, "GPU stopped processing (channel idle timeout)", "application", False),
    (13, "graphics engine exception", "application", False),
    (31, "GPU memory page fault", "application", False),
    (32, "invalid or corrupted push buffer stream", "application", False),
    (38, "driver firmware error", "driver", True),
    (43, "GPU stopped processing (channel reset)", "application", False),
    (45, "preemptive cleanup after an earlier error", "application", False),
    (48, "double-bit (uncorrectable) ECC error", "uncorrectable_ecc", True),
    (61, "internal micro-controller breakpoint/warning", "firmware", True),
    (62, "internal micro-controller halt", "firmware", True),
    (63, "ECC page retirement or row remapping recorded", "memory_repair", False),
    (64, "ECC page retirement or row remapping failed", "row_remap_failure", True),
    (69, "graphics engine class error", "application", False),
    (74, "NVLink error", "nvlink", True),
    (79, "GPU has fallen off the bus", "gpu_off_bus", True),
    (92, "high single-bit ECC error rate", "corrected_ecc", False),
    (94, "contained ECC error", "uncorrectable_ecc", True),
    (95, "uncontained ECC error", "uncorrectable_ecc", True),
    (109, "context switch timeout", "application", False),
    (119, "GSP RPC timeout", "firmware", True),
    (120, "GSP error", "firmware", True),
    (121, "C2C link corrected error", "nvlink_crc", False),
    (122, "SPI PMU RPC read failure", "firmware", True),
    (123, "SPI PMU RPC write failure", "firmware", True),
    (124, "SPI PMU RPC erase failure", "firmware", True),
    (140, "unrecovered ECC error", "uncorrectable_ecc", True),
    (143, "GPU initialization failure", "firmware", True),
    (154, "GPU recovery action changed", "recovery_action", True),
)


def xid(code: int) -> Xid:
    """The table's entry; an unlisted code counts as critical until someone has looked it up."""
    return XIDS.get(code) or Xid(code, "not in this suite's table", "unknown_xid", True)


def next_step(category: str) -> str:
    """'<meaning>: <what to do>' for a category (a KeyError names the unknown one: a bug, not input)."""
    c = CATEGORIES[category]
    return f"{c.meaning}: {c.next_step}"
