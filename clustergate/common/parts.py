"""Which part of the cluster a figure belongs to, read from a results.json dict: a rank's host, node, GPU index,
serial and UUID, and the label every text names a GPU by (``rank 13 node-3 gpu 5 serial 1650...``).

The judge's failure lines, the baseline comparison and the report all name a part through here, so that a GPU
is named alike wherever it is named.
"""

from __future__ import annotations

from typing import Any


def rank_index(results: dict[str, Any]) -> dict[int, dict[str, Any]]:
    """rank -> host, node_rank, local_rank, gpu_index, gpu_serial, gpu_uuid, gpu_name."""
    out: dict[int, dict[str, Any]] = {}
    for node in results.get("nodes", []):
        gpus = {g.get("rank"): g for g in node.get("gpus", [])}
        for local, rank in enumerate(node.get("ranks", [])):
            gpu = gpus.get(rank) or {}
            out[rank] = {"rank": rank, "host": node.get("host", "?"), "node_rank": node.get("node_rank", 0),
                         "local_rank": gpu.get("local_rank", local), "gpu_index": gpu.get("index"),
                         "gpu_serial": gpu.get("serial"), "gpu_uuid": gpu.get("uuid"), "gpu_name": gpu.get("name")}
    return out


def gpu_part(index: int | None, serial: str | None) -> str:
    """A GPU as every text names it after its host: ``gpu 5 serial 1650...`` (each piece where it is known; "" for
    neither)."""
    return " ".join(([f"gpu {index}"] if index is not None else []) + ([f"serial {serial}"] if serial else []))


def on_host(host: str, index: int | None, serial: str | None) -> str:
    """``node-3 gpu 5 serial 1650...``: the host, then its GPU where there is one (``gpu_part``)."""
    part = gpu_part(index, serial)
    return f"{host} {part}" if part else host


def gpu_label(where: dict[str, Any], short: bool = False) -> str:
    """``rank 13 node-3 gpu 5 serial 1650...`` (short: ``node-3:5``, or ``node-3 r13`` without a GPU)."""
    host, index, rank = where.get("host", "?"), where.get("gpu_index"), where.get("rank")
    if short:
        return f"{host}:{index}" if index is not None else f"{host} r{rank}"
    return f"rank {rank} {on_host(host, index, where.get('gpu_serial'))}"
