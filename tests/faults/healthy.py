import pytest
import torch
import torch.distributed as dist


@pytest.mark.metrics("allreduce_busbw_gbps")
def test_records_a_metric(cg) -> None:
    t = torch.ones(1024)
    dist.all_reduce(t)
    assert t[0].item() == cg.world_size
    cg.record("allreduce_busbw_gbps", 1.0, "GB/s", scope="world")


@pytest.mark.multinode
def test_needs_two_nodes(cg) -> None:
    hosts = {i["node_rank"] for i in cg.identities}
    assert len(hosts) >= 2
