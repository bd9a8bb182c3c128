"""RDMA rails between nodes: the rail matching and steps of a round, perftest's server/client command lines run
against a stand-in ib_write_bw (tests/data/ib/standin_perftest: no machine here has an HCA), and
acceptance/test_rdma_rails.py end to end on two torchrun nodes of one host with that stand-in on PATH."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from workloads.interconnect import node_rounds, perftest, rdma_rails
from workloads.interconnect.rdma_rails import Rail

from torchrun_job import ROOT, run_job

DATA = Path(__file__).parents[1] / "data" / "ib"
STANDIN = DATA / "standin_perftest"
"""A stand-in ib_write_bw that speaks perftest's output format (it measures nothing)."""


def test_rails_are_ports_in_name_order_and_a_step_pairs_rail_i_with_rail_i() -> None:
    assert sorted(["mlx5_10/1", "mlx5_2/1", "mlx5_1/2", "mlx5_1/1"], key=rdma_rails.natural_key) == \
        ["mlx5_1/1", "mlx5_1/2", "mlx5_2/1", "mlx5_10/1"]
    # nodes 0-3 and 1-2 meet; node 3 has one port, so pair 0-3 has one rail and pair 1-2 three
    steps = rdma_rails.steps([(0, 3), (1, 2)], {0: 4, 1: 3, 2: 3, 3: 1})
    assert steps == [[Rail(0, 3, 0), Rail(1, 2, 0)], [Rail(1, 2, 1)], [Rail(1, 2, 2)]]
    assert rdma_rails.role(steps[1], 2) == ("client", Rail(1, 2, 1)) and rdma_rails.role(steps[1], 0) is None
    assert rdma_rails.role(steps[0], 0) == ("server", Rail(0, 3, 0))
    assert rdma_rails.steps([(0, 1)], {0: 2}) == []  # a node without a rail measures nothing


def test_a_rail_below_the_floor_makes_both_nodes_suspects_in_gbits() -> None:
    state = node_rounds.NodeRounds(2, 1, lambda _: 360.0, labels=["a", "b"], unit="Gb/s")
    state.plan()
    state.update([node_rounds.PairResult(0, 0, 1, [391.0, 120.5])])
    state.finish()
    assert state.excluded() == [0, 1]
    assert state.evidence[0][0] == "round 1: 120.5 Gb/s (rail 1) with b, floor 360 Gb/s: below the floor: suspect"


def test_server_and_client_command_lines_run_against_the_stand_in(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", f"{STANDIN}{os.pathsep}{os.environ['PATH']}")
    tool = perftest.Tool.find(perftest.BW_TOOL)
    assert tool is not None and tool.path == str(STANDIN / "ib_write_bw") and not tool.cuda
    args = perftest.bw_args("mlx5_1", 1, gid_index=3, cuda=None, dmabuf=False, tool=tool)
    server = perftest.start_server(tool, args, timeout_s=10)
    assert server.gave_up is None and server.command == [tool.path, *args, "-p", str(server.port)]
    run = perftest.run_client(tool, args, server.port, "127.0.0.1", timeout_s=20)
    assert run.command == [tool.path, *args, "-p", str(server.port), "127.0.0.1"]
    assert run.figure(perftest.BW_COLUMN) == 391.87
    assert "Device         : mlx5_1" in perftest.stop_server(server)  # the server ended on its own
    # a client that finds no server is cut off by its own timeout, never left running
    stuck = perftest.run_client(tool, args, perftest.free_port(), "127.0.0.1", timeout_s=1)
    assert stuck.returncode is None and "client still running after 1 s" in stuck.output


@pytest.mark.slow  # one torchrun job: two nodes of one rank on this host
def test_acceptance_measures_every_rail_and_names_both_ends_of_a_failed_one(tmp_path: Path) -> None:
    """Two nodes with the planted mixed tree (mlx5_0 InfiniBand, mlx5_1 and mlx5_2 RoCE): three rails, each
    server on node 0 and client on node 1 through the stand-in; the rail whose client cannot connect fails on
    both nodes naming both hosts, both HCAs and ports and the memory each used; the others are recorded."""
    env = {"CLUSTERGATE_HOST_ROOT": str(DATA / "roce" / "mixed"), "STANDIN_PERFTEST_FAIL": "mlx5_1",
           "PATH": f"{STANDIN}{os.pathsep}{os.environ['PATH']}"}
    r = run_job(tmp_path, [str(ROOT / "acceptance"), "--level", "quick", "-k", "test_rdma_write_per_rail"],
                nodes=2, nproc=1, timeout=240, env=env)
    [test] = [t for t in r.results["tests"] if t["nodeid"].endswith("test_rdma_write_per_rail")]
    assert test["outcome"] == "failed", r.output[-3000:]
    host = r.results["nodes"][0]["host"]
    assert (f"rail 1, round 1: {host} mlx5_1/1 (from host memory) <- {host} mlx5_1/1 (from host memory): "
            "ib_write_bw gave no 'BW average[Gb/sec]' (exit 1): Unable to Connect the HCA's through the link"
            in test["message"]), test["message"]
    assert "mlx5_0/1 (from" not in test["message"] and "mlx5_2/1 (from" not in test["message"], test["message"]
    rails = test["details"]["rails"]
    assert [(row["rail"], row.get("gbps")) for row in rails if row["round"] == 1] == \
        [(0, 391.87), (1, None), (2, 391.87)]
    # the rounds (what sign-off reads) see the failed rail as 0 Gb/s; the cpu profile sets no floor to exclude on
    rounds = test["details"]["node_rounds"]
    assert rounds["pairs"][0]["rails_gbps"] == [391.87, 0.0, 391.87] and rounds["floor"] == {"unit": "Gb/s",
                                                                                              "severity": "fail"}
