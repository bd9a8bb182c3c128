"""Whether NCCL sent each rank's network traffic through the NIC of that rank's own GPU (its rail).

What NCCL chose comes from its own log (``workloads.interconnect.nccl_log``): every '[send] via NET/IB/<dev>'
channel line a process wrote, and the 'NET/IB : Using [0]mlx5_0:1/IB ...' line that names NIC index <dev>. What it
should have chosen comes from ``nvidia-smi topo -m`` (``workloads.node.topology``): the GPU's nearest NIC. A
channel whose line carries a proxy rank ('NET/IB/1(1)', PXN) is sent on purpose through another GPU's NIC over
NVLink: it is counted apart, never as cross-rail. NCCL names a NIC by its index in its own list, nvidia-smi by its
column: the two are compared by device name (mlx5_0), which both take from the RDMA device.

A wrong but valid choice costs bandwidth silently: 29% of all-reduce on 2x8 H100 (NVIDIA-NeMo/RL PR #3670).
Pure functions; the acceptance test gathers each rank's parts and judges them alike on every rank.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any


def cross_rail(rank: int, where: str, sends: Iterable[Mapping[str, Any]], devices: Mapping[int, str],
               own: str | None) -> tuple[int, list[str]]:
    """Channels rank ``rank`` sent through a NIC other than ``own`` (its GPU's nearest NIC, by device name), and
    one line per NIC it took, naming the rank, the NIC it took and the one it should have. ``sends``:
    ``NcclLog.nic_sends()`` of the rank; ``devices``: NCCL's index -> name (``nccl_log.ib_devices``)."""
    count, lines = 0, []
    for s in sends:
        if s.get("proxy") is not None:
            continue
        took = devices.get(int(s["dev"]))
        if took is None:
            lines.append(f"rank {rank} ({where}): {s['channels']} channels via NET/{s['net']}/{s['dev']}, a NIC "
                         f"index NCCL's 'NET/IB : Using' line does not list: cannot tell which NIC it is")
            count += int(s["channels"])
        elif own is not None and took != own:
            lines.append(f"rank {rank} ({where}): NCCL sent {s['channels']} channels through NIC {s['dev']} ({took}); "
                         f"the GPU's own NIC is {own} (its nearest in nvidia-smi topo -m): a cross-rail choice. "
                         "Check NCCL_IB_HCA, NCCL_CROSS_NIC and NCCL_TOPO_FILE")
            count += int(s["channels"])
    return count, lines


def summary(sends: Iterable[Mapping[str, Any]], devices: Mapping[int, str]) -> dict[str, int]:
    """Channels per NIC name as NCCL used them ('mlx5_0': 12, 'mlx5_3 via PXN': 4): what the record shows."""
    out: dict[str, int] = {}
    for s in sends:
        name = devices.get(int(s["dev"]), f"NET/{s['net']}/{s['dev']}")
        key = name if s.get("proxy") is None else f"{name} via PXN (rank {s['proxy']})"
        out[key] = out.get(key, 0) + int(s["channels"])
    return out
