"""Judging what discovery gathered from every node: pure functions over plain data, no I/O.

The acceptance tests gather each rank's or node's discovery first, then call these on every rank
alike, so every rank reaches the same verdict and the message names the odd node.
"""

from __future__ import annotations

import json
from typing import Any

from workloads.node.discovery import format_cpulist, parse_cpulist


def binding_problem(affinity: set[int], local_cpus: str | None, online: set[int]) -> str | None:
    """Why a rank's CPU affinity is not local to its GPU; None when it is (or nothing says otherwise)."""
    if not local_cpus:
        return None
    local = set(parse_cpulist(local_cpus))
    if not local or local >= online:
        return None  # the GPU is local to every CPU (one NUMA node): any binding is local
    remote = affinity - local
    if not remote:
        return None
    return (f"allowed CPUs {format_cpulist(affinity)} include {len(remote)} outside the GPU's local CPUs "
            f"{format_cpulist(local)}")


FABRIC_KINDS = {"InfiniBand": "InfiniBand", "Ethernet": "RoCE"}
"""The link layers whose ports carry RDMA, and the fabric each makes: an Ethernet link layer port is RoCE."""


def fabric_kind(ports: list[dict[str, Any]]) -> str | None:
    """'InfiniBand', 'RoCE' or 'InfiniBand+RoCE': the fabrics of a node's ACTIVE ports; None without any."""
    kinds = sorted({FABRIC_KINDS[p["link_layer"]] for p in ports
                    if p["state"] == "ACTIVE" and p["link_layer"] in FABRIC_KINDS})
    return "+".join(kinds) or None


def ib_problem(ports: list[dict[str, Any]], required: int, rate_gbps: float | None) -> str | None:
    """Why a node's RDMA ports fall short of ``required`` ACTIVE ones at ``rate_gbps``; None if not.

    InfiniBand and RoCE (link layer Ethernet) ports count alike; ``rate_gbps`` keeps a slower storage or
    management NIC from counting.
    """
    good = [p for p in ports if p["state"] == "ACTIVE" and p["link_layer"] in FABRIC_KINDS
            and (rate_gbps is None or (p["rate_gbps"] or 0) >= rate_gbps)]
    if len(good) >= required:
        return None
    seen = "; ".join(f"{p['device']}/{p['port']} {p['state']} {p['rate'] or '?'} "
                     f"{FABRIC_KINDS.get(p['link_layer'], p['link_layer'])}"
                     for p in ports) or "no ports under /sys/class/infiniband (is the driver loaded?)"
    want = f" at >= {rate_gbps:g} Gb/s" if rate_gbps else ""
    return f"{len(good)} InfiniBand or RoCE ports ACTIVE{want}, the profile requires {required}: {seen}"


def disagreement(what: str, values: dict[str, Any]) -> str | None:
    """One line naming the odd nodes, given {node label: value}; None when every node agrees.

    'driver: node 3 (gpu-17) has '550.54.15' where the other 15 nodes have '560.35.03''; with no
    strict majority every value is listed with its nodes.
    """
    groups: dict[str, list[str]] = {}
    shown: dict[str, Any] = {}
    for label, value in values.items():
        key = json.dumps(value, sort_keys=True, default=str)
        groups.setdefault(key, []).append(label)
        shown[key] = value
    if len(groups) <= 1:
        return None
    ordered = sorted(groups.items(), key=lambda kv: -len(kv[1]))
    (common, majority), rest = ordered[0], ordered[1:]
    if len(majority) * 2 > len(values):
        odd = "; ".join(f"{', '.join(labels)} {'has' if len(labels) == 1 else 'have'} {shown[k]!r}"
                        for k, labels in rest)
        return f"{what}: {odd} where the other {len(majority)} nodes have {shown[common]!r}"
    return f"nodes disagree on {what}: " + "; ".join(
        f"{shown[k]!r} on {', '.join(labels)}" for k, labels in ordered)
