"""Each GPU's own NIC: in the node phase, ``nvidia-smi topo -m`` against the profile's node shape (a NIC per
GPU, near it on PCIe and on its NUMA node); in the fabric phase, the NIC NCCL actually sent each rank's traffic
through, read from NCCL's own log, against that GPU's own NIC. A failure names host, GPU or rank, the NIC and its
distance; the peers are azurehpc-health-checks' azure_hw_topology_check.nhc (the node's topology against its SKU's)
and NVIDIA-NeMo/RL PR #3670 (a wrong but valid NIC choice cost 29% of all-reduce on 2x8 H100).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from clustergate.run.recorder import Recorder
from workloads.interconnect import comm_groups as cgroups
from workloads.interconnect import nic_choice
from workloads.node import discovery, topology
from workloads.result import Result

PROBE_BYTES = 64 << 20
"""An all-reduce this large takes the ring on every channel: NCCL connects (and logs) each channel's NIC."""


def _node_topology(cg: Recorder) -> dict[str, Any] | None:
    """This node's ``nvidia-smi topo -m`` text and its NICs' NUMA nodes, read on its local rank 0; None elsewhere."""
    if cg.identities[cg.rank]["local_rank"] != 0:
        return None
    seen = discovery.nvidia_smi_topology()
    numa: dict[str, int] = {}
    if seen["text"] is not None:
        try:
            topo = topology.parse(seen["text"])
            numa = topology.nic_numa_nodes([topo.name(n) for n in topo.nics], Path("/"))
        except topology.TopologyError:
            pass  # judged below, on every rank alike
    return {**seen, "nic_numa": numa}


def _parsed(seen: dict[str, Any]) -> tuple[topology.Topology | None, str | None]:
    if seen["text"] is None:
        return None, f"cannot read the topology: {seen['error']}"
    try:
        return topology.parse(seen["text"]), None
    except topology.TopologyError as exc:
        return None, f"nvidia-smi topo -m: {exc}"


def _topologies(cg: Recorder) -> dict[str, tuple[topology.Topology | None, str | None, dict[str, int]]]:
    """Every node's topology (or why there is none) and its NICs' NUMA nodes, by host, on every rank."""
    out = {}
    for ident, seen in zip(cg.identities, cg.all_ranks(_node_topology(cg)), strict=True):
        if seen is not None:
            topo, why = _parsed(seen)
            out[ident["host"]] = (topo, why, seen["nic_numa"])
    return out


@pytest.mark.metrics("gpu_nic_topology_problems")
def test_gpu_nearest_nic_is_its_own(cg: Recorder) -> None:
    """Every GPU's nearest NIC in ``nvidia-smi topo -m`` is its own (no other GPU's where the profile's node has a
    NIC per GPU), no farther than ``nic_max_distance`` and on the GPU's NUMA node."""
    cg.skip_unless_everywhere(cg.device.type == "cuda", "no GPU on this rank (cpu profile): no GPU-NIC topology",
                              fact="no_gpu")
    nics = cg.setting("nics_per_node", None) or 0
    if not nics:
        cg.skip(f"profile {cg.profile_name!r} names no node shape of NICs (settings.nics_per_node absent or 0)",
                fact="not_required", setting="settings.nics_per_node")
    shape = topology.Shape(nics_per_node=nics, max_distance=cg.setting("nic_max_distance", "PXB"))
    nodes = _topologies(cg)
    if all(topo is not None and not topo.nics for topo, _, _ in nodes.values()):
        cg.skip(f"nvidia-smi topo -m shows no NIC on {', '.join(sorted(nodes))}: no GPU-NIC path to judge",
                fact="no_infiniband")
    per_node: dict[str, Any] = {}
    problems: dict[str, list[str]] = {}
    for host, (topo, why, numa) in nodes.items():
        if topo is None:
            problems[host] = [f"{host}: {why}"]
            continue
        problems[host] = topology.problems(topo, shape, host, numa)
        per_node[host] = {"own_nic": topology.assign(topo), "nic_numa": numa, "problems": problems[host]}
    mine = cg.identities[cg.rank]["host"]
    cg.record("gpu_nic_topology_problems", len(problems.get(mine, [])), "count", scope="node",
              description="GPUs whose nearest NIC is shared, too far or on another NUMA node (nvidia-smi topo -m)")
    cg.record_result(Result(metrics=(), details={"topology": per_node, "shape": {"nics_per_node": nics,
                                                                                 "max_distance": shape.max_distance}}))
    lines = [p for host in sorted(problems) for p in problems[host]]
    if lines:
        pytest.fail("GPUs without their own NIC:\n  " + "\n  ".join(lines[:64]), pytrace=False)


def _my_nic_sends(cg: Recorder) -> dict[str, Any]:
    """This rank's network sends by NIC, over the job's and the rails' communicators, after a ring-sized
    all-reduce on each (NCCL connects channels on first use), and NCCL's NIC list."""
    sends: list[dict[str, Any]] = []
    devices: dict[int, str] = {}
    modes = []
    for scope in ("world", "net"):
        comm = cgroups.scope_comm(scope, cg.setting("nccl_algo", ""))
        if not comm.active:
            continue
        with comm.window():
            dist.all_reduce(torch.ones(PROBE_BYTES // 4, device=cg.device), group=comm.group)
        summary = comm.log.summary()
        sends += [s for s in summary["nic_sends"] if s["net"].startswith("IB")]
        devices.update(summary["ib_devices"])
        modes.append(comm.capture.get("mode", "off") if comm.capture else "off")
    return {"sends": sends, "devices": devices, "blind": "off" in modes}


@pytest.mark.multinode
@pytest.mark.metrics("nccl_cross_rail_channels")
def test_nccl_uses_each_gpus_own_nic(cg: Recorder) -> None:
    """Every network channel NCCL set up on a rank (its log's '[send] via NET/IB/<dev>') goes through the NIC of
    the rank's own GPU (its nearest in ``nvidia-smi topo -m``); PXN channels, routed through another GPU's NIC on
    purpose, are counted apart."""
    cg.skip_unless_everywhere(cg.device.type == "cuda", "gloo (CPU run): no NCCL to read", fact="no_gpu")
    nodes = len({i["node_rank"] for i in cg.identities})
    cg.skip_unless_everywhere(nodes > 1, "the job has one node: NCCL sends nothing through a NIC", fact="one_node")
    mine = _my_nic_sends(cg)
    everyone = cg.all_ranks(mine)
    if not any(e["sends"] for e in everyone) and not any(e["blind"] for e in everyone):
        cg.skip("NCCL sent no channel through an InfiniBand or RoCE NIC (NVLink/P2P or sockets only; "
                "test_nccl_transport judges the transport)", fact="no_infiniband")
    nodes_topo = _topologies(cg)
    count: dict[int, int] = {}
    lines, per_rank = [], []
    for rank, (ident, seen) in enumerate(zip(cg.identities, everyone, strict=True)):
        host, gpu = ident["host"], (ident.get("gpu") or {}).get("index")
        where = f"{host} GPU {gpu}"
        if seen["blind"]:
            lines.append(f"rank {rank} ({where}): cannot read NCCL's log; launch with NCCL_DEBUG=INFO "
                         "NCCL_DEBUG_FILE=DIR/nccl.%h.%p.log, DIR a directory only you can write")
            count[rank] = 0
            continue
        topo, why, _ = nodes_topo.get(host, (None, "no topology read on this host", {}))
        own = None
        if topo is not None and gpu is not None:
            own = topology.assign(topo).get(int(gpu), {}).get("name")
        if own is None and seen["sends"]:
            lines.append(f"rank {rank} ({where}): its GPU's own NIC is unknown ({why or 'no row for the GPU'})")
        count[rank], found = nic_choice.cross_rail(rank, where, seen["sends"], seen["devices"], own)
        lines += found
        per_rank.append({"rank": rank, "host": host, "gpu": gpu, "own_nic": own,
                         "nccl_nics": nic_choice.summary(seen["sends"], seen["devices"])})
    cg.record("nccl_cross_rail_channels", count[cg.rank], "count",
              description="network channels NCCL sent through a NIC other than the rank's GPU's own")
    cg.record_result(Result(metrics=(), details={"nic_choice": per_rank}))
    if lines:
        pytest.fail("NCCL's choice of NIC:\n  " + "\n  ".join(lines[:64]), pytrace=False)
