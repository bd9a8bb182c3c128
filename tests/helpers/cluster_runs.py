"""Synthetic node-phase results for the merge's tests: the shape of a real 8-GPU node's results.json.

Each node's figures are judged by the plugin's own judge (``clustergate.record.judge``) under the shipped
h100-sxm-80gb profile, so per-rank entries, criteria and pass flags are what a real run writes; the
details carry sweeps, clocks, loss curves and discovery data of about a real node's size (a real
8-GPU node's results.json is a few hundred KB). A fault is a multiplier on one figure of one GPU.
"""

from __future__ import annotations

import json
import random
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import jsonschema
from complete_runs import complete

from clustergate.criteria.thresholds import Profile, load
from clustergate.record.judge import Record, Where, judge
from clustergate.trust.manifest import shipped

from torchrun_job import ROOT

PROFILE = load(ROOT / "thresholds.yaml").profile("h100-sxm-80gb")
MANIFEST = shipped()
CLUSTER_SCHEMA = json.loads((ROOT / "clustergate" / "cluster" / "cluster.schema.json").read_text())

TESTS: dict[str, dict[str, tuple[float, str, str]]] = {  # test -> {metric: (typical value, unit, scope)}
    "acceptance/test_gpu_inventory.py::test_gpu_count": {"gpu_count": (8.0, "GPUs", "node")},
    "acceptance/test_gpu_inventory.py::test_gpu_memory": {"gpu_memory_gib": (79.6, "GiB", "gpu")},
    "acceptance/test_gpu_compute.py::test_matmul_tflops[bf16]": {"matmul_bf16_tflops": (760.0, "TFLOPS", "gpu")},
    "acceptance/test_gpu_compute.py::test_matmul_tflops[fp16]": {"matmul_fp16_tflops": (750.0, "TFLOPS", "gpu")},
    "acceptance/test_gpu_compute.py::test_matmul_tflops[tf32]": {"matmul_tf32_tflops": (410.0, "TFLOPS", "gpu")},
    "acceptance/test_gpu_compute.py::test_matmul_tflops[fp8]": {"matmul_fp8_tflops": (1400.0, "TFLOPS", "gpu")},
    "acceptance/test_gpu_compute.py::test_hbm_bandwidth": {"hbm_bandwidth_tbps": (3.0, "TB/s", "gpu")},
    "acceptance/test_gpu_compute.py::test_host_link[h2d]": {"h2d_bandwidth_gbps": (54.0, "GB/s", "gpu")},
    "acceptance/test_gpu_compute.py::test_host_link[d2h]": {"d2h_bandwidth_gbps": (54.0, "GB/s", "gpu")},
    "acceptance/test_interconnect.py::test_gpu_pairs[intranode]": {"intranode_pair_bw_gbps": (290.0, "GB/s", "gpu")},
    **{f"acceptance/test_interconnect.py::test_collective_bandwidth[node-{c}]": {f"intranode_{m}": (v, "GB/s", "node")}
       for c, m, v in (("all_reduce", "allreduce_busbw_gbps", 370.0), ("all_gather", "allgather_busbw_gbps", 330.0),
                       ("reduce_scatter", "reducescatter_busbw_gbps", 330.0),
                       ("all_to_all", "alltoall_busbw_gbps", 300.0), ("broadcast", "broadcast_busbw_gbps", 360.0),
                       ("sendrecv", "sendrecv_bw_gbps", 360.0))},
    "acceptance/test_interconnect.py::test_allreduce_latency[node]": {
        "intranode_allreduce_latency_us": (30.0, "us", "node")},
    "acceptance/test_interconnect.py::test_allreduce_latency[world]": {"allreduce_latency_us": (40.0, "us", "world")},
    **{f"acceptance/test_interconnect.py::test_collective_bandwidth[world-{c}]": {m: (v, "GB/s", "world")}
       for c, m, v in (("all_reduce", "allreduce_busbw_gbps", 370.0), ("all_gather", "allgather_busbw_gbps", 330.0),
                       ("reduce_scatter", "reducescatter_busbw_gbps", 330.0),
                       ("all_to_all", "alltoall_busbw_gbps", 300.0), ("broadcast", "broadcast_busbw_gbps", 360.0),
                       ("sendrecv", "sendrecv_bw_gbps", 360.0))},
    "acceptance/test_gpu_compute.py::test_sustained_matmul": {"matmul_bf16_sustained_tflops": (700.0, "TFLOPS", "gpu")},
    "acceptance/test_gpu_compute.py::test_power_under_load": {
        "sustained_power_w": (690.0, "W", "gpu"), "sustained_power_fraction": (0.98, "fraction", "gpu"),
        "sustained_sm_clock_mhz": (1750.0, "MHz", "gpu")},
    **{f"acceptance/test_gpu_compute.py::test_host_link_all_gpus[{d}]": {f"{d}_bandwidth_all_gpus_gbps": (
        30.0, "GB/s", "node")} for d in ("h2d", "d2h")},
    "acceptance/test_training.py::test_gpt_throughput": {
        "train_tokens_per_s_per_gpu": (520000.0, "tokens/s", "gpu"), "train_mfu": (0.45, "fraction", "gpu"),
        "train_local_tokens_per_s_per_gpu": (530000.0, "tokens/s", "gpu")},
    "acceptance/test_finetune.py::test_lora_finetune_learns": {
        "lora_loss_drop": (0.6, "fraction", "world"), "lora_eval_loss_drop": (0.5, "fraction", "world"),
        "lora_tokens_per_s_per_gpu": (90000.0, "tokens/s", "gpu")},
    "acceptance/test_finetune.py::test_fsdp_full_finetune": {
        "fsdp_loss_drop": (0.4, "fraction", "world"), "fsdp_tokens_per_s_per_gpu": (60000.0, "tokens/s", "gpu")},
}
PLAIN_TESTS = [f"acceptance/test_gpu_inventory.py::test_{n}" for n in (
    "gpu_model", "gpu_uuids_distinct", "ecc_enabled", "no_uncorrectable_ecc_errors",
    "no_pending_memory_repair", "no_row_remap_failure", "no_clock_slowdown", "pcie_link", "nvlinks_active",
    "mig_mode", "software_versions_identical")] + [
    "acceptance/test_world.py::test_world_matches_profile", "acceptance/test_world.py::test_allreduce_is_exact",
    "acceptance/test_node.py::test_nodes_built_alike", "acceptance/test_training.py::test_checkpoint_round_trip"]


def _details(rng: random.Random, nodeid: str) -> dict[str, Any]:
    """Supporting data of about a real test's size: a sweep, per-rank clocks, a loss curve."""
    sizes = [{"bytes": 1 << (20 + 2 * i), "time_us": rng.uniform(10, 9000), "algbw_gbps": rng.uniform(10, 200),
              "busbw_gbps": rng.uniform(10, 380)} for i in range(8)]
    clocks = {"tables": {"clocks": [{"gpu": g, "sm_mhz": rng.randint(1700, 1980), "mem_mhz": 2619, "power_w": 690.5,
                                     "throttle": "sw_power_cap"} for g in range(8)]}}
    return {"sizes": sizes, **clocks, "loss_curve": [round(rng.uniform(1, 5), 4) for _ in range(100)],
            "note": f"synthetic details of {nodeid}"}


def node_results(host: str, seed: int, faults: dict[tuple[str, int | None], float] | None = None,
                 level: str = "standard", profile: Profile = PROFILE) -> dict[str, Any]:
    """A complete node run's results.json at ``level`` under ``profile`` (``complete_runs``: the tests the level
    leaves out skip on that fact); ``faults[(metric, gpu)]`` multiplies that GPU's figure (gpu None: every GPU).
    ``write_node`` stamps the run id of the directory it writes into."""
    rng = random.Random(seed)
    faults = faults or {}
    wheres = [Where(rank=r, host=host, node_rank=0, gpu_index=r, gpu_serial=f"1654{seed:05d}{r}",
                    gpu_uuid=f"GPU-{host}-{r}") for r in range(8)]
    tests = []
    for nodeid, metrics in TESTS.items():
        if level in MANIFEST.get(nodeid).skipped_by_design:
            continue
        records = []
        for name, (typical, unit, scope) in metrics.items():
            for w in wheres:
                scale = faults.get((name, w.gpu_index), faults.get((name, None), 1.0))
                noise = rng.uniform(0.98, 1.02) if scope == "gpu" and name != "gpu_memory_gib" else 1.0
                value = typical * noise * scale
                records.append(Record(name, value, unit, scope, "", w))
        judged = judge(records, profile)
        failures = [f for j in judged for f in j.failures]
        bad_ranks = sorted({p["rank"] for j in judged for p in j.per_rank if not p["passed"]})
        message = f"[call] {len(failures)} metric checks failed:\n" + "\n".join(f"  {f}" for f in failures)
        tests.append({"nodeid": nodeid, "outcome": "failed" if failures else "passed",
                      "duration_s": rng.uniform(0.5, 20), "failed_ranks": bad_ranks,
                      "message": message if failures else "", "problems": [], "metrics": [j.as_json() for j in judged],
                      "details": _details(rng, nodeid)})
    tests += [{"nodeid": n, "outcome": "passed", "duration_s": 0.1, "failed_ranks": [], "message": "", "problems": [],
               "metrics": [], "details": {}} for n in PLAIN_TESTS]
    # What test_nodes_built_alike keeps of a node's discovery (CPU, NUMA, PCI, InfiniBand, topology): ~100 KB.
    tests[-2]["details"] = {"discovery": [{"node_rank": 0, "host": host, "cpuinfo": "processor : 0\n" * 2000,
                                           "topology": [[f"NV18 {i}-{j}" for j in range(8)] for i in range(8)],
                                           "pci": {f"0000:{b:02x}:00.0": {"numa_node": b % 2, "local_cpulist": "0-55"}
                                                   for b in range(64)}}]}
    failed = any(t["outcome"] == "failed" for t in tests)
    verdict = "reject" if failed else "accept"
    return complete({"schema": 1, "verdict": verdict, "profile": profile.name, "sign_off": True,
            "level": level, "started": "2026-01-01T00:00:00+00:00", "duration_s": 600.0, "world_size": 8,
            "error": None, "nodes": [{"host": host, "node_rank": 0, "ranks": list(range(8)),
                                      "gpus": [{"index": w.gpu_index, "uuid": w.gpu_uuid, "serial": w.gpu_serial,
                                                "name": "NVIDIA H100 80GB HBM3", "rank": w.rank, "local_rank": w.rank}
                                               for w in wheres]}],
            "environment": {"torch": "2.8.0", "cuda": "12.8", "nccl": "2.27.3", "driver": "570.133.20"},
            "clustergate": {"version": "0.1.0", "code_digest": "0" * 16, "thresholds_digest": profile.run_digest},
            "tests": tests}, profile=profile)


def write_node(nodes_dir: Path, host: str, results: dict[str, Any]) -> Path:
    """``results`` into NODES/HOST/results.json, with the run id of NODES's parent (REPORTS/RUN_ID/nodes/HOST)
    unless it names one."""
    results.setdefault("run_id", nodes_dir.parent.name)
    directory = nodes_dir / host
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "results.json").write_text(json.dumps(results, indent=2))
    return directory


FABRIC_TESTS: dict[str, dict[str, tuple[float, str, str]]] = {  # every multinode test -> {metric: (value, unit, scope)}
    **{f"acceptance/test_interconnect.py::test_collective_bandwidth[net-{c}]": {f"net_{m}": (48.0, "GB/s", "gpu")}
       for c, m in (("all_reduce", "allreduce_busbw_gbps"), ("all_gather", "allgather_busbw_gbps"),
                    ("reduce_scatter", "reducescatter_busbw_gbps"), ("all_to_all", "alltoall_busbw_gbps"),
                    ("broadcast", "broadcast_busbw_gbps"), ("sendrecv", "sendrecv_bw_gbps"))},
    "acceptance/test_interconnect.py::test_gpu_pairs[internode]": {"internode_pair_bw_gbps": (47.0, "GB/s", "gpu")},
    "acceptance/test_training.py::test_scaling_efficiency": {"scaling_efficiency": (0.95, "fraction", "world")},
    "acceptance/test_node.py::test_same_software_on_every_node": {},
}


def fabric_results(hosts: list[str], run_id: str, seed: int = 0, gpus: int = 8,
                   faults: dict[tuple[str, str, int], float] | None = None) -> dict[str, Any]:
    """A complete fabric run's results.json on ``hosts`` (``gpus`` ranks each) of run ``run_id``, started now,
    judged under the shipped h100-sxm-80gb profile; ``faults[(metric, host, gpu)]`` multiplies that GPU's figure."""
    rng = random.Random(seed)
    wheres = [Where(rank=n * gpus + g, host=h, node_rank=n, gpu_index=g, gpu_serial=f"1654{seed:03d}{n:02d}{g}",
                    gpu_uuid=f"GPU-{h}-{g}") for n, h in enumerate(hosts) for g in range(gpus)]
    tests = []
    for nodeid, metrics in FABRIC_TESTS.items():
        records = [Record(name, typical * rng.uniform(0.99, 1.01) * (faults or {}).get((name, w.host, w.gpu_index), 1),
                          unit, scope, "", w) for name, (typical, unit, scope) in metrics.items() for w in wheres]
        judged = judge(records, PROFILE)
        failed = sorted({p["rank"] for j in judged for p in j.per_rank if not p["passed"]})
        message = "".join(f"  {f}\n" for j in judged for f in j.failures)
        tests.append({"nodeid": nodeid, "outcome": "failed" if failed else "passed", "duration_s": 2.0,
                      "failed_ranks": failed, "message": f"[call] metric checks failed:\n{message}" if failed else "",
                      "problems": [], "metrics": [j.as_json() for j in judged], "details": {}})
    return complete({
        "schema": 1, "verdict": "reject" if any(t["outcome"] == "failed" for t in tests) else "accept",
        "profile": PROFILE.name, "sign_off": True, "level": "standard",
        "started": datetime.now(timezone.utc).isoformat(timespec="seconds"), "run_id": run_id, "duration_s": 90.0,
        "world_size": len(wheres), "error": None,
        "selection": {"k": None, "m": "multinode", "level": "standard", "selected": len(tests), "deselected": 89,
                      "suite": "acceptance", "args": ["acceptance"], "deselect": [], "modes": [], "maxfail": 0},
        "nodes": [{"host": h, "node_rank": n, "ranks": list(range(n * gpus, (n + 1) * gpus)),
                   "gpus": [{"index": w.gpu_index, "uuid": w.gpu_uuid, "serial": w.gpu_serial,
                             "name": "NVIDIA H100 80GB HBM3", "rank": w.rank, "local_rank": w.gpu_index}
                            for w in wheres if w.host == h]} for n, h in enumerate(hosts)],
        "environment": {"torch": "2.8.0", "cuda": "12.8", "nccl": "2.27.3", "driver": "570.133.20"},
        "clustergate": {"version": "0.1.0", "code_digest": "0" * 16, "thresholds_digest": PROFILE.run_digest},
        "tests": tests}, run="fabric")


def write_fabric(run_dir: Path, results: dict[str, Any]) -> Path:
    """``results`` as REPORTS/RUN_ID/fabric/results.json."""
    (run_dir / "fabric").mkdir(parents=True, exist_ok=True)
    (run_dir / "fabric" / "results.json").write_text(json.dumps(results, indent=2))
    return run_dir / "fabric"


FLEET_TEMPLATES = 16
"""Healthy nodes of ``write_fleet`` are written from this many distinct runs (each its own noise), renamed: writing
1,000 files takes a second or two instead of building and encoding 1,000 runs."""


def write_fleet(nodes_dir: Path, count: int, slow_every: int) -> list[str]:
    """``count`` synthetic 8-GPU node runs ``gpu0000``... under ``nodes_dir`` (REPORTS/RUN_ID/nodes), every
    ``slow_every``-th with one GPU at half the HBM bandwidth; the hosts of those slow nodes."""
    run_id = nodes_dir.parent.name
    healthy = []
    for t in range(FLEET_TEMPLATES):
        results = node_results("gpuHOST", t)
        results["run_id"] = run_id
        healthy.append(json.dumps(results, indent=2))
    slow = []
    for i in range(count):
        host = f"gpu{i:04d}"
        if i % slow_every == 0:
            write_node(nodes_dir, host, node_results(host, i, {("hbm_bandwidth_tbps", 2): 0.5}))
            slow.append(host)
            continue
        t = i % FLEET_TEMPLATES  # its GPUs' serials made its own, as node_results(host, i) numbers them
        text = healthy[t].replace("gpuHOST", host).replace(f'"1654{t:05d}', f'"1654{i:05d}')
        (nodes_dir / host).mkdir(parents=True)
        (nodes_dir / host / "results.json").write_text(text)
    return slow


def schema_errors(data: dict[str, Any]) -> list[str]:
    """What cluster.schema.json finds wrong in a cluster results.json (none: [])."""
    return [e.message for e in jsonschema.Draft202012Validator(CLUSTER_SCHEMA).iter_errors(data)]
