"""RDMA between nodes, rail by rail: perftest's ib_write_bw from HCA i of one node to HCA i of the other, in the
fabric phase's rounds of node pairs (the schedule the NCCL GPU pairs use, ``workloads.interconnect.node_rounds``),
each side from the memory of its HCA's nearest GPU (GPUDirect RDMA, as the node-phase test in test_rdma.py).

In each round's step the lower node of a pair runs the perftest server on its HCA's port and the other node's
local rank 0 the client against it, at the server node's host name and the TCP port (``-p``) it announced; every
subprocess has a timeout, and every rank walks every step, agreeing on anything unexpected (``agree``), so no
rank waits on one that gave up. A rail below the criterion, or one that gave no figure, fails naming both hosts,
both HCAs and ports and the GPU each read; the rounds name the node to blame where a known-good partner shows it.
"""

from __future__ import annotations

import os
import subprocess
from typing import Any

import pytest

from acceptance.evidence import Part, decide, host_root, judge_parts
from acceptance.test_rdma import active_ports, gpu_memory, gpudirect_unavailable, node_gpus
from clustergate.run.recorder import Recorder
from workloads import faults
from workloads.common import agree
from workloads.interconnect import node_rounds, perftest, rdma_rails
from workloads.interconnect import pairs as p2p_pairs
from workloads.node import discovery, roce
from workloads.node.checks import FABRIC_KINDS
from workloads.result import Result

RAIL = "rail_write_bw_gbps"
SERVER_START_S, CLIENT_S, SERVER_END_S = 15.0, 60.0, 10.0
"""Timeouts: the server's listening, the client's whole run, the server's end after its client."""
UNEXPECTED = (OSError, ValueError, subprocess.SubprocessError)
"""What starting, running or ending perftest may raise on one rank: agreed on, so the others do not wait."""


def _node_ports(cg: Recorder) -> dict[str, Any] | None:
    """This node's rails as its local rank 0 sees them (None on other ranks): each ACTIVE port in rail order,
    with the GPU whose memory it writes from and perftest's options for it."""
    me = cg.identities[cg.rank]
    if me["local_rank"] != 0:
        return None
    root, host = host_root(), me["host"]
    out: dict[str, Any] = {"rank": cg.rank, "host": host, "tool": None, "ports": [], "problem": None, "why": None}
    tool = perftest.Tool.find(perftest.BW_TOOL)
    if tool is None:
        return {**out, "why": f"perftest's {perftest.BW_TOOL} is not on PATH on {host} (install perftest, built with "
                "CUDA for GPUDirect RDMA)"}
    out["tool"] = {"path": tool.path, "version": tool.version, "cuda": tool.cuda}
    ports, active = active_ports(root)
    if not ports:
        probe = perftest.loopback(tool, [], timeout_s=10.0)  # perftest itself looks for a device
        return {**out, "why": f"no HCA on {host}: {root / 'sys/class/infiniband'} lists no port, and "
                f"{perftest.BW_TOOL} (perftest {tool.version}) says: {perftest.said(probe.output)}"}
    if not active:
        out["problem"] = f"{host}: no InfiniBand or RoCE port is ACTIVE, so it has no rail (" + "; ".join(
            f"{p['device']}/{p['port']} {p['state']}" for p in ports) + ")"
    gpus, gdr, choice = node_gpus(cg), discovery.read_gpudirect(root), roce.Choice.from_env(os.environ)
    for p in sorted(active, key=lambda p: rdma_rails.natural_key(f"{p['device']}/{p['port']}")):
        dev, num = p["device"], p["port"]
        gid = roce.port_gid(root, dev, num, choice)["gid_index"] if p["link_layer"] == "Ethernet" else None
        near, cuda, problem = gpu_memory(tool, root, dev, gpus, gdr)
        out["ports"].append({
            "port": f"{dev}/{num}", "fabric": FABRIC_KINDS[p["link_layer"]], "gid_index": gid, "gpu": near["gpu"],
            "memory": "host" if cuda is None else f"{near['gpu']} ({near['gpu_bus_id']})",
            "gpudirect_problem": gpudirect_unavailable(dev, near, host, problem) if problem else None,
            "args": perftest.bw_args(dev, num, gid_index=gid, cuda=cuda, dmabuf=not gdr["loaded"], tool=tool)})
    return out


def _side(node: dict[str, Any], index: int) -> str:
    port = node["ports"][index]
    return f"{node['host']} {port['port']} (from {port['memory']} memory)"


def _step(cg: Recorder, tool: perftest.Tool | None, step: list[rdma_rails.Rail], here: int | None,
          nodes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One step on every rank: servers start and announce their ports, clients run, then servers end (only
    once every client is done); every rail's outcome on every rank."""
    mine = rdma_rails.role(step, here) if here is not None and tool is not None else None
    server, problem, said = None, None, None
    try:
        if mine is not None and mine[0] == "server":
            server = perftest.start_server(tool, nodes[here]["ports"][mine[1].index]["args"], SERVER_START_S)
            said = {"port": server.port, "gave_up": perftest.said(server.gave_up.output) if server.gave_up else None}
    except UNEXPECTED as exc:
        problem = f"the perftest server could not start: {exc}"
    agree(problem, "RDMA rails: starting the perftest servers failed")
    listening = cg.all_ranks(said)
    measured, problem = None, None
    try:
        if mine is not None and mine[0] == "client":
            rail = mine[1]
            ready = listening[nodes[rail.server]["rank"]]
            if ready and not ready["gave_up"]:
                run = perftest.run_client(tool, nodes[here]["ports"][rail.index]["args"], ready["port"],
                                          nodes[rail.server]["host"], CLIENT_S)
                measured = {"command": " ".join(run.command)}
                try:
                    measured["gbps"] = run.figure(perftest.BW_COLUMN)
                except perftest.PerftestError as exc:
                    measured["error"] = str(exc)
    except UNEXPECTED as exc:
        problem = f"the perftest client could not run: {exc}"
    agree(problem, "RDMA rails: running the perftest clients failed")
    got = cg.all_ranks(measured)
    problem = None
    try:
        if server is not None:
            perftest.stop_server(server, SERVER_END_S)
    except UNEXPECTED as exc:
        problem = f"the perftest server did not end: {exc}"
    agree(problem, "RDMA rails: ending the perftest servers failed")
    out = []
    for rail in step:
        a, b = nodes[rail.server], nodes[rail.client]
        ready = listening[a["rank"]]
        row: dict[str, Any] = {"round": None, "rail": rail.index, "node_a": rail.server, "node_b": rail.client,
                               "server": _side(a, rail.index), "client": _side(b, rail.index)}
        if ready is None or ready["gave_up"] is not None:
            row["error"] = f"the server gave up: {ready['gave_up'] if ready else 'no answer'}"
        else:
            row.update(got[b["rank"]] or {"error": "the client gave no answer"})
        out.append(row)
    return out


def _rounds(cfg: p2p_pairs.Config, nodes: list[dict[str, Any]], cg: Recorder,
            unit: str) -> tuple[list[dict[str, Any]], node_rounds.NodeRounds]:
    """The fabric phase's rounds of node pairs, each pair measured rail by rail; the same plan on every rank."""
    state = node_rounds.NodeRounds(len(nodes), cfg.rounds, cfg.floor, cfg.floor_criterion,
                                   labels=[n["host"] for n in nodes], unit=unit)
    here = next((i for i, n in enumerate(nodes) if n["rank"] == cg.rank), None)
    tool = perftest.Tool.find(perftest.BW_TOOL) if here is not None else None
    rows: list[dict[str, Any]] = []
    width = {i: len(n["ports"]) for i, n in enumerate(nodes)}  # each node's count of rails
    for k in range(cfg.rounds):
        node_pairs = state.plan()
        if not node_pairs:
            continue
        measured = [dict(row, round=k + 1) for step in rdma_rails.steps(node_pairs, width)
                    for row in _step(cg, tool, step, here, nodes)]
        rows += measured
        # A rail that gave no figure counts as 0 Gb/s: the rounds then re-test its nodes as they do a slow one.
        figure = {(r["node_a"], r["node_b"], r["rail"]): r.get("gbps", 0.0) for r in measured}
        span = {(a, b): max(1, min(width[a], width[b])) for a, b in node_pairs}  # a railless pair: no figure
        state.update([node_rounds.PairResult(k, a, b, [figure.get((a, b, i)) for i in range(span[(a, b)])])
                      for a, b in node_pairs])
    state.finish()
    return rows, state


@pytest.mark.multinode
@pytest.mark.metrics(RAIL)
def test_rdma_write_per_rail(cg: Recorder) -> None:
    """Each rail between the nodes of the fabric phase's pair rounds: perftest's ib_write_bw from HCA i of one node
    to HCA i of the other, each from its nearest GPU's memory (GPUDirect RDMA), against the profile."""
    nodes = sorted((n for n in cg.all_ranks(_node_ports(cg)) if n is not None), key=lambda n: n["rank"])
    if all(n["tool"] is None for n in nodes):
        cg.skip(f"{nodes[0]['why']} ({len(nodes)}/{len(nodes)} nodes)", fact="package_missing", package="perftest")
    if not any(n["ports"] or n["problem"] for n in nodes if n["tool"] is not None):
        first = next(n for n in nodes if n["tool"] is not None)
        cg.skip(f"{first['why']} ({len(nodes)} nodes)", fact="no_infiniband")
    criterion = cg.profile.criterion(RAIL)
    cfg = p2p_pairs.Config.for_level(cg.level, cg.device, kind="internode", max_bytes=1 << 20,
                                     floor=criterion.floor, floor_criterion=criterion.as_json())
    rows, state = _rounds(cfg, nodes, cg, criterion.unit or "Gb/s")
    failures: dict[int, list[str]] = {n["rank"]: [] for n in nodes}
    for n in nodes:
        failures[n["rank"]] += [line for line in [n["problem"], n["why"] if n["tool"] is None or not n["ports"]
                                                  else None] if line]
        failures[n["rank"]] += [f"{p['gpudirect_problem']}. Next step: {faults.next_step('config_gpudirect')}"
                                for p in n["ports"] if p["gpudirect_problem"]]
    parts: list[Part] = []
    server_of: dict[str, int] = {}
    for row in rows:
        a, b = nodes[row["node_a"]], nodes[row["node_b"]]
        label = f"rail {row['rail']}, round {row['round']}: {row['server']} <- {row['client']}"
        if "error" in row:
            line = f"{label}: {row['error']}. Next step: {faults.next_step('rdma_bandwidth')}"
            failures[a["rank"]].append(line)
            failures[b["rank"]].append(line)
        else:
            parts.append(Part(RAIL, b["rank"], "node", label, row["gbps"], "Gb/s", "rdma_bandwidth"))
            server_of[label] = a["rank"]
    verdicts = judge_parts(cg, parts)
    for owner, lines in verdicts.failures.items():  # a slow rail is both ends' (the rounds say which to blame)
        failures[owner].extend(lines)  # the client's, the part's owner
        for line in lines:  # and its server's: each line names its part's label (``judge_parts``)
            failures[next(r for lab, r in server_of.items() if f": {lab}: " in line)].append(line)
    for n in state.excluded():
        failures[nodes[n]["rank"]].append(f"{nodes[n]['host']} excluded by the rounds of node pairs: "
                                          + "; ".join(state.evidence[n]))
    cg.record_result(Result(metrics=(), details={"rails": rows, "nodes": nodes, "node_rounds": state.as_json(),
                                                 "evidence": verdicts.rows}))
    mine = [p.value for p in parts if p.owner == cg.rank]
    if mine:
        cg.record(RAIL, min(mine), "Gb/s", scope="node")
    decide(cg, "RDMA write per rail between nodes (perftest)", failures, {})
