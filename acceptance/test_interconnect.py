"""Interconnect: NCCL collectives measured exactly as nccl-tests measures them, the slow link found.

Scopes, named in every metric: ``intranode_*`` inside each node (all nodes at once, judged per
node), unprefixed across the whole job (judged once), ``net_*`` one rank per node on every rail at
once (the network alone; judged per GPU, so a slow rail names its GPUs). GPU pairs find the GPU,
link or NIC to blame; the transport test says what NCCL chose and fails a fall-back to sockets
where the profile requires InfiniBand. On the CPU the same tests run on gloo with small sizes.
"""

from __future__ import annotations

import pytest

from acceptance.gpu_helpers import require_device
from clustergate.run.recorder import Recorder
from workloads.interconnect import collectives, comm_groups
from workloads.interconnect import pairs as p2p_pairs
from workloads.interconnect import transport as nccl_transport

MiB = 1 << 20


def _scope_ready(cg: Recorder, scope: str) -> None:
    """Skip, alike on every rank, a scope this job cannot measure."""
    lay = comm_groups.layout()
    sizes = [len(n) for n in lay.nodes()]
    cg.skip_unless_everywhere(cg.world_size > 1, "the job has a single rank: no collective traffic to measure "
                                                 "(start torchrun with --nproc-per-node=gpu)", fact="one_rank")
    if scope == "node":
        cg.skip_unless_everywhere(min(sizes) > 1, f"a node runs a single rank (ranks per node {sizes}): "
                                                  "no traffic inside it to measure", fact="one_rank_per_node")
    if scope == "net":
        # Two torchrun agents on one host are two nodes to torchrun but one host to NCCL, which then
        # uses NVLink between them: not the network, and no figure to judge against a NIC.
        one_host = lay.hosts(range(len(lay.node_of))) < 2
        cg.skip_unless_everywhere(not (one_host and cg.device.type == "cuda"),
                                  "every node is on one host: traffic between them is not the network",
                                  fact=None)  # a rehearsal: it measured no network, so it is no fabric run


def _sweep_config(cg: Recorder, collective: str, scope: str) -> collectives.Config:
    return collectives.Config.for_level(
        cg.level, cg.device, collective=collective, scope=scope, judge_bytes=cg.setting("collective_judge_bytes"),
        max_bytes=cg.setting("collective_max_bytes"), dtype=cg.setting("collective_dtype", "fp32"),
        nccl_algo=cg.setting("nccl_algo", ""))


def test_nccl_transport(cg: Recorder) -> None:
    """NCCL's version, algorithm and transport per scope, read from its own log; a network channel that
    is not the profile's ``required_transport`` (e.g. NET/Socket where NET/IB is required) fails."""
    require_device(cg)
    cg.skip_unless_everywhere(cg.device.type == "cuda", "gloo (CPU run): no NCCL to inspect", fact="no_gpu")
    judge = min(cg.setting("collective_judge_bytes"), cg.setting("collective_max_bytes"))
    result = nccl_transport.run(nccl_transport.Config(
        required=cg.setting("required_transport"), probe_bytes=min(judge, 256 * MiB),
        nccl_algo=cg.setting("nccl_algo", "")))
    cg.record_result(result)
    problems = result.details["problems"]
    assert not problems, f"{len(problems)} transport problems:\n" + "\n".join(problems)


LATENCY = [pytest.param(scope, id=scope, marks=pytest.mark.metrics(collectives.latency_metric(scope)))
           for scope in ("node", "world")]


@pytest.mark.parametrize("scope", LATENCY)
def test_allreduce_latency(cg: Recorder, scope: str) -> None:
    """Small-message all_reduce (8 B..64 KiB); the figure is the 8 B time, NCCL's own algorithm choice."""
    require_device(cg)
    _scope_ready(cg, scope)
    cg.record_result(collectives.run(collectives.Config.for_latency(
        cg.level, cg.device, scope=scope, dtype=cg.setting("collective_dtype", "fp32"))))


BANDWIDTH = [pytest.param(coll, scope, id=f"{scope}-{coll}",
                          marks=[pytest.mark.metrics(collectives.metric_name(coll, scope))]
                          + ([pytest.mark.multinode] if scope == "net" else []))
             for scope in ("node", "world", "net") for coll in collectives.COLLECTIVES]


@pytest.mark.parametrize(("collective", "scope"), BANDWIDTH)
def test_collective_bandwidth(cg: Recorder, collective: str, scope: str) -> None:
    """nccl-tests busbw of one collective in one scope, swept over sizes, judged at collective_judge_bytes;
    every size's result checked exactly before its time counts."""
    require_device(cg)
    reason = collectives.unsupported_reason(collective)
    cg.skip_unless_everywhere(reason is None, reason or "", fact="no_gpu")  # only gloo lacks a collective
    _scope_ready(cg, scope)
    cg.record_result(collectives.run(_sweep_config(cg, collective, scope)))


PAIRS = [pytest.param("intranode", id="intranode", marks=pytest.mark.metrics("intranode_pair_bw_gbps")),
         pytest.param("internode", id="internode",
                      marks=[pytest.mark.metrics("internode_pair_bw_gbps"), pytest.mark.multinode])]


@pytest.mark.parametrize("kind", PAIRS)
def test_gpu_pairs(cg: Recorder, kind: str) -> None:
    """Send/recv bandwidth of GPU pairs, many pairs at once: the whole matrix inside each node; across nodes
    a fixed number of rounds of node pairs, where a pair below the criterion makes both nodes suspects and
    a suspect slow again with a known-good partner is excluded (details["node_rounds"] names it, with the
    evidence). Each GPU's figure is the median over its partners (a bad GPU or NIC stands out)."""
    require_device(cg)
    _scope_ready(cg, "node" if kind == "intranode" else "net")
    # The rounds decide on the fly which nodes to re-test, so they judge each pair by the profile's own criterion.
    criterion = cg.profile.criterion(f"{kind}_pair_bw_gbps")
    cg.record_result(p2p_pairs.run(p2p_pairs.Config.for_level(
        cg.level, cg.device, kind=kind, max_bytes=cg.setting("collective_max_bytes"),
        floor=criterion.floor, floor_criterion=criterion.as_json())))
