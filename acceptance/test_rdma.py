"""RDMA below NCCL: every HCA port's write bandwidth from the memory of its nearest GPU (GPUDirect RDMA) and its
write latency, with perftest in loopback on its node, as azurehpc-health-checks' ``check_ib_bw_gdr`` gates every
HCA; and every RoCE port's GID at the index NCCL will use.

Each node's local rank 0 reads the node's ports and runs perftest; every rank gathers what every node saw and
judges it alike, so a failure names the host, the HCA and port, and the GPU whose memory it read. The fabric
phase's pair rounds (each rail between two nodes) are acceptance/test_rdma_rails.py.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch

from acceptance.evidence import Part, decide, host_root, judge_parts
from clustergate.run.recorder import Recorder
from workloads import faults
from workloads.interconnect import perftest
from workloads.node import discovery, hca_locality, roce
from workloads.node.checks import FABRIC_KINDS
from workloads.result import Result

BW, LAT = "rdma_write_bw_gbps", "rdma_write_lat_us"


def active_ports(root: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(every port under root's /sys/class/infiniband, those ACTIVE on an RDMA link layer)."""
    ports = discovery.read_infiniband(root)
    return ports, [p for p in ports if p["state"] == "ACTIVE" and p["link_layer"] in FABRIC_KINDS]


def node_gpus(cg: Recorder) -> dict[str, str]:
    """{'gpu 3': PCI bus id} of this node's GPUs, as the ranks' identities name them."""
    me = cg.identities[cg.rank]
    return {f"gpu {g['index']}": g["pci_bus_id"] for i in cg.identities if i["node_rank"] == me["node_rank"]
            and (g := i.get("gpu") or {}).get("pci_bus_id")}


def _cuda_index(bus_id: str) -> str | None:
    """The CUDA index of the GPU at ``bus_id`` in this process (perftest's --use_cuda where it has no bus id)."""
    want = discovery.sysfs_bus_id(bus_id)
    for i in range(torch.cuda.device_count() if torch.cuda.is_available() else 0):
        props = torch.cuda.get_device_properties(i)
        bdf = f"{getattr(props, 'pci_domain_id', 0):04x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
        if bdf == want:
            return str(i)
    return None


def gpu_memory(tool: perftest.Tool, root: Path, dev: str, gpus: dict[str, str],
               gdr: dict[str, Any]) -> tuple[dict[str, Any], str | None, str | None]:
    """(the GPU nearest HCA ``dev``, perftest's CUDA argument for its memory or None, why GPUDirect RDMA cannot be
    used, or None): what the node-phase loopback and the fabric phase's rails both measure from."""
    near = hca_locality.nearest_gpu(root, dev, gpus)
    if near["gpu"] is None:
        return near, None, None
    problem = perftest.gpudirect_problem(tool, gdr)
    cuda = near["gpu_bus_id"] if tool.cuda_bus_id else _cuda_index(near["gpu_bus_id"])
    if problem is None and cuda is None:
        problem = f"no CUDA device of this process is at {near['gpu_bus_id']}"
    return near, None if problem else cuda, problem


def gpudirect_unavailable(dev: str, near: dict[str, Any], host: str, problem: str) -> str:
    return (f"GPUDirect RDMA unavailable on {dev} ({near['gpu']}, {near['gpu_bus_id']}) on {host}: {problem}; "
            "measured from host memory instead")


def _one_port(tool: perftest.Tool, lat: perftest.Tool | None, root: Path, port: dict[str, Any], host: str,
              gpus: dict[str, str], gdr: dict[str, Any], choice: roce.Choice) -> dict[str, Any]:
    dev, num = port["device"], port["port"]
    gid = roce.port_gid(root, dev, num, choice)["gid_index"] if port["link_layer"] == "Ethernet" else None
    near, cuda, problem = gpu_memory(tool, root, dev, gpus, gdr)
    row: dict[str, Any] = {"port": f"{dev}/{num}", "fabric": FABRIC_KINDS[port["link_layer"]], "gid_index": gid,
                           "rate": port["rate"], **near, "memory": "host", "gpudirect_problem": None}
    run = None
    if cuda is not None:
        run = perftest.loopback(tool, perftest.bw_args(dev, num, gid_index=gid, cuda=cuda,
                                                       dmabuf=not gdr["loaded"], tool=tool))
        if perftest.gpu_memory_refused(run):
            problem, run = f"perftest could not use the GPU's memory: {perftest.said(run.output)}", None
    if problem is not None:
        row["gpudirect_problem"] = gpudirect_unavailable(dev, near, host, problem)
    elif run is not None:
        row["memory"] = f"{near['gpu']} ({near['gpu_bus_id']})" + ("" if gdr["loaded"] else ", dma-buf")
    if run is None:
        run = perftest.loopback(tool, perftest.bw_args(dev, num, gid_index=gid, cuda=None, dmabuf=False, tool=tool))
    row["bw_command"] = " ".join(run.command)
    try:
        row["bw_gbps"] = run.figure(perftest.BW_COLUMN)
    except perftest.PerftestError as exc:
        row["error"] = str(exc)
    if lat is not None:
        lrun = perftest.loopback(lat, perftest.lat_args(dev, num, gid_index=gid))
        row["lat_command"] = " ".join(lrun.command)
        row["lat_table"] = lrun.rows[-1] if lrun.rows else None
        try:
            row["lat_us"] = lrun.figure(perftest.LAT_COLUMN)
        except perftest.PerftestError as exc:
            row["error"] = "; ".join(filter(None, (row.get("error"), str(exc))))
    return row


def _node_rdma(cg: Recorder) -> dict[str, Any] | None:
    """This node's per-port perftest runs on its local rank 0 (None on other ranks), or why there are none."""
    me = cg.identities[cg.rank]
    if me["local_rank"] != 0:
        return None
    root, host = host_root(), me["host"]
    out: dict[str, Any] = {"rank": cg.rank, "host": host, "skip": None, "why": None, "rows": [], "failures": []}
    tool = perftest.Tool.find(perftest.BW_TOOL)
    if tool is None:
        return {**out, "skip": "package_missing", "why": f"perftest's {perftest.BW_TOOL} is not on PATH on {host} "
                "(install perftest, built with CUDA for GPUDirect RDMA)"}
    out["perftest"] = {"path": tool.path, "version": tool.version, "cuda": tool.cuda, "cuda_dmabuf": tool.cuda_dmabuf}
    ports, active = active_ports(root)
    if not ports:
        probe = perftest.loopback(tool, [], timeout_s=10.0)  # perftest itself looks for a device
        return {**out, "skip": "no_infiniband", "why": f"no HCA on {host}: {root / 'sys/class/infiniband'} lists no "
                f"port, and {perftest.BW_TOOL} (perftest {tool.version}) says: {perftest.said(probe.output)}"}
    if not active:
        out["failures"].append(f"{host}: no InfiniBand or RoCE port is ACTIVE ("
                               + "; ".join(f"{p['device']}/{p['port']} {p['state']}" for p in ports) + ")")
        return out
    lat = perftest.Tool.find(perftest.LAT_TOOL)
    gpus, gdr = node_gpus(cg), discovery.read_gpudirect(root)
    choice = roce.Choice.from_env(os.environ)
    out["rows"] = [_one_port(tool, lat, root, p, host, gpus, gdr, choice) for p in active]
    return out


@pytest.mark.metrics(BW, LAT)
def test_rdma_write_per_hca(cg: Recorder) -> None:
    """Every ACTIVE HCA port: perftest's ib_write_bw in loopback from its nearest GPU's memory (GPUDirect RDMA; a
    fall-back to host memory is named and fails on a GPU node) and ib_write_lat, each against the profile."""
    nodes = [n for n in cg.all_ranks(_node_rdma(cg)) if n is not None]
    failures: dict[int, list[str]] = {}
    parts: list[Part] = []
    for node in nodes:
        mine = failures.setdefault(node["rank"], [])
        mine += node["failures"]
        for row in node["rows"]:
            label = f"{row['port']} ({row['fabric']}, from {row['memory']} memory)"
            if row["gpudirect_problem"]:
                mine.append(f"{row['gpudirect_problem']}. Next step: {faults.next_step('config_gpudirect')}")
            if row.get("error"):
                mine.append(f"{node['host']}: {row['port']}: {row['error']}. Next step: "
                            f"{faults.next_step('rdma_bandwidth')}")
            for metric, key, unit in ((BW, "bw_gbps", "Gb/s"), (LAT, "lat_us", "us")):
                if key in row:
                    parts.append(Part(metric, node["rank"], "node", label, row[key], unit, "rdma_bandwidth"))
    verdicts = judge_parts(cg, parts)
    for owner, lines in verdicts.failures.items():
        failures.setdefault(owner, []).extend(lines)
    cg.record_result(Result(metrics=(), details={"rdma": nodes, "evidence": verdicts.rows}))
    for metric, worst, unit in ((BW, min, "Gb/s"), (LAT, max, "us")):  # the node's worst port
        values = [p.value for p in parts if p.metric == metric and p.owner == cg.rank]
        if values:
            cg.record(metric, worst(values), unit, scope="node")
    skipped = {n["host"]: n for n in nodes if n["skip"]}
    if not any(failures.values()) and skipped and len(skipped) == len(nodes):
        first = next(iter(skipped.values()))
        params = {"package": "perftest"} if first["skip"] == "package_missing" else {}
        cg.skip(f"{first['why']} ({len(skipped)}/{len(nodes)} nodes)", fact=first["skip"], **params)
    decide(cg, "RDMA write per HCA (perftest loopback)", failures, {})


def _node_roce(cg: Recorder) -> dict[str, Any] | None:
    me = cg.identities[cg.rank]
    if me["local_rank"] != 0:
        return None
    root = host_root()
    _, active = active_ports(root)
    choice = roce.Choice.from_env(os.environ)
    ports = [roce.port_gid(root, p["device"], p["port"], choice) for p in active if p["link_layer"] == "Ethernet"]
    return {"rank": cg.rank, "host": me["host"], "ports": ports}


def test_roce_gid_at_nccl_index(cg: Recorder) -> None:
    """Every ACTIVE RoCE port has a non-zero RoCEv2 GID at the index NCCL will use (NCCL_IB_GID_INDEX, else NCCL's
    own choice), said per port in the record."""
    nodes = [n for n in cg.all_ranks(_node_roce(cg)) if n is not None]
    cg.record_result(Result(metrics=(), details={"roce": nodes}))
    if not any(n["ports"] for n in nodes):
        cg.skip(f"no ACTIVE RoCE (link layer Ethernet) port on {len(nodes)} node(s) "
                f"({', '.join(n['host'] for n in nodes[:4])}): no RoCE GID to check", fact="no_roce")
    failures = {n["rank"]: [f"{n['host']}: {p['device']} port {p['port']}, GID index {p['gid_index']} "
                            f"({p['chosen_by']}): {p['problem']}" for p in n["ports"] if p["problem"]]
                for n in nodes}
    decide(cg, "RoCE GID at the index NCCL uses", failures, {})
