"""End to end over a node's life, as the issue's runs go: a node's first accepted run (the real recorded run,
tests/data/fleet/, filled out to a complete run) recorded by ``clustergate record``; then one real run under
torchrun with ``--store`` (CPU ranks replaying that node's GPUs, tests/helpers/gpu_replay.py, a planted one-file suite
whose figures are the first run's with GPU 1's matmul 10% lower): the run itself flags the drift, writes
metrics.prom and records itself, and ``clustergate history`` shows both runs. A merge of that node beside a
failing one, with the store, gives the excluded host its action and its evidence bundle (files only)."""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
from pathlib import Path

import jsonschema
import pytest
from fleet_data import GPU_METRICS, HOST, SERIALS, figure, later, real_run, write
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from clustergate.cluster.merge import merge
from clustergate.store import Store

from torchrun_job import ROOT, job_env, plant, run_job

SNAPSHOTS = ROOT / "tests" / "data" / "gpu" / "h100_node_healthy.json"
MATMUL = "matmul_bf16_tflops"


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "clustergate.cli", *args], cwd=ROOT, env=job_env(), text=True,
                          capture_output=True, timeout=120)


def families(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """metrics.prom as prometheus_client's OpenMetrics parser reads it (it raises on anything malformed)."""
    return {f.name: [(s.labels, s.value) for s in f.samples] for f in text_string_to_metric_families(text)}


@pytest.mark.slow
def test_two_runs_into_one_store_and_a_planted_drop_flagged(tmp_path: Path) -> None:
    db = tmp_path / "fleet.db"
    first = real_run()
    recorded = cli("record", str(write(tmp_path / "first", first)), "--store", str(db))
    assert recorded.returncode == 0, recorded.stdout + recorded.stderr

    planted = {m: [figure(first, m, s) * (0.9 if (m, s) == (MATMUL, SERIALS[1]) else 1.0) for s in SERIALS]
               for m in GPU_METRICS}
    env = {"PYTHONPATH": f"{ROOT}:{ROOT / 'tests' / 'helpers'}", "CLUSTERGATE_REPLAY_SNAPSHOTS": str(SNAPSHOTS),
           "CLUSTERGATE_NODE_NAME": HOST, "CLUSTERGATE_PLANTED_FIGURES": json.dumps(planted)}
    args = [*plant(tmp_path, "fleet_figures"), "-p", "gpu_replay", "--profile", "cpu", "--level", "quick",
            "--store", str(db)]
    now = run_job(tmp_path, args, nproc=2, env=env, timeout=240)
    assert now.codes == [0], now.output[-3000:]
    results = now.results
    jsonschema.validate(results, json.loads((ROOT / "clustergate" / "results.schema.json").read_text()))
    assert [g["serial"] for g in results["nodes"][0]["gpus"]] == list(SERIALS)

    # drift judged by the run against the first accepted figure: a warning (drift_severity warn), not a failure
    [d] = results["drift"]["findings"]
    assert (d["metric"], d["serial"], d["gpu_index"], d["severity"]) == (MATMUL, SERIALS[1], 1, "warn")
    assert d["fraction"] == pytest.approx(0.1) and d["first_time"] == first["started"]
    assert results["verdict"] == "accept" and [w["where"] for w in results["warnings"]] == [d["where"]]
    assert f"recorded in the store {db} as #2" in now.output
    assert f"drift against {db}: 1 figure more than 5% below its first accepted figure" in now.output
    page = (now.report_dir / "report.html").read_text()
    assert "Drift since the first accepted figures" in page and "-10%" in page

    shown = cli("history", SERIALS[1], "--metric", MATMUL, "--json", "--store", str(db))
    assert shown.returncode == 0, shown.stderr
    rows = json.loads(shown.stdout)["figures"]
    assert [(r["time"], r["value"]) for r in rows] == pytest.approx(
        [(first["started"], planted[MATMUL][1] / 0.9), (results["started"], planted[MATMUL][1])])

    prom = families((now.report_dir / "metrics.prom").read_text())
    assert [(s["serial"], v) for s, v in prom["clustergate_metric_drift_fraction"]] == [
        (SERIALS[1], pytest.approx(0.1))]
    assert {(s["serial"], s["metric"]) for s, _ in prom["clustergate_metric_value"]} == {
        (serial, m) for serial in SERIALS for m in GPU_METRICS}


def test_an_excluded_host_has_its_action_and_bundle(tmp_path: Path) -> None:
    db = tmp_path / "fleet.db"
    good = {**real_run(), "run_id": "r1"}
    # another node's GPUs (other serials and UUIDs), GPU 0's HBM far below its criterion
    other = json.loads(json.dumps(good).replace('"1652823054', '"1652823058').replace("-9e2a-0000", "-9e2a-0008"))
    bad = later(other, good["started"], host="gpu-node-08", scale={("hbm_bandwidth_tbps", "1652823058300"): 0.01})
    nodes = [write(tmp_path / "nodes" / r["nodes"][0]["host"], r).parent for r in (good, bad)]
    cluster = merge(nodes, tmp_path / "run", level="quick", run_id="r1", store=Store(db))

    [excluded] = cluster["excluded"]
    assert excluded["host"] == "gpu-node-08" and excluded["action"] == "retest"
    assert [(s["category"], s["where"]) for s in excluded["steps"]] == [
        ("gpu_memory_bandwidth", "gpu-node-08 gpu 0 serial 1652823058300")]
    assert (tmp_path / "run" / "excluded-hosts.txt").read_text().split("\t")[-1] == "retest\n"
    with tarfile.open(tmp_path / "run" / excluded["evidence"]) as tar:
        assert {"gpu-node-08/results.json", "gpu-node-08/profile.json"} <= set(tar.getnames())
    prom = families((tmp_path / "run" / "metrics.prom").read_text())
    assert dict((s["host"], v) for s, v in prom["clustergate_node_accepted"]) == {HOST: 1.0, "gpu-node-08": 0.0}
    counts = Store(db).count()  # both node runs, then the merge
    assert (counts["run"], counts["cluster"]) == (2, 1)
