"""Each GPU's own NIC from real ``nvidia-smi topo -m`` outputs (tests/data/topology/, sources in its README), and
NCCL's choice of NIC from its log (tests/data/nccl/), judged against it."""

from __future__ import annotations

from pathlib import Path

import pytest

from workloads.interconnect import nccl_log, nic_choice
from workloads.node import topology
from workloads.node.topology import Shape

DATA = Path(__file__).parents[1] / "data"


def _topo(name: str) -> topology.Topology:
    return topology.parse((DATA / "topology" / name).read_text())


def test_a_lent_h200_without_a_nic_reads_as_one_gpu_and_no_nic() -> None:
    """nvidia-smi underlines its header with terminal escapes even into a file: read past them, a GPU alone in a
    VM is one GPU row and no NIC column (the node test then skips on no_infiniband), not "no GPU rows"."""
    topo = _topo("lent-h200-1gpu-no-nic.txt")
    assert [g.index for g in topo.gpus] == [0] and topo.nics == () and topo.gpus[0].numa == 0


def test_a_rail_optimised_h100_node_gives_every_gpu_its_own_pix_nic() -> None:
    """NVIDIA/nccl #1264: 8 H100, 10 NICs, GPU3 on NIC5 (NIC3 and NIC4 serve no GPU): each GPU its own at PIX."""
    topo = _topo("nccl-1264-h100-8gpu-10nic.txt")
    assert len(topo.gpus) == 8 and len(topo.nics) == 10
    own = topology.assign(topo)
    assert {g: a["nic"] for g, a in own.items()} == {0: "NIC0", 1: "NIC1", 2: "NIC2", 3: "NIC5", 4: "NIC6",
                                                     5: "NIC7", 6: "NIC8", 7: "NIC9"}
    assert {a["distance"] for a in own.values()} == {"PIX"}
    assert [g.numa for g in topo.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert topology.problems(topo, Shape(8), "h100-a") == []


def test_nics_numbered_against_the_gpus_are_still_each_gpus_own() -> None:
    """NVIDIA/nccl #1453: GPU0's NIC is NIC8 and GPU7's NIC1 (NIC0 is SYS to every GPU: not a rail)."""
    topo = _topo("nccl-1453-h100-8gpu-9nic-reversed.txt")
    own = topology.assign(topo)
    assert [own[g]["nic"] for g in range(8)] == [f"NIC{k}" for k in (8, 7, 6, 5, 4, 3, 2, 1)]
    assert topology.problems(topo, Shape(8), "h100-b") == []


def test_the_nic_legend_names_the_devices_and_far_nics_fail_naming_host_gpu_nic_and_distance() -> None:
    """nccl-tests #320: 3 GPUs and 2 NICs (mlx5_0, mlx5_1) behind the host bridge: none is at PXB or nearer."""
    topo = _topo("nccl-tests-320-3gpu-2nic.txt")
    assert topo.names == {"NIC0": "mlx5_0", "NIC1": "mlx5_1"}
    lines = topology.problems(topo, Shape(2), "node-7")
    assert lines[0] == ("node-7 GPU 0: its nearest NIC NIC0 (mlx5_0) is at NODE, farther than PXB "
                        "(PCIe distances nearest first: PIX, PXB, PHB, NODE, SYS)")
    assert [line.split(":")[0] for line in lines] == ["node-7 GPU 0", "node-7 GPU 1", "node-7 GPU 2"]
    assert "NIC0 (mlx5_0) is at PHB" in lines[2]
    assert topology.problems(topo, Shape(2, max_distance="NODE"), "node-7") == []


def _swap(text: str, gpu: int, old: str, new: str) -> str:
    """The real file with one GPU row's cells changed (a fault as a broken node would show it)."""
    lines = text.splitlines()
    row = next(i for i, line in enumerate(lines) if line.startswith(f"GPU{gpu}\t"))
    cells = lines[row].split("\t")
    cells[cells.index(old)] = new
    lines[row] = "\t".join(cells)
    return "\n".join(lines)


def test_two_gpus_on_one_nic_fail_where_the_node_has_a_nic_per_gpu() -> None:
    text = (DATA / "topology" / "nccl-1264-h100-8gpu-10nic.txt").read_text()
    # GPU1 loses its PIX NIC1 (SYS now) and sits under GPU0's switch instead (PIX to NIC0).
    broken = topology.parse(_swap(_swap(text, 1, "PIX", "SYS"), 1, "SYS", "PIX"))
    lines = topology.problems(broken, Shape(8), "h100-a")
    assert lines == ["h100-a GPU 1: its nearest NIC NIC0 at PIX is already GPU 0's; the profile's node has a NIC "
                     "per GPU (8 NICs for 8 GPUs)"]
    assert topology.problems(broken, Shape(4), "h100-a") == []  # fewer NICs than GPUs: sharing is the design


def test_a_nic_on_the_other_numa_node_fails() -> None:
    text = (DATA / "topology" / "nccl-1264-h100-8gpu-10nic.txt").read_text()
    topo = topology.parse(text)
    # sysfs puts GPU 4's NIC (NIC6) on NUMA node 0, the GPU's row says 1.
    assert topology.problems(topo, Shape(8), "h100-a", {"NIC6": 0}) == [
        "h100-a GPU 4: its nearest NIC NIC6 at PIX is on NUMA node 0, the GPU on 1"]
    lost = topology.parse(_swap(text, 5, "PIX", "SYS"))  # GPU 5's only near NIC gone: every NIC across the CPUs
    (line,) = topology.problems(lost, Shape(8, max_distance="SYS"), "h100-a")
    # every NIC at SYS: it takes one no other GPU has (NIC3), on the other NUMA node
    assert line == "h100-a GPU 5: its nearest NIC NIC3 is at SYS: on another NUMA node than the GPU's (1)"
    (line,) = topology.problems(lost, Shape(4), "h100-a")
    assert line.startswith("h100-a GPU 5: its nearest NIC NIC3 is at SYS, farther than PXB") and "NUMA" in line


def test_too_few_nics_and_broken_text() -> None:
    topo = _topo("nccl-tests-320-3gpu-2nic.txt")
    assert topology.problems(topo, Shape(8, max_distance="SYS"), "n")[0] == (
        "n: nvidia-smi topo -m shows 2 NICs, the profile's node has 8 (settings.nics_per_node)")
    with pytest.raises(topology.TopologyError, match="no header line starting with GPU0"):
        topology.parse("No devices were found\n")
    with pytest.raises(ValueError, match="max_distance='FAR'"):
        Shape(8, max_distance="FAR")


def test_a_node_without_nic_has_no_nic_columns() -> None:
    """One GPU alone, as the lent H200 shows it: the matrix has the GPU and its affinity, no NIC."""
    text = "\tGPU0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\nGPU0\t X \t0-43\t0\t\tN/A\n"
    topo = topology.parse(text)
    assert topo.nics == () and topology.assign(topo)[0]["nic"] is None


def test_nccl_log_names_each_ranks_nic_and_a_cross_rail_choice_fails() -> None:
    """h100_2x8_ib_rank0.log: rank 0 sends via NIC 0 (mlx5_0) itself and via NIC 1 through PXN (rank 1)."""
    log = nccl_log.parse((DATA / "nccl" / "h100_2x8_ib_rank0.log").read_text())
    s = log.summary()
    assert s["nic_sends"] == [{"net": "IB", "dev": 0, "proxy": None, "channels": 2},
                              {"net": "IB", "dev": 1, "proxy": 1, "channels": 1}]
    assert s["ib_devices"][0] == "mlx5_0" and s["ib_devices"][1] == "mlx5_3" and len(s["ib_devices"]) == 8
    assert nic_choice.cross_rail(0, "dgx-a07 GPU 0", s["nic_sends"], s["ib_devices"], "mlx5_0") == (0, [])
    count, lines = nic_choice.cross_rail(0, "dgx-a07 GPU 0", s["nic_sends"], s["ib_devices"], "mlx5_3")
    assert count == 2
    assert lines[0].startswith("rank 0 (dgx-a07 GPU 0): NCCL sent 2 channels through NIC 0 (mlx5_0); the GPU's own "
                               "NIC is mlx5_3")
    assert nic_choice.summary(s["nic_sends"], s["ib_devices"]) == {"mlx5_0": 2, "mlx5_3 via PXN (rank 1)": 1}


def test_a_nic_index_nccl_did_not_list_is_named() -> None:
    count, lines = nic_choice.cross_rail(3, "h GPU 3", [{"net": "IB", "dev": 9, "proxy": None, "channels": 4}],
                                         {0: "mlx5_0"}, "mlx5_0")
    assert count == 4 and "NET/IB/9, a NIC index NCCL's 'NET/IB : Using' line does not list" in lines[0]


@pytest.mark.parametrize(("using", "names"), [
    ("[0]mlx5_0:1/IB [1]mlx5_3:1/IB [RO]; OOB ibp12s0:10.149.0.32<0>", {0: "mlx5_0", 1: "mlx5_3"}),
    ("[0]mlx5_0:1:0/RoCE [1]mlx5_1:1::2/RoCE ; OOB eth0:10.0.0.1<0>", {0: "mlx5_0", 1: "mlx5_1"}),  # rail, plane ids
])
def test_ib_device_list_in_nccls_format(using: str, names: dict[int, str]) -> None:
    assert nccl_log.ib_devices(using) == names
