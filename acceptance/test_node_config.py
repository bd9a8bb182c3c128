"""Expected configuration: each key of the profile's ``expect:`` section (clustergate.criteria.expect) is one test.

GPU keys (driver, CUDA, NCCL versions, persistence mode, the NVSwitch fabric) are read on every rank
for its GPU; node keys (ACS, IOMMU, NUMA balancing, CPU governor, GPUDirect RDMA) by each node's local
rank 0; NCCL's use of GPUDirect RDMA from NCCL's own log on every rank. A key the profile leaves out
skips; a value that cannot be read (no InfiniBand, no NVSwitch, no permission, a VM) skips saying why,
never passes. Each test's details carry an ``expect`` entry: the report's expected-configuration table.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist

from acceptance.evidence import decide, gpu_label, host_root, is_node_reader, where_of
from acceptance.gpu_helpers import require_device
from clustergate.criteria.expect import RULES, Expected, check
from clustergate.run.recorder import Recorder
from workloads import faults
from workloads.gpu import gpu_config
from workloads.interconnect import comm_groups
from workloads.node import host_config
from workloads.node.host_config import Seen
from workloads.result import Result


def _expected(cg: Recorder, key: str) -> Expected:
    expected = cg.profile.expect.get(key)
    if expected is None:
        cg.skip(f"profile {cg.profile_name!r} sets no expect.{key} ({RULES[key].what}): not checked",
                fact="not_required", setting=f"expect.{key}")
    return expected


def _settle(cg: Recorder, expected: Expected, seen: dict[int, Seen], scope: str) -> None:
    """Judge every owner's value alike on every rank, then fail, skip or pass (acceptance.evidence.decide)."""
    failures: dict[int, list[str]] = {}
    unreadable: dict[str, str] = {}
    rows = []
    for owner, (value, shown) in sorted(seen.items()):
        where = gpu_label(cg, owner) if scope == "gpu" else where_of(cg, owner).label("node")
        problem = None if value is None else check(expected, value)
        status = "unreadable" if value is None else "fail" if problem else "ok"
        rows.append({"where": where, "seen": shown, "status": status})
        if value is None:
            unreadable[where] = shown
        elif problem:
            failures.setdefault(owner, []).append(
                f"{where}: {problem} ({shown}). Next step: {faults.next_step(expected.rule.category)}")
    cg.record_result(Result(metrics=(), details={"expect": {"setting": expected.key, "what": expected.rule.what,
                                                            "expected": expected.text, "rows": rows}}))
    decide(cg, f"expect.{expected.key}", failures, unreadable)


def _gpu_values(cg: Recorder) -> dict[int, dict[str, Any]]:
    require_device(cg, gpu_only=True)
    return dict(enumerate(cg.all_ranks(gpu_config.read_device(cg.device))))


def _node_values(cg: Recorder, read: Any) -> dict[int, Seen]:
    """{reader rank: read(node's GPU bus ids)} for every node."""
    mine = None
    if is_node_reader(cg):
        node = cg.identities[cg.rank]["node_rank"]
        buses = [i["gpu"]["pci_bus_id"] for i in cg.identities
                 if i["node_rank"] == node and (i.get("gpu") or {}).get("pci_bus_id")]
        mine = read(buses)
    return {r: tuple(v) for r, v in enumerate(cg.all_ranks(mine)) if v is not None}  # type: ignore[misc]


@pytest.mark.parametrize("key", ["driver", "cuda", "nccl", "persistence_mode"])
def test_gpu_setting(cg: Recorder, key: str) -> None:
    """Driver, CUDA (as the driver reports it) and NCCL (as torch runs it) in the profile's range;
    persistence mode as the profile expects."""
    expected = _expected(cg, key)
    values = _gpu_values(cg)
    _settle(cg, expected, {r: gpu_config.field_seen(v, key) for r, v in values.items()}, "gpu")


def test_fabric_manager(cg: Recorder) -> None:
    """Where the node has NVSwitches, the fabric manager has set up every GPU's fabric (NVML: completed)."""
    expected = _expected(cg, "fabric_manager")
    values = _gpu_values(cg)
    switches = _node_values(cg, lambda _: (host_config.nvswitches(host_root()),
                                           host_config.processes_named(host_root(), "nv-fabricmanager")))
    by_node = {cg.identities[r]["node_rank"]: v for r, v in switches.items()}
    seen = {rank: gpu_config.fabric_seen(read, *by_node.get(cg.identities[rank]["node_rank"], ([], None)))
            for rank, read in values.items()}
    _settle(cg, expected, seen, "gpu")


@pytest.mark.parametrize("key", list(host_config.NODE_SEEN))
def test_node_setting(cg: Recorder, key: str) -> None:
    """PCIe ACS off between each GPU and its nearest NIC, IOMMU mode, NUMA balancing and CPU governor as the
    profile expects, on every node."""
    expected = _expected(cg, key)
    _settle(cg, expected, _node_values(cg, lambda buses: host_config.NODE_SEEN[key](host_root(), buses)), "node")


def _gpudirect(buses: list[str]) -> Seen:
    cuda = (lambda: gpu_config.cuda_attributes(0)) if torch.cuda.is_available() else (lambda: (None, "no CUDA"))
    return host_config.gpudirect_seen(host_root(), buses, cuda)


def test_gpudirect_rdma_available(cg: Recorder) -> None:
    """GPUDirect RDMA can work: nvidia_peermem loaded, or the CUDA driver's dma-buf on a kernel >= 5.12."""
    expected = _expected(cg, "gpudirect_rdma")
    require_device(cg, gpu_only=True)
    _settle(cg, expected, _node_values(cg, _gpudirect), "node")


def test_nccl_uses_gdr(cg: Recorder) -> None:
    """NCCL's own log shows GPUDirect RDMA ('/GDRDMA') on every channel it runs over InfiniBand."""
    expected = _expected(cg, "nccl_gdr")
    require_device(cg, gpu_only=True)
    cg.skip_unless_everywhere(cg.world_size > 1, "a single rank: NCCL opens no network channel", fact="one_rank")
    comm = comm_groups.scope_comm("world", cg.setting("nccl_algo", ""))
    with comm.window():  # a large all_reduce makes NCCL connect (and log) its ring over the network
        dist.all_reduce(torch.ones(16 << 20, device=cg.device), group=comm.group)
    ib = [c for c in comm.log.channels if c["transport"] == "NET/IB"]
    without = [c["line"] for c in ib if "GDRDMA" not in c["via"]]
    mine: Seen = (None, f"no NCCL channel over NET/IB seen ({comm.log.transports() or comm.capture}): one host, "
                        "no InfiniBand, or NCCL's log not readable") if not ib else \
        (not without, f"{len(ib) - len(without)} of {len(ib)} NET/IB channel connections with GDRDMA"
                      + (f", e.g. without: {without[0]}" if without else ""))
    _settle(cg, expected, dict(enumerate(cg.all_ranks(mine))), "gpu")
