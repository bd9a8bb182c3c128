"""The node around the GPUs: alike everywhere, CPUs bound near their GPU, InfiniBand up, the shared
directory shared, names resolving and the rendezvous store reachable from every rank.

Every test gathers what each rank saw before judging, so all ranks reach the same verdict and a
failure names the odd node. ``test_nodes_built_alike`` records every node's discovery (CPU, NUMA,
memory, OS, ``nvidia-smi topo -m``, InfiniBand ports, GPUDirect RDMA, shared mounts).
"""

from __future__ import annotations

import functools
import os
import statistics
from pathlib import Path
from typing import Any

import pytest
import torch

from acceptance.shared_dir import one_shared_dir
from clustergate.run.recorder import Recorder
from clustergate.trust.identity import environment
from workloads.node import checks as node_checks
from workloads.node import discovery, rendezvous, shared_fs
from workloads.result import Result

VERSIONS = ("driver", "cuda", "nccl", "torch", "python")


def _node_label(ident: dict[str, Any]) -> str:
    return f"node {ident['node_rank']} ({ident['host']})"


def _bus_id(cg: Recorder) -> str | None:
    """This rank's GPU PCI bus id: NVML's, else CUDA's."""
    gpu = cg.identities[cg.rank].get("gpu") or {}
    if gpu.get("pci_bus_id"):
        return gpu["pci_bus_id"]
    if cg.device.type != "cuda":
        return None
    props = torch.cuda.get_device_properties(cg.device)
    if not hasattr(props, "pci_bus_id"):
        return None
    return f"{getattr(props, 'pci_domain_id', 0):04x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"


@functools.cache
def _discover(cfg: discovery.Config) -> dict[str, Any]:
    return discovery.discover_node(cfg)


def _my_node_discovery(cg: Recorder) -> dict[str, Any] | None:
    """This node's discovery on its local rank 0 (with its GPUs' locality); None on other ranks."""
    me = cg.identities[cg.rank]
    if me["local_rank"] != 0:
        return None
    bus_ids = tuple(i["gpu"]["pci_bus_id"] for i in cg.identities
                    if i["node_rank"] == me["node_rank"] and (i.get("gpu") or {}).get("pci_bus_id"))
    node = _discover(discovery.Config.for_level(cg.level, cg.device, pci_bus_ids=bus_ids))
    cuda = torch.cuda.device_count() if cg.device.type == "cuda" else 0
    return {"host": me["host"], "node_rank": me["node_rank"], "cuda_devices": cuda, **node}


def _gathered_nodes(cg: Recorder) -> list[dict[str, Any]]:
    """Every node's discovery, in node order, on every rank."""
    return sorted((d for d in cg.all_ranks(_my_node_discovery(cg)) if d is not None), key=lambda d: d["node_rank"])


def test_nodes_built_alike(cg: Recorder) -> None:
    """Every node has the same CPU, NUMA layout, memory (within 1 %) and GPUs; records every node's discovery."""
    nodes = _gathered_nodes(cg)
    models = {n["node_rank"]: sorted({(i.get("gpu") or {}).get("name", "") for i in cg.identities
                                      if i["node_rank"] == n["node_rank"]} - {""}) for n in nodes}
    cg.record_result(Result(metrics=(), details={"discovery": nodes}))
    add_section = getattr(cg, "add_run_section", None)  # results.json top-level "discovery", once the API exists
    if add_section is not None:
        add_section("discovery", nodes)
    label = {n["node_rank"]: f"node {n['node_rank']} ({n['host']})" for n in nodes}
    fields = {
        "CPU model": lambda n: n["cpu"]["model"],
        "CPU sockets": lambda n: n["cpu"]["sockets"],
        "CPU cores": lambda n: n["cpu"]["cores"],
        "logical CPUs": lambda n: n["cpu"]["logical_cpus"],
        "NUMA nodes": lambda n: len(n["numa_nodes"]),
        "CUDA devices": lambda n: n["cuda_devices"],
        "GPU model": lambda n: models[n["node_rank"]],
    }
    problems = [p for what, get in fields.items()
                if (p := node_checks.disagreement(what, {label[n["node_rank"]]: get(n) for n in nodes}))]
    memory = {label[n["node_rank"]]: n["memory_gib"] for n in nodes if n["memory_gib"]}
    if memory:
        median = statistics.median(memory.values())
        low = [f"{who} has {gib:.1f} GiB" for who, gib in memory.items() if abs(gib - median) > 0.01 * median]
        if low:
            problems.append(f"memory: {'; '.join(low)} where the median node has {median:.1f} GiB "
                            "(a failed DIMM, or a different build)")
    if problems:
        pytest.fail("nodes differ:\n  " + "\n  ".join(problems), pytrace=False)


@pytest.mark.multinode
def test_same_software_on_every_node(cg: Recorder) -> None:
    """Driver, CUDA, NCCL, torch, Python, GPU model, OS and kernel are the same on every node."""
    env = environment()
    node = _discover(discovery.Config(topology=False))
    mine = {k: env.get(k, "n/a") for k in VERSIONS}
    mine |= {"GPU model": (cg.identities[cg.rank].get("gpu") or {}).get("name", "none"),
             "OS": node["os"], "kernel": node["kernel"]}
    everyone = cg.all_ranks(mine)
    by_node: dict[str, list[dict[str, Any]]] = {}
    for ident, seen in zip(cg.identities, everyone, strict=True):
        by_node.setdefault(_node_label(ident), []).append(seen)
    problems = []
    for key in mine:
        values = {}
        for who, seen in by_node.items():
            distinct = sorted({str(s[key]) for s in seen})
            values[who] = distinct[0] if len(distinct) == 1 else distinct  # ranks of one node disagreeing show too
        if p := node_checks.disagreement(key, values):
            problems.append(p)
    cg.record_result(Result(metrics=(), details={"software": {who: seen[0] for who, seen in by_node.items()}}))
    if problems:
        pytest.fail("software differs between nodes:\n  " + "\n  ".join(problems), pytrace=False)


def test_cpu_affinity_local_to_gpu(cg: Recorder) -> None:
    """Every rank may run only on CPUs local to its GPU (where the topology has more than one NUMA node)."""
    cg.skip_unless_everywhere(cg.device.type == "cuda", "no GPU on this rank (cpu profile): CPU binding "
                              "to a GPU's NUMA node does not apply", fact="no_gpu")
    bus = _bus_id(cg)
    where = discovery.gpu_locality(Path("/"), bus) if bus else {"bus_id": None, "numa_node": None, "local_cpus": None}
    affinity = os.sched_getaffinity(0)
    online = set(discovery.parse_cpulist(Path("/sys/devices/system/cpu/online").read_text()))
    problem = node_checks.binding_problem(affinity, where["local_cpus"], online)
    local = set(discovery.parse_cpulist(where["local_cpus"] or ""))
    applies = bool(local) and not local >= online
    gpu = (cg.identities[cg.rank].get("gpu") or {}).get("index")
    everyone = cg.all_ranks({**where, "rank": cg.rank, "gpu": gpu, "affinity": discovery.format_cpulist(affinity),
                             "applies": applies, "problem": problem})
    cg.record_result(Result(metrics=(), details={"binding": everyone}))
    if not any(e["applies"] for e in everyone):
        cg.skip("no GPU's sysfs entry names a NUMA node with a subset of the CPUs (one NUMA node, or "
                "numa_node -1 as in many VMs): binding cannot matter here", fact="unsupported")
    bad = [f"rank {e['rank']} ({_node_label(cg.identities[e['rank']])} gpu {e['gpu']} {e['bus_id']}, "
           f"NUMA node {e['numa_node']}): {e['problem']}" for e in everyone if e["problem"]]
    if bad:
        pytest.fail(f"{len(bad)}/{len(everyone)} ranks may run on CPUs remote from their GPU:\n  "
                    + "\n  ".join(bad) + "\n  bind each rank near its GPU: torchrun --numa-binding=node "
                    "(torch >= 2.8 with numactl; the launchers in launch/ pass it), or srun --cpu-bind",
                    pytrace=False)


def test_infiniband_ports_active(cg: Recorder) -> None:
    """Each node has the profile's number of InfiniBand or RoCE ports ACTIVE at the profile's rate (the fabric's kind
    recorded per node; test_rdma.py checks each RoCE port's GID)."""
    required = cg.setting("ib_ports_per_node", None) or 0
    rate = cg.setting("ib_rate_gbps", None)
    if not required:
        cg.skip(f"profile {cg.profile_name!r} requires no InfiniBand ports (settings.ib_ports_per_node "
                "absent or 0)", fact="not_required", setting="settings.ib_ports_per_node")
    me = cg.identities[cg.rank]
    mine = discovery.read_infiniband(Path("/")) if me["local_rank"] == 0 else None
    gathered = cg.all_ranks((mine, discovery.read_gpudirect(Path("/")) if mine is not None else None))
    problems, per_node = [], {}
    for ident, (ports, gdr) in zip(cg.identities, gathered, strict=True):
        if ports is None:
            continue
        who = _node_label(ident)
        per_node[who] = {"fabric": node_checks.fabric_kind(ports), "ports": ports, "gpudirect_rdma": gdr}
        if p := node_checks.ib_problem(ports, required, rate):
            problems.append(f"{who}: {p}")
    cg.record_result(Result(metrics=(), details={"infiniband": per_node}))
    if problems:
        pytest.fail("InfiniBand or RoCE ports missing or slow:\n  " + "\n  ".join(problems), pytrace=False)


@pytest.mark.metrics("shared_fs_write_gbps", "shared_fs_read_gbps")
def test_shared_directory_is_shared(cg: Recorder, shared_dir: str | None) -> None:
    """A token rank 0 writes is read back on every rank of every node; write and read GB/s per node."""
    cg.record_result(shared_fs.run(shared_fs.Config.for_level(cg.level, cg.device, one_shared_dir(cg, shared_dir))))


def test_hosts_resolve_and_rendezvous_store_reachable(cg: Recorder) -> None:
    """Every rank resolves every node's host name and reaches the rendezvous store, seeing every rank's key."""
    result = rendezvous.run(rendezvous.Config.for_level(cg.level, cg.device))
    cg.record_result(Result(metrics=(), details={k: v for k, v in result.details.items() if k != "problems"}))
    problems = result.details["problems"]
    if problems:
        pytest.fail("name resolution or rendezvous problems:\n  " + "\n  ".join(problems[:32]), pytrace=False)
