"""algbw/busbw exactly as nccl-tests computes them, the sizes swept, and the size judged."""

from __future__ import annotations

import math

import pytest
import torch

from workloads.interconnect import collectives
from workloads.interconnect._data import shape, size_bytes

GiB, MiB, KiB = 1 << 30, 1 << 20, 1 << 10


def nccl_tests_bw(collective: str, count: int, typesize: int, sec: float, nranks: int) -> tuple[float, float]:
    """The getBw functions of NVIDIA/nccl-tests src/*.cu, transcribed. ``count`` is nccl-tests' paramcount:
    the whole buffer for all_reduce, broadcast and sendrecv; one rank's part for all_gather (sendcount),
    reduce_scatter (recvcount) and alltoall (the count sent to each peer)."""
    if collective == "all_reduce":
        base, factor = count * typesize / 1e9 / sec, 2 * (nranks - 1) / nranks
    elif collective in ("all_gather", "reduce_scatter", "all_to_all"):
        base, factor = count * typesize * nranks / 1e9 / sec, (nranks - 1) / nranks
    else:  # broadcast, sendrecv
        base, factor = count * typesize / 1e9 / sec, 1.0
    return base, base * factor


@pytest.mark.parametrize("collective", collectives.COLLECTIVES)
@pytest.mark.parametrize("n", [2, 3, 8, 16, 24])
def test_busbw_matches_nccl_tests(collective: str, n: int) -> None:
    elt, sec = 4, 0.0123
    unit, _ = shape(collective, GiB, n, elt)
    s = size_bytes(collective, unit, n, elt)
    assert collectives.bandwidth(collective, s, sec, n) == pytest.approx(nccl_tests_bw(collective, unit, elt, sec, n))


def test_older_nccl_tests_all_gather_definition_gives_the_same_busbw() -> None:
    """Some nccl-tests versions define all_gather algbw = per-rank bytes * (n-1) / t with factor 1: busbw agrees."""
    n, per_rank, sec = 8, 128 * MiB, 0.01
    assert collectives.bandwidth("all_gather", per_rank * n, sec, n)[1] == pytest.approx(per_rank * (n - 1) / sec / 1e9)


@pytest.mark.parametrize(("collective", "factor"), [
    ("all_reduce", 2 * 7 / 8), ("all_gather", 7 / 8), ("reduce_scatter", 7 / 8), ("all_to_all", 7 / 8),
    ("broadcast", 1.0), ("sendrecv", 1.0)])
def test_factors_for_eight_ranks(collective: str, factor: float) -> None:
    assert collectives.bus_factor(collective, 8) == factor


def test_reference_figure_reads_back() -> None:
    """2 H200s, ring all_reduce of 4 GiB at about 345 GB/s busbw means about 12.4 ms per call."""
    t = 4 * GiB * 2 * (2 - 1) / 2 / 345e9
    assert collectives.bandwidth("all_reduce", 4 * GiB, t, 2)[1] == pytest.approx(345)
    assert math.isclose(t * 1e3, 12.45, rel_tol=0.01)


def test_sizes_are_rounded_down_to_whole_tiles_per_rank() -> None:
    assert shape("all_reduce", GiB, 8, 4) == (GiB // 4, 4096)
    unit, tile = shape("all_gather", GiB, 24, 4)  # 24 ranks: 1 GiB is not a multiple of 24 chunks
    assert unit % tile == 0 and unit * 24 * 4 <= GiB and GiB - unit * 24 * 4 < 24 * 4 * tile
    assert shape("all_reduce", 8, 2, 4) == (2, 2)  # the 8 B latency message: two fp32 elements
    with pytest.raises(Exception, match="less than one element"):
        shape("all_to_all", 8, 16, 4)


def test_judged_step_is_the_largest_not_above_the_setting() -> None:
    sizes = [MiB, 4 * MiB, 16 * MiB, 64 * MiB]
    assert collectives.judged_index(sizes, GiB) == 3  # the setting is above the sweep: the largest
    assert collectives.judged_index(sizes, 16 * MiB) == 2
    assert collectives.judged_index(sizes, 10 * MiB) == 1
    assert collectives.judged_index(sizes, KiB) == 0


def test_levels_sweep_to_the_profile_maximum_and_include_the_judged_size() -> None:
    gpu = torch.device("cuda", 0)
    std = collectives.Config.for_level("standard", gpu, collective="all_reduce", scope="world", judge_bytes=GiB,
                                       max_bytes=4 * GiB)
    assert std.sizes == (MiB, 4 * MiB, 16 * MiB, 64 * MiB, 256 * MiB, GiB, 4 * GiB)
    quick = collectives.Config.for_level("quick", gpu, collective="all_reduce", scope="world", judge_bytes=GiB,
                                         max_bytes=4 * GiB)
    assert quick.sizes == (MiB, 16 * MiB, 256 * MiB, GiB) and quick.repeats < std.repeats
    ext = collectives.Config.for_level("extended", gpu, collective="all_reduce", scope="world", judge_bytes=GiB,
                                       max_bytes=4 * GiB)
    assert len(ext.sizes) == 13 and ext.sizes[-1] == 4 * GiB
    cpu = collectives.Config.for_level("standard", torch.device("cpu"), collective="all_gather", scope="node",
                                       judge_bytes=4 * MiB, max_bytes=4 * MiB)
    assert cpu.sizes == (4 * KiB, 16 * KiB, 64 * KiB, 256 * KiB, MiB, 4 * MiB)
    lat = collectives.Config.for_latency("standard", gpu, scope="node")
    assert lat.sizes[0] == 8 and lat.sizes[-1] == 64 * KiB and lat.latency and lat.nccl_algo == ""
    assert (lat.rounds, lat.repeats // lat.rounds) == (10, 20)  # rounds of nccl-tests' 20 back-to-back calls
    assert collectives.Config(repeats=2).rounds == 5  # rounds mean nothing outside latency mode


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"collective": "all_reduce_v"}, "collective="), ({"scope": "rack"}, "scope="), ({"dtype": "fp8"}, "dtype="),
    ({"collective": "broadcast", "latency": True}, "latency"), ({"repeats": 0}, "repeats"),
    ({"latency": True, "repeats": 4, "rounds": 5}, "rounds")])
def test_bad_configs_name_the_field(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        collectives.Config(**kwargs)


def test_metric_names_say_the_scope() -> None:
    assert collectives.metric_name("all_reduce", "world") == "allreduce_busbw_gbps"
    assert collectives.metric_name("sendrecv", "node") == "intranode_sendrecv_bw_gbps"
    assert collectives.metric_name("all_to_all", "net") == "net_alltoall_busbw_gbps"
    assert collectives.latency_metric("node") == "intranode_allreduce_latency_us"
