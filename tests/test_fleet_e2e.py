"""End to end on real runs: two runs of one node (CPU ranks under torchrun, each replaying a recorded H100's
identity, tests/gpu_replay.py): one made now, one made earlier the same way (tests/data/fleet/); recorded
into one store by ``clustergate record``; ``clustergate history`` shows both; metrics.prom of each parses;
a 10% drop planted on one GPU serial is flagged as drift; the node's directory makes an evidence bundle."""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from fleet_data import DATA, real_run
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from clustergate.evidence_bundle import build
from clustergate.openmetrics import render
from clustergate.store import Store
from clustergate.store.drift import drift

from torchrun_job import ROOT, job_env, run_job

pytestmark = pytest.mark.slow

SNAPSHOTS = ROOT / "tests" / "data" / "gpu" / "h100_node_healthy.json"
SELECT = [str(ROOT / "acceptance" / "test_gpu_compute.py"), str(ROOT / "acceptance" / "test_interconnect.py"),
          "-p", "gpu_replay", "--profile", "cpu", "--level", "quick", "-k", "hbm or bf16 or node-all_reduce",
          "--rootdir", str(ROOT)]


def cli(module: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", f"clustergate.store.{module}", *args], cwd=ROOT, env=job_env(),
                          text=True, capture_output=True, timeout=120)


def test_two_real_runs_into_one_store(tmp_path: Path) -> None:
    env = {"PYTHONPATH": f"{ROOT}:{ROOT / 'tests'}", "CLUSTERGATE_REPLAY_SNAPSHOTS": str(SNAPSHOTS),
           "CLUSTERGATE_NODE_NAME": "gpu-node-07"}
    now = run_job(tmp_path, SELECT, nproc=2, env=env, report_dir=tmp_path / "report", timeout=300)
    assert now.codes == [0], now.output[-3000:]
    runs = [real_run(), now.results]
    serials = [g["serial"] for g in runs[1]["nodes"][0]["gpus"]]
    assert serials == ["1652823054300", "1652823054301"]

    db = tmp_path / "fleet.db"
    recorded = cli("record_cli", "--store", str(db), str(DATA / "node-run.json"), str(now.report_dir))
    assert recorded.returncode == 0, recorded.stderr
    shown = cli("history_cli", serials[1], "--metric", "matmul_bf16_tflops", "--store", str(db))
    assert shown.returncode == 0, shown.stderr
    rows = [line.split() for line in shown.stdout.splitlines()[3:]]
    assert sorted((r[0], r[1]) for r in rows) == sorted((run["started"], f"#{n}") for n, run in
                                                        zip((1, 2), (runs[0], runs[1]), strict=True))
    assert all(r[2:5] == ["gpu-node-07", "1", serials[1]] and r[-1] == "pass" for r in rows)
    as_json = json.loads(cli("history_cli", "gpu-node-07", "--json", "--store", str(db)).stdout)
    assert len(as_json["figures"]) == 10  # two runs: two GPUs x two metrics and the node's all-reduce

    for run in runs:
        families = {f.name: f for f in text_string_to_metric_families(render(run))}
        values = families["clustergate_metric_value"].samples
        assert {(s.labels["serial"], s.labels["metric"]) for s in values} >= {
            (serials[1], "matmul_bf16_tflops"), (serials[0], "hbm_bandwidth_tbps")}

    # the later run with GPU 1's matmul planted 10% below its first accepted figure, every other figure as
    # it first was (CPU figures wander by more than 5% from run to run)
    store = Store(db)
    earlier, later_run = sorted(runs, key=lambda r: r["started"])
    planted = json.loads(json.dumps(later_run))
    planted["started"] = "2099-01-01T00:00:00+00:00"
    for t_new, t_old in zip(planted["tests"], earlier["tests"], strict=True):
        for m_new, m_old in zip(t_new["metrics"], t_old["metrics"], strict=True):
            for p_new, p_old in zip(m_new["per_rank"], m_old["per_rank"], strict=True):
                drop = m_new["name"] == "matmul_bf16_tflops" and p_new["gpu_serial"] == serials[1]
                p_new["value"] = p_old["value"] * (0.9 if drop else 1.0)
    [d] = drift(planted, store)
    assert (d.metric, d.serial, d.gpu_index) == ("matmul_bf16_tflops", serials[1], 1)
    assert d.fraction == pytest.approx(0.1) and d.first_time == earlier["started"]

    bundle = build(now.report_dir, tmp_path, host="gpu-node-07")
    with tarfile.open(bundle) as tar:
        names = set(tar.getnames())
    assert {"gpu-node-07/results.json", "gpu-node-07/report.html", "gpu-node-07/profile.json"} <= names
