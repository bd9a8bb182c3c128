"""Runs of one node over its life, made from a real run (tests/data/fleet/node-run.json, see its README).

``later`` gives the same node's run at another time: its own start and rendezvous id (so the store sees
another run), every figure as it was unless planted (``scale`` multiplies one GPU's or node's figures),
a GPU moved to another host, or a verdict changed. Figures and their criteria stay consistent: a planted
figure is judged again by the plugin's own rule, so the run's verdict is what its records say.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from complete_runs import complete

from clustergate.criteria.criterion import Criterion, Figure
from clustergate.criteria.thresholds import load, shipped_thresholds

DATA = Path(__file__).parents[1] / "data" / "fleet"
HOST = "gpu-node-07"
SERIALS = ("1652823054300", "1652823054301")
"""The two GPUs' serials in the real run (GPU 0 and GPU 1)."""
GPU_METRICS = ("matmul_bf16_tflops", "hbm_bandwidth_tbps")
NODE_METRIC = "intranode_allreduce_busbw_gbps"


def real_run() -> dict[str, Any]:
    """The recorded run, filled out to a complete node run (its -k left the other tests out: a partial run is
    never accepted, so it could be no one's first accepted figure), and held to today's shipped cpu profile: the
    record carries the digest of the profile of the day it was made, and merge holds a run to its thresholds'."""
    run = complete(json.loads((DATA / "node-run.json").read_text()))
    run["clustergate"]["thresholds_digest"] = load(shipped_thresholds()).profile(run["profile"]).run_digest
    return run


def parts(results: dict[str, Any], serial: str | None = None) -> int:
    """How many figures ``results`` holds (of the GPU of ``serial`` alone, where given): what a store keeps of it. The
    recorded run's three metrics, and those of the tests ``complete_runs`` measured to make it complete."""
    return sum(1 for t in results["tests"] for m in t["metrics"] for p in m["per_rank"]
               if serial is None or (m["scope"] == "gpu" and p.get("gpu_serial") == serial))


def figure(results: dict[str, Any], metric: str, serial: str | None = None) -> float:
    """A part's figure: a GPU's (by serial), or the node's."""
    for test in results["tests"]:
        for m in test["metrics"]:
            if m["name"] == metric:
                return next(float(p["value"]) for p in m["per_rank"] if serial is None or p["gpu_serial"] == serial)
    raise KeyError(metric)


def later(run: dict[str, Any], started: str, *, scale: dict[tuple[str, str | None], float] | None = None,
          host: str | None = None, level: str | None = None, swap_serials: bool = False) -> dict[str, Any]:
    """The same node's run started at ``started``. ``scale[(metric, serial)]`` multiplies that GPU's figure
    (serial None: the node's figure); ``host`` renames the node (its GPUs moved with it); ``swap_serials``
    puts GPU 0's card in slot 1 and GPU 1's in slot 0."""
    out = copy.deepcopy(run)
    out["started"] = started
    out["environment"]["TORCHELASTIC_RUN_ID"] = f"rdzv-{started}"
    if level is not None:
        out["level"] = out["selection"]["level"] = level
    swap = {SERIALS[0]: SERIALS[1], SERIALS[1]: SERIALS[0]} if swap_serials else {}
    for node in out["nodes"]:
        node["host"] = host or node["host"]
        for g in node["gpus"]:
            g["serial"] = swap.get(g["serial"], g["serial"])
    for test in out["tests"]:
        for m in test["metrics"]:
            criterion = Criterion.from_json(m["criterion"])
            for p in m["per_rank"]:
                p["host"] = host or p["host"]
                p["gpu_serial"] = swap.get(p.get("gpu_serial"), p.get("gpu_serial"))
                key = (m["name"], p.get("gpu_serial") if m["scope"] == "gpu" else None)
                p["value"] *= (scale or {}).get(key, 1.0)
            figures = [Figure(p["value"], m["unit"], p["node_rank"]) for p in m["per_rank"]]
            for p, (failed, warned) in zip(m["per_rank"], criterion.weigh(figures, m["scope"]), strict=True):
                p["passed"], p["warned"] = not failed, bool(warned)
            m["passed"] = all(p["passed"] for p in m["per_rank"])
            m["value"] = criterion.stand_in([p["value"] for p in m["per_rank"]])
        if not all(m["passed"] for m in test["metrics"]):
            test["outcome"] = "failed"
    if any(t["outcome"] == "failed" for t in out["tests"]):
        out["verdict"], out["reason"] = "reject", "a test failed"
    return out


def write(directory: Path, results: dict[str, Any], name: str = "results.json") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(json.dumps(results, indent=2))
    return path


_MERGED: list[tuple[dict[str, Any], dict[str, Any], Path]] = []


def merged_docs(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], dict[str, Any], Path]:
    """A merge's cluster results and a sign-off, by the real commands (made once per test process: a merge
    draws its report, which takes seconds): three synthetic 8-GPU nodes (tests/helpers/cluster_runs.py), m1 healthy,
    m2's HBM 13% below the fleet on every GPU (a fleet outlier), m3's matmul failing its own test on GPU 3;
    and a one-node sign-off. Also the directory that holds them."""
    from cluster_runs import node_results, write_node

    from clustergate.cluster.merge import merge
    from clustergate.cluster.signoff import signoff

    if _MERGED:
        return _MERGED[0]
    base = tmp_path_factory.mktemp("merged")
    faults = {"m2": {("hbm_bandwidth_tbps", None): 0.87}, "m3": {("matmul_bf16_tflops", 3): 0.5}}
    for i, host in enumerate(("m1", "m2", "m3"), start=1):
        write_node(base / "nodes", host, node_results(host, i, faults.get(host)))
    cluster = merge(sorted((base / "nodes").iterdir()), base / "run")
    write_node(base / "solo" / "nodes", "solo", node_results("solo", 9))
    merge([base / "solo" / "nodes" / "solo"], base / "solo" / "run")
    _MERGED.append((cluster, signoff(base / "solo" / "run"), base))
    return _MERGED[0]
