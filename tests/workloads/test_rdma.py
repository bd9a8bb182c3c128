"""RDMA below NCCL: perftest's output read by its own formats, real perftest finding no HCA, NCCL's RoCE GID choice
on planted sysfs trees, the GPU nearest each HCA; and acceptance/test_rdma.py end to end (no HCA anywhere here)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from workloads.interconnect import perftest
from workloads.node import checks, discovery, hca_locality, roce

from torchrun_job import ROOT, run_job

DATA = Path(__file__).parents[1] / "data" / "ib"
PERFTEST = DATA / "perftest"
ROCE = DATA / "roce"
needs_perftest = pytest.mark.skipif(shutil.which(perftest.BW_TOOL) is None,
                                    reason="perftest is not installed (apt install perftest; .ci/run installs it)")


def test_bandwidth_and_latency_tables_read_by_their_column_names() -> None:
    [bw] = perftest.parse_results((PERFTEST / "ib_write_bw-gbits.txt").read_text())
    assert bw == {"#bytes": 8388608, "#iterations": 5000, "BW peak[Gb/sec]": 392.41, "BW average[Gb/sec]": 391.87,
                  "MsgRate[Mpps]": 0.005839}
    [lat] = perftest.parse_results((PERFTEST / "ib_write_lat.txt").read_text())
    assert lat[perftest.LAT_COLUMN] == 1.68 and lat["t_avg[usec]"] == 1.70
    assert lat["99% percentile[usec]"] == 1.89 and lat["99.9% percentile[usec]"] == 5.31


def test_no_table_gives_no_figure_and_perftests_own_words() -> None:
    text = (PERFTEST / "ib_write_bw-no-device.txt").read_text()
    assert perftest.parse_results(text) == []
    run = perftest.Loopback(["/usr/bin/ib_write_bw", "-d", "mlx5_0"], 1, text)
    with pytest.raises(perftest.PerftestError, match=r"ib_write_bw gave no 'BW average\[Gb/sec\]' \(exit 1\): Did not "
                                                     r"detect devices; If device exists, check if driver is up"):
        run.figure(perftest.BW_COLUMN)
    assert not perftest.gpu_memory_refused(run)  # no device is not a GPU memory failure
    refused = perftest.Loopback(["ib_write_bw"], 1, "Couldn't allocate MR with error=14\nFailed to create MR\n")
    assert perftest.gpu_memory_refused(refused)


def test_command_lines_follow_the_nhc_check() -> None:
    tool = perftest.Tool(path="ib_write_bw", version="6.06", cuda=True, cuda_bus_id=True, cuda_dmabuf=True)
    args = perftest.bw_args("mlx5_3", 1, gid_index=3, cuda="0000:9a:00.0", dmabuf=True, tool=tool)
    assert args == ["-d", "mlx5_3", "-i", "1", "-s", "8388608", "-F", "--report_gbits", "--perform_warm_up",
                    "-x", "3", "--use_cuda_bus_id=0000:9a:00.0", "--use_cuda_dmabuf"]
    old = perftest.Tool(path="ib_write_bw", version="5.0", cuda=True, cuda_bus_id=False, cuda_dmabuf=False)
    assert perftest.bw_args("mlx5_0", 1, gid_index=None, cuda="2", dmabuf=False, tool=old)[-1] == "--use_cuda=2"
    assert "-x" not in perftest.lat_args("mlx5_0", 1, gid_index=None)  # InfiniBand: perftest uses no GID


def test_a_gpudirect_path_perftest_cannot_take_is_named(tmp_path: Path) -> None:
    cuda = perftest.Tool(path="/opt/perftest/ib_write_bw", version="6.22", cuda=True, cuda_bus_id=True,
                         cuda_dmabuf=False)
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc" / "modules").write_text("nvidia 1 0 - Live 0x0\n")
    unloaded = discovery.read_gpudirect(tmp_path)
    assert perftest.gpudirect_problem(cuda, unloaded) == (
        "no peer-memory module loaded (nvidia_peermem or nv_peer_mem in /proc/modules) and "
        "/opt/perftest/ib_write_bw offers no --use_cuda_dmabuf")
    assert perftest.gpudirect_problem(cuda, {"loaded": True, "modules": ["nvidia_peermem"]}) is None
    dmabuf = perftest.Tool(path="ib_write_bw", version="6.22", cuda=True, cuda_bus_id=True, cuda_dmabuf=True)
    assert perftest.gpudirect_problem(dmabuf, unloaded) is None  # the dma-buf path needs no module


@needs_perftest
def test_debians_perftest_has_no_cuda_and_so_no_gpudirect() -> None:
    """Debian's build has no CUDA: its --help lists no --use_cuda, so a GPU node with it has no GPUDirect test."""
    tool = perftest.Tool.find(perftest.BW_TOOL)
    assert tool is not None
    if tool.cuda:
        pytest.skip(f"{tool.path} is built with CUDA (not Debian's)")
    assert perftest.gpudirect_problem(tool, {"loaded": True}).endswith(  # type: ignore[union-attr]
        "was built without CUDA: its --help lists no --use_cuda (build perftest with ./configure "
        "CUDA_H_PATH=/usr/local/cuda/include/cuda.h)")


@needs_perftest
def test_real_ib_write_bw_finds_no_hca_here() -> None:
    """This machine has no HCA: Debian's perftest itself says so, and gives no figure."""
    tool = perftest.Tool.find(perftest.BW_TOOL)
    assert tool is not None and tool.version
    run = perftest.loopback(tool, perftest.bw_args("mlx5_0", 1, gid_index=None, cuda=None, dmabuf=False, tool=tool),
                            timeout_s=20)
    assert run.rows == [] and run.returncode not in (0, None), run.output
    assert "Did not detect devices" in run.output or "IB device mlx5_0 not found" in run.output, run.output


def test_nccl_takes_the_rocev2_ipv4_gid_of_a_configured_port() -> None:
    choice = roce.Choice.from_env({})
    port = roce.port_gid(ROCE / "good", "mlx5_0", 1, choice)
    assert port | {"chosen_by": ""} == {"device": "mlx5_0", "port": 1, "gid_index": 3, "gid": "::ffff:10.0.0.1",
                                        "type": "RoCE v2", "chosen_by": "", "problem": None}
    assert port["chosen_by"] == "NCCL's own choice (RoCE v2, AF_INET)"


def test_an_all_zero_gid_table_fails_naming_the_index() -> None:
    port = roce.port_gid(ROCE / "zero", "mlx5_0", 1, roce.Choice.from_env({}))
    assert port["gid_index"] == 0 and port["gid"] == "::"
    assert port["problem"] == "the GID at index 0 is all zero (no address on the port's network interface?)"


@pytest.mark.parametrize(("env", "index", "problem"), [
    ({"NCCL_IB_GID_INDEX": "1"}, 1, None),  # forced: the link-local RoCE v2 entry is present and non-zero
    ({"NCCL_IB_GID_INDEX": "4"}, 4, "all zero"),
    ({"NCCL_IB_GID_INDEX": "9"}, 9, "no GID at index 9 (5 entries"),
    ({"NCCL_IB_GID_INDEX": "-1"}, 3, None),  # NCCL's default: choose
    ({"NCCL_IB_ROCE_VERSION_NUM": "1"}, 2, None),
    ({"NCCL_IB_ADDR_FAMILY": "AF_INET6"}, 0, "'IB/RoCE v1', not RoCE v2"),  # no global IPv6 GID: NCCL keeps 0
    ({"NCCL_IB_ADDR_RANGE": "10.0.0.0/8"}, 3, None),
    ({"NCCL_IB_ADDR_RANGE": "192.168.0.0/16"}, 0, "'IB/RoCE v1', not RoCE v2"),  # nothing in range
])
def test_nccls_variables_change_its_choice_as_in_its_source(env: dict[str, str], index: int,
                                                            problem: str | None) -> None:
    port = roce.port_gid(ROCE / "good", "mlx5_0", 1, roce.Choice.from_env(env))
    assert port["gid_index"] == index
    assert (port["problem"] is None) if problem is None else (problem in (port["problem"] or "")), port


def test_a_mixed_node_counts_both_fabrics_and_one_bad_roce_port_is_named() -> None:
    ports = discovery.read_infiniband(ROCE / "mixed")
    assert checks.fabric_kind(ports) == "InfiniBand+RoCE"
    assert checks.ib_problem(ports, 3, 400) is None
    choice = roce.Choice.from_env({})
    gids = {p["device"]: roce.port_gid(ROCE / "mixed", p["device"], p["port"], choice)
            for p in ports if p["link_layer"] == roce.ROCE_LINK_LAYER}
    assert set(gids) == {"mlx5_1", "mlx5_2"}  # the InfiniBand port has no RoCE GID to judge
    assert gids["mlx5_1"]["problem"] is None and "all zero" in gids["mlx5_2"]["problem"]
    assert checks.fabric_kind(discovery.read_infiniband(ROCE / "good")) == "RoCE"


def _pci(root: Path, chain: list[str], numa: int) -> None:
    bus = root / "sys/bus/pci/devices"
    bus.mkdir(parents=True, exist_ok=True)
    for i, bdf in enumerate(chain):
        real = root / "sys/devices" / Path(*chain[: i + 1])
        real.mkdir(parents=True, exist_ok=True)
        (real / "numa_node").write_text(f"{numa}\n")
        if not (bus / bdf).is_symlink():
            os.symlink(os.path.relpath(real, bus), bus / bdf)


def _hca(root: Path, name: str, chain: list[str]) -> None:
    hca = root / "sys/class/infiniband" / name
    hca.mkdir(parents=True)
    os.symlink(os.path.relpath(root / "sys/devices" / Path(*chain), hca), hca / "device")


def test_the_nearest_gpu_shares_the_deepest_bridge_then_the_numa_node(tmp_path: Path) -> None:
    """Two switches on two sockets: each HCA's nearest GPU is the one under its switch; an HCA alone on its root
    port takes the GPU of its NUMA node."""
    sw0 = ["pci0000:00", "0000:00:01.0", "0000:01:00.0"]
    sw1 = ["pci0000:80", "0000:80:01.0", "0000:81:00.0"]
    _pci(tmp_path, [*sw0, "0000:02:00.0", "0000:03:00.0"], 0)   # GPU 0
    _pci(tmp_path, [*sw0, "0000:02:01.0", "0000:04:00.0"], 0)   # mlx5_0
    _pci(tmp_path, [*sw1, "0000:82:00.0", "0000:83:00.0"], 1)   # GPU 1
    _pci(tmp_path, [*sw1, "0000:82:01.0", "0000:84:00.0"], 1)   # mlx5_1
    _pci(tmp_path, ["pci0000:80", "0000:80:03.0", "0000:90:00.0"], 1)  # mlx5_2, own root port on socket 1
    _hca(tmp_path, "mlx5_0", [*sw0, "0000:02:01.0", "0000:04:00.0"])
    _hca(tmp_path, "mlx5_1", [*sw1, "0000:82:01.0", "0000:84:00.0"])
    _hca(tmp_path, "mlx5_2", ["pci0000:80", "0000:80:03.0", "0000:90:00.0"])
    gpus = {"gpu 0": "00000000:03:00.0", "gpu 1": "00000000:83:00.0"}  # NVML's form
    near = {h: hca_locality.nearest_gpu(tmp_path, h, gpus) for h in ("mlx5_0", "mlx5_1", "mlx5_2")}
    assert near["mlx5_0"] | {} == {"hca": "mlx5_0", "hca_bus_id": "0000:04:00.0", "hca_numa_node": 0, "gpu": "gpu 0",
                                   "gpu_bus_id": "0000:03:00.0", "gpu_numa_node": 0, "common_bridge": "0000:01:00.0"}
    assert near["mlx5_1"]["gpu"] == "gpu 1" and near["mlx5_1"]["common_bridge"] == "0000:81:00.0"
    assert near["mlx5_2"]["gpu"] == "gpu 1" and near["mlx5_2"]["common_bridge"] is None  # only the NUMA node
    assert hca_locality.nearest_gpu(tmp_path, "mlx5_0", {})["gpu"] is None
    assert hca_locality.nearest_gpu(tmp_path, "mlx5_9", gpus)["hca_bus_id"] is None


def _rdma_job(tmp_path: Path, env: dict[str, str] | None = None) -> dict[str, dict]:
    tmp_path.mkdir()
    r = run_job(tmp_path, [str(ROOT / "acceptance"), "--level", "quick", "-k",
                           "test_rdma_write_per_hca or test_roce_gid"], nproc=1, timeout=180, env=env)
    tests = {t["nodeid"].split("::")[1]: t for t in r.results["tests"]}
    assert set(tests) == {"test_rdma_write_per_hca", "test_roce_gid_at_nccl_index"}, r.output[-3000:]
    return tests


@pytest.mark.slow  # two torchrun jobs of one rank
@needs_perftest
def test_acceptance_skips_without_an_hca_and_names_a_planted_bad_port(tmp_path: Path) -> None:
    """Here: no HCA, so both tests skip on their facts, the RDMA one with perftest's own words. On a planted mixed
    tree perftest (real, still no device) gives no figure for any port, and the all-zero GID fails naming the host,
    HCA, port and index."""
    tests = _rdma_job(tmp_path / "none", {"CLUSTERGATE_HOST_ROOT": str(tmp_path / "empty")})
    rdma, gid = tests["test_rdma_write_per_hca"], tests["test_roce_gid_at_nccl_index"]
    assert rdma["outcome"] == gid["outcome"] == "skipped"
    assert rdma["skip_fact"] == {"fact": "no_infiniband"} and gid["skip_fact"] == {"fact": "no_roce"}
    assert "lists no port, and ib_write_bw (perftest " in rdma["message"], rdma["message"]
    assert "Did not detect devices" in rdma["message"], rdma["message"]
    tests = _rdma_job(tmp_path / "mixed", {"CLUSTERGATE_HOST_ROOT": str(ROCE / "mixed")})
    rdma, gid = tests["test_rdma_write_per_hca"], tests["test_roce_gid_at_nccl_index"]
    assert rdma["outcome"] == gid["outcome"] == "failed"
    assert "mlx5_2 port 1, GID index 0 (NCCL's own choice (RoCE v2, AF_INET)): the GID at index 0 is all zero" \
        in gid["message"] and "mlx5_1" not in gid["message"], gid["message"]
    for port in ("mlx5_0/1", "mlx5_1/1", "mlx5_2/1"):
        assert f"{port}: ib_write_bw gave no 'BW average[Gb/sec]'" in rdma["message"], rdma["message"]
