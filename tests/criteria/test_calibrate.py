"""clustergate calibrate on fixture results: robust to a bad GPU, one model and one node shape, clear errors.

The fixtures are results.json files as a run writes them (validated against results.schema.json), with
figures of the size H200s measure: matmul around 727 TFLOPS, 2-GPU all_reduce around 330 GB/s, an 8 B
latency around 20 us.
"""

from __future__ import annotations

import atexit
import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import gpu_replay
import jsonschema
import pytest
import yaml
from complete_runs import complete
from trust_runs import as_node, node_run, recorded  # noqa: F401  (node_run: the fixture)

from clustergate.cluster import calibrate
from clustergate.cluster import calibration_samples as samples_mod
from clustergate.criteria.profile_choice import choose_profile
from clustergate.criteria.thresholds import ThresholdsError, load, shipped_thresholds
from clustergate.record.rejudge import rejudge
from clustergate.trust.manifest import shipped
from workloads.node.gpu_presence import NvidiaDevices

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = json.loads((ROOT / "clustergate" / "results.schema.json").read_text())
H200 = "NVIDIA H200"
BASE = """
schema: 1
fallback_profile: generic
cpu_profile: cpu
profiles:
  h200:
    match: ["H200"]
    settings: {gpus_per_node: 8, peak_bf16_tflops: 989}
    metrics:
      gpu_count: {min: 8, max: 8, unit: GPUs}
      gpu_memory_gib: {min: 139, unit: GiB, source: spec}
      matmul_bf16_tflops: {min: 700, ceiling: 989, outlier_fraction: 0.9, unit: TFLOPS, source: spec}
      matmul_fp16_tflops: {min: 700, ceiling: 989, outlier_fraction: 0.9, unit: TFLOPS, source: estimate,
                           severity: warn}
      intranode_allreduce_busbw_gbps: {min: 350, ceiling: 480, unit: GB/s, source: spec}
      intranode_allreduce_latency_us: {max: 50, unit: us, source: estimate, severity: warn}
      lora_loss_drop: {min: 0.2, unit: fraction}
      train_mfu: {min: 0.4, ceiling: 1.0, unit: fraction}
MEASURED
  generic: {sign_off: false, metrics: {}}
  cpu: {settings: {gpus_per_node: 0}, metrics: {}}
"""
# A profile lists every metric the suite declares (a run refuses one that lacks any): the rest measured, not judged.
BASE = BASE.replace("MEASURED", "\n".join(f"      {name}: {{}}" for name in sorted(
    {m for t in shipped().tests for m in t.metrics} - {line.split(":")[0].strip() for line in BASE.splitlines()})))
_BASE_DIR = Path(tempfile.mkdtemp(prefix="cg-calibrate-base-"))
atexit.register(shutil.rmtree, _BASE_DIR, True)
(_BASE_DIR / "thresholds.yaml").write_text(BASE)
H200_PROFILE = load(_BASE_DIR / "thresholds.yaml").profile("h200")
"""What the fixture runs ran under: the tests they do not name are measured under it (``complete_runs``)."""


def _per_rank(values: list[float], host: str) -> list[dict[str, Any]]:
    return [{"rank": r, "host": host, "node_rank": 0, "gpu_index": r, "gpu_serial": f"SN{host}{r}",
             "gpu_uuid": f"GPU-{host}-{r}", "value": v, "passed": True} for r, v in enumerate(values)]


def run_file(tmp: Path, name: str, *, model: str = H200, bf16: list[float] | None = None,
             fp16: list[float] | None = None, busbw: float = 331.0, latency_us: float = 19.5,
             sick: tuple[int, ...] = (), host: str = "a", started: str = "2026-11-20T10:00:00+00:00",
             verdict: str = "reject", level: str = "standard") -> Path:
    bf16 = bf16 or [727.0, 729.5, 725.1, 728.3]
    fp16 = fp16 or [v - 6 for v in bf16]
    n = len(bf16)

    def metric(name: str, unit: str, scope: str, values: list[float]) -> dict[str, Any]:
        per = _per_rank(values, host) if scope == "gpu" else _per_rank(values, host)[:1]
        return {"name": name, "value": min(values), "unit": unit, "scope": scope, "criterion": {}, "passed": True,
                "per_rank": per}

    def test(nodeid: str, metrics: list[dict[str, Any]], failed: tuple[int, ...] = ()) -> dict[str, Any]:
        return {"nodeid": nodeid, "outcome": "failed" if failed else "passed", "duration_s": 1.0,
                "failed_ranks": list(failed), "message": "", "metrics": metrics}

    data = {
        "schema": 1, "verdict": verdict, "profile": "h200", "level": level, "started": started, "duration_s": 9.0,
        "world_size": n, "error": None, "environment": {},
        "nodes": [{"host": host, "node_rank": 0, "ranks": list(range(n)),
                   "gpus": [{"index": r, "uuid": f"GPU-{host}-{r}", "serial": f"SN{host}{r}", "name": model, "rank": r,
                             "local_rank": r} for r in range(n)]}],
        "tests": [
            test("acceptance/test_gpu_inventory.py::test_no_uncorrectable_ecc_errors", [], sick),
            test("acceptance/test_gpu_inventory.py::test_gpu_count", [metric("gpu_count", "GPUs", "node", [n])]),
            test("acceptance/test_gpu_compute.py::test_matmul_tflops[bf16]",
                 [metric("matmul_bf16_tflops", "TFLOPS", "gpu", bf16)]),
            test("acceptance/test_gpu_compute.py::test_matmul_tflops[fp16]",
                 [metric("matmul_fp16_tflops", "TFLOPS", "gpu", fp16)]),
            test("acceptance/test_interconnect.py::test_collective_bandwidth[node-all_reduce]",
                 [metric("intranode_allreduce_busbw_gbps", "GB/s", "node", [busbw])]),
            test("acceptance/test_interconnect.py::test_allreduce_latency[node]",
                 [metric("intranode_allreduce_latency_us", "us", "node", [latency_us])]),
        ],
    }
    complete(data, profile=H200_PROFILE)  # a complete node run: the suite's other tests skipped or measured
    jsonschema.validate(data, SCHEMA)  # the fixture is what a run writes
    path = tmp / f"{name}.json"
    path.write_text(json.dumps(data))
    return path


@pytest.fixture
def base(tmp_path: Path) -> Path:
    path = tmp_path / "thresholds.yaml"
    path.write_text(BASE)
    return path


def cli(base: Path, out: Path, *files: Path, extra: tuple[str, ...] = ()) -> int:
    return calibrate.main([*map(str, files), "--extends", "h200", "--thresholds", str(base), "-o", str(out), *extra])


def site(out: Path) -> dict[str, Any]:
    return yaml.safe_load(out.read_text())["profiles"]["h200-site"]


def three_runs(tmp: Path, **kw: Any) -> list[Path]:
    return [run_file(tmp, f"run{i}", started=f"2026-11-2{i}T10:00:00+00:00", busbw=330.0 + i, latency_us=19.0 + i,
                     **kw) for i in range(3)]


def test_a_site_profile_of_a_smaller_node_shape(tmp_path: Path, base: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "site.yaml"
    assert cli(base, out, *three_runs(tmp_path)) == 0
    prof = site(out)
    assert prof["extends"] == "h200" and prof["match"] == ["H200"] and prof["settings"] == {"gpus_per_node": 4}
    m = prof["metrics"]
    assert m["gpu_count"]["min"] == m["gpu_count"]["max"] == 4
    assert "matmul_bf16_tflops" not in m  # spec, and a per-GPU figure: the node shape does not change it
    # 0.9 x median 721.65 = 649.5 lies below the minimum of the profile it extends: that minimum holds
    assert m["matmul_fp16_tflops"]["min"] == 700
    assert m["matmul_fp16_tflops"]["severity"] == "warn"
    source = m["matmul_fp16_tflops"]["source"]
    assert source["kind"] == "measured" and source["n"] == 12 and source["runs"] == 3
    assert source["machine"] == "NVIDIA H200, 4 GPUs a node" and source["date"] == "2026-11-22"
    assert m["matmul_fp16_tflops"]["ceiling"] == 989  # the rest of the criterion is carried over
    # A spec for 8-GPU nodes, recalibrated for 4: 0.9 x 331 = 297.9
    allreduce = m["intranode_allreduce_busbw_gbps"]
    assert {k: v for k, v in allreduce.items() if k != "source"} == {"min": 297.0, "ceiling": 480.0, "unit": "GB/s"}
    assert allreduce["source"]["kind"] == "measured"
    assert m["intranode_allreduce_latency_us"]["max"] == pytest.approx(22.3)  # median 20 / 0.9 = 22.2, rounded up
    assert "lora_loss_drop" not in m and "gpu_memory_gib" not in m
    text = out.read_text()
    assert "# 3 run(s), n=12, 2026-11-20..2026-11-22: median" in text and "minimum = 0.9 x median" in text
    # --thresholds site.yaml: the site profile is picked for the same GPUs, the shipped ones still load.
    th = load(out)
    chosen = th.select(H200)
    assert chosen.name == "h200-site" and chosen.settings["gpus_per_node"] == 4
    assert chosen.criterion("matmul_bf16_tflops").get("min") == 700
    assert chosen.criterion("lora_loss_drop").get("min") == 0.2  # a figure of the whole job: kept
    shown = capsys.readouterr().out
    assert "matmul_fp16_tflops" in shown and "kept: spec" in shown
    assert "held at min 700 of shipped h200 (fraction x median: 649; --allow-looser to go below it)" in shown
    assert "LOOSER" not in shown and "LOOSER" not in text


def test_a_bound_looser_than_shipped_only_with_the_flag_and_marked(tmp_path: Path, base: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """--allow-looser writes 0.9 x median where it lies below the shipped minimum, marked in the table and in the
    file (a comment above the criterion), and the written profile is named looser per criterion."""
    from clustergate.criteria.against_shipped import weakenings

    out = tmp_path / "site.yaml"
    assert cli(base, out, *three_runs(tmp_path), extra=("--allow-looser",)) == 0
    assert site(out)["metrics"]["matmul_fp16_tflops"]["min"] == 649  # 0.9 x median 721.65, 3 digits, rounded down
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("matmul_fp16_tflops"))
    assert ">= 700" in row and ">= 649" in row
    assert "LOOSER THAN SHIPPED: min 649 below min 700 of shipped h200 (--allow-looser)" in row
    lines = out.read_text().splitlines()
    at = next(i for i, line in enumerate(lines) if line.strip().startswith("matmul_fp16_tflops:"))
    assert lines[at - 1].strip() == "# LOOSER THAN SHIPPED: min 649 below min 700 of shipped h200 (--allow-looser)"
    said = [w.text() for w in weakenings(load(out).profile("h200-site"), load(base))]
    assert "matmul_fp16_tflops: looser than shipped h200 (min 649 where shipped has >= 700)" in said


def test_one_bad_gpu_does_not_pull_the_minimum_down_and_is_named(tmp_path: Path, base: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    runs = three_runs(tmp_path)
    runs.append(run_file(tmp_path, "slow", bf16=[727.0, 728.0, 512.3, 726.0], host="b"))
    out = tmp_path / "site.yaml"
    assert cli(base, out, *runs, extra=("--allow-looser",)) == 0  # the fleet's own median, not the shipped floor
    healthy = [v - 6 for v in [727.0, 729.5, 725.1, 728.3] * 3 + [727.0, 728.0, 726.0]]
    assert site(out)["metrics"]["matmul_fp16_tflops"]["min"] == calibrate._round(0.9 * statistics.median(healthy),
                                                                                  up=False) == 648
    # With the slow GPU counted the minimum would be lower still; the bad GPU is named instead.
    shown = capsys.readouterr().out
    assert "left out of matmul_fp16_tflops: b gpu 2 serial SNb2 (run 4): outlier: 506.3" in shown
    assert "n=15, 1 left out" in out.read_text()


def test_a_gpu_that_failed_a_health_check_is_left_out_of_every_metric(tmp_path: Path, base: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    runs = three_runs(tmp_path)
    runs.append(run_file(tmp_path, "ecc", bf16=[727.0, 728.0, 690.0, 726.0], sick=(2,), host="c"))
    out = tmp_path / "site.yaml"
    assert cli(base, out, *runs) == 0
    assert "n=15, 1 left out" in out.read_text()  # 690 is no outlier, but its GPU failed the ECC check
    assert "left out of every metric: c gpu 2 serial SNc2 (run 4): failed test_no_uncorrectable_ecc_errors" \
        in capsys.readouterr().out


def test_a_fleet_that_is_not_uniform_is_said_not_trimmed() -> None:
    got = samples_mod.Samples("x", "TFLOPS", "gpu", kept=[samples_mod.Sample(v, 0, f"g{i}") for i, v in
                                                     enumerate([700, 702, 500, 505, 510, 701])])
    note = samples_mod.drop_outliers(got, 0.9, higher_is_better=True)
    assert "not uniform: 3 of 6" in note and len(got.kept) == 6 and not got.left_out


def test_runs_of_different_gpu_models_are_refused(tmp_path: Path, base: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    a = run_file(tmp_path, "h200")
    b = run_file(tmp_path, "h100", model="NVIDIA H100 80GB HBM3")
    assert cli(base, tmp_path / "site.yaml", a, b) == 2
    err = capsys.readouterr().err
    assert "different GPU models" in err and "h200.json: NVIDIA H200" in err and "H100 80GB HBM3" in err
    assert not (tmp_path / "site.yaml").exists()


def test_runs_of_another_model_than_the_profile_are_refused(tmp_path: Path, base: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    runs = [run_file(tmp_path, f"r{i}", model="NVIDIA H100 80GB HBM3") for i in range(3)]
    assert cli(base, tmp_path / "site.yaml", *runs) == 2
    assert "profile 'h200' matches ['H200']" in capsys.readouterr().err


@pytest.mark.parametrize(("content", "words"), [
    ("not json at all", "not readable JSON"),
    ('{"schema": 1, "verdict": "accept"}', "not a valid results.json"),
    ('[1, 2, 3]', "not a valid results.json"),
])
def test_a_file_that_is_not_a_results_json_is_one_clear_error(tmp_path: Path, base: Path, content: str, words: str,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "notes.json"
    bad.write_text(content)
    assert cli(base, tmp_path / "site.yaml", bad) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"clustergate calibrate: {bad}: {words}") and "\n" not in err


def test_no_runs_an_unfinished_run_and_a_missing_file_are_clear_errors(tmp_path: Path, base: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    assert cli(base, tmp_path / "site.yaml") == 2
    assert "no results.json given" in capsys.readouterr().err
    running = run_file(tmp_path, "running", verdict="accept")
    running.write_text(running.read_text().replace('"verdict": "accept"', '"verdict": "running"'))
    assert cli(base, tmp_path / "site.yaml", running) == 2
    assert "did not finish (verdict 'running')" in capsys.readouterr().err
    assert cli(base, tmp_path / "site.yaml", tmp_path / "nowhere.json") == 2
    assert "nowhere.json: file not found" in capsys.readouterr().err


def test_a_metric_with_too_few_samples_is_an_error_naming_it(tmp_path: Path, base: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    one = run_file(tmp_path, "one")
    assert cli(base, tmp_path / "site.yaml", one) == 2
    err = capsys.readouterr().err
    assert "too few samples (need 3) for: intranode_allreduce_busbw_gbps (1 after 0 left out)" in err
    assert "--min-samples" in err and "matmul_fp16_tflops" not in err  # 4 GPUs: enough
    assert cli(base, tmp_path / "site.yaml", one, extra=("--min-samples", "1")) == 0


def test_override_spec_calibrates_spec_criteria_too(tmp_path: Path, base: Path) -> None:
    out = tmp_path / "site.yaml"
    assert cli(base, out, *three_runs(tmp_path), extra=("--override-spec",)) == 0
    assert site(out)["metrics"]["matmul_bf16_tflops"]["min"] == 700  # recalibrated, and held to the spec
    assert cli(base, out, *three_runs(tmp_path), extra=("--override-spec", "--allow-looser", "--force")) == 0
    assert site(out)["metrics"]["matmul_bf16_tflops"]["min"] == 654  # 0.9 x 727.65 = 654.9


def test_the_written_thresholds_must_load(tmp_path: Path, base: Path, monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(calibrate, "render", lambda *a: "schema: 2\n")
    assert cli(base, tmp_path / "site.yaml", *three_runs(tmp_path)) == 2
    assert "schema: must be 1" in capsys.readouterr().err


def test_shipped_thresholds_accept_source_and_severity_and_refuse_others(tmp_path: Path) -> None:
    path = tmp_path / "t.yaml"
    path.write_text(BASE.replace("source: estimate,\n", "source: guess,\n"))
    with pytest.raises(ThresholdsError, match="fp16_tflops.source: kind must be one of spec, measured, published, "
                                              "peers, estimate"):
        load(path)
    path.write_text(BASE.replace("severity: warn}", "severity: maybe}", 1))
    with pytest.raises(ThresholdsError, match="severity: must be fail or warn, got 'maybe'"):
        load(path)


def test_the_module_runs_as_a_command(tmp_path: Path, base: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "clustergate", "calibrate", str(tmp_path / "x.json"), "--extends",
    "h200",
                           "--thresholds", str(base)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "x.json: file not found" in proc.stderr and "Traceback" not in proc.stderr


# ---- node shape: the settings the hardware-shape tests compare against -----------------------------------

def _with_tests(path: Path, *tests: dict[str, Any]) -> Path:
    """The run with ``tests`` recorded: each takes the place of the run's entry of the same test (its figures kept
    where the new entry has none)."""
    data = json.loads(path.read_text())
    by_id = {t["nodeid"]: t for t in data["tests"]}
    for test in tests:
        old = by_id.get(test["nodeid"])
        if old is None:
            data["tests"].append(dict(test))
            continue
        metrics = old["metrics"] if old["outcome"] != "skipped" else []
        old.clear()
        old.update({**test, "metrics": test["metrics"] or metrics})
        old.pop("phases", None)
    complete(data, profile=H200_PROFILE)
    jsonschema.validate(data, SCHEMA)
    path.write_text(json.dumps(data))
    return path


def _inventory(name: str, failed: tuple[int, ...] = (), message: str = "", **details: Any) -> dict[str, Any]:
    return {"nodeid": f"acceptance/test_gpu_inventory.py::{name}", "outcome": "failed" if failed else "passed",
            "duration_s": 0.1, "failed_ranks": list(failed), "message": message, "metrics": [], "details": details}


def _snaps(links: list[int | None]) -> list[dict[str, Any]]:
    """Snapshots as test_gpu_count records them: n active links each (None: NVML reports no NVLink)."""
    out = []
    for rank, n in enumerate(links):
        gpu: dict[str, Any] = {"name": H200}
        unsupported = {}
        if n is None:
            unsupported["nvlink_states"] = "not supported (NVML reports no NVLink on this GPU)"
        else:
            gpu["nvlink_states"] = [{"link": i, "active": i < n} for i in range(18)]
        out.append({"rank": rank, "gpu": gpu, "unsupported": unsupported})
    return out


def _pcie_rows(links: list[tuple[int, int]]) -> list[dict[str, Any]]:
    return [{"rank": r, "host": "a", "gpu_index": r, "status": "ok", "message": "",
             "value": {"pcie_gen_current": g, "pcie_width_current": w, "pcie_gen_max": g, "pcie_width_max": w,
                       "pcie_measured_under_load": True}} for r, (g, w) in enumerate(links)]


def test_a_gpu_short_of_the_fleets_shape_is_left_out_and_the_shape_is_the_fleets(
        tmp_path: Path, base: Path, capsys: pytest.CaptureFixture[str]) -> None:
    runs = [_with_tests(p, _inventory("test_gpu_count", snapshots=_snaps([18, 18, 18, 18 if i else 17])),
                        _inventory("test_nvlinks_active", failed=() if i else (3,), message="17 of 18 NVLinks active"),
                        _inventory("test_pcie_link", pcie_link=_pcie_rows([(5, 16), (5, 16), (5, 8), (5, 16)])))
            for i, p in enumerate(three_runs(tmp_path))]
    out = tmp_path / "site.yaml"
    assert cli(base, out, *runs) == 0
    settings = site(out)["settings"]
    assert settings == {"gpus_per_node": 4, "nvlinks_per_gpu": 18, "pcie_generation": 5, "pcie_width": 16}
    shown = capsys.readouterr().out
    # run 1's GPU 3 (17 links) and every run's GPU 2 (PCIe x8) are left out of every metric, saying why.
    assert "left out of every metric: a gpu 3 serial SNa3 (run 1): nvlinks_per_gpu 17 where the fleet's GPUs " \
           "have 18" in shown
    assert "left out of every metric: a gpu 2 serial SNa2 (run 2): pcie_width 8 where the fleet's GPUs have 16" in shown
    assert "n=8, 4 left out" in out.read_text()  # fp16: 12 GPUs, less run 1's GPUs 2 and 3 and GPU 2 of the others


def test_a_shape_every_gpu_shares_is_the_sites_not_a_fault(tmp_path: Path, base: Path) -> None:
    # One H200 passed through to a VM in every run: no NVLink, PCIe Gen4; under the 8-GPU profile every GPU failed
    # the NVLink and PCIe checks, which says nothing against any one GPU.
    runs = [_with_tests(p, _inventory("test_gpu_count", snapshots=_snaps([None] * 4)),
                        _inventory("test_nvlinks_active", failed=(0, 1, 2, 3), message="but the profile expects 18"),
                        _inventory("test_pcie_link", failed=(0, 1, 2, 3), pcie_link=_pcie_rows([(4, 16)] * 4)),
                        _inventory("test_mig_mode", mig_mode=[{"rank": r, "status": "ok", "message": "MIG not "
                                                               "supported", "value": None} for r in range(4)]))
            for p in three_runs(tmp_path)]
    out = tmp_path / "site.yaml"
    assert cli(base, out, *runs) == 0
    assert site(out)["settings"] == {"gpus_per_node": 4, "nvlinks_per_gpu": 0, "pcie_generation": 4,
                                     "pcie_width": 16, "mig_mode": "disabled"}
    assert "n=12" in out.read_text()  # no GPU left out
    assert "# seen in 3 run(s): 0 on 12 GPU(s); shipped h200: unset" in out.read_text()
    chosen = load(out).select(H200)
    assert chosen.setting("nvlinks_per_gpu") == 0 and chosen.setting("pcie_generation") == 4


def test_infiniband_ports_the_nodes_have_are_carried(tmp_path: Path, base: Path) -> None:
    ports = [{"device": f"mlx5_{i}", "port": 1, "state": "ACTIVE", "phys_state": "LinkUp", "rate": "400 Gb/sec",
              "rate_gbps": 400.0, "link_layer": "InfiniBand"} for i in range(4)]
    ports.append({"device": "mlx5_bond_0", "port": 1, "state": "ACTIVE", "phys_state": "LinkUp", "rate": "100 Gb/sec",
                  "rate_gbps": 100.0, "link_layer": "Ethernet"})  # RoCE: not counted, as the IB test does not
    node = {"nodeid": "acceptance/test_node.py::test_nodes_built_alike", "outcome": "passed", "duration_s": 0.1,
            "failed_ranks": [], "message": "", "metrics": [],
            "details": {"discovery": [{"host": "a", "node_rank": 0, "infiniband": ports}]}}
    out = tmp_path / "site.yaml"
    assert cli(base, out, *[_with_tests(p, node) for p in three_runs(tmp_path)]) == 0
    settings = site(out)["settings"]
    assert settings["ib_ports_per_node"] == 4 and settings["ib_rate_gbps"] == 400.0


def test_checks_calibration_cannot_change_are_said(tmp_path: Path, base: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    failed = {"nodeid": "acceptance/test_node_config.py::test_gpu_setting[persistence_mode]", "outcome": "failed",
              "duration_s": 0.1, "failed_ranks": [0], "message": "failed on 1/4 ranks: 0\nexpect.persistence_mode: ...",
              "metrics": []}
    out = tmp_path / "site.yaml"
    assert cli(base, out, *[_with_tests(p, failed) for p in three_runs(tmp_path)]) == 0
    shown = capsys.readouterr().out
    assert "the runs failed these checks, which calibration does not change" in shown
    assert "test_gpu_setting[persistence_mode]: run 1: failed on 1/4 ranks: 0" in shown
    assert "#   test_gpu_setting[persistence_mode]: run 3: failed on 1/4 ranks: 0" in out.read_text()


# ---- end to end: calibrate on a recorded GPU, run the same checks on it again --------------------------------

@pytest.mark.slow
def test_a_calibrated_profile_accepts_the_machine_it_was_calibrated_on(tmp_path: Path) -> None:
    """The issue's steps on a recorded GPU: a run under the shipped 8-GPU profile on a 1-GPU VM without NVLink, its
    PCIe link at generation 4, rejects; calibrate from it; the same checks on the same GPU under the calibrated
    profile accept, and so does re-judging that run with ``clustergate render``. A link at the shipped generation 5
    would change none of these steps, only fail one check fewer (generation 5 learned from the runs:
    test_a_gpu_short_of_the_fleets_shape_is_left_out_and_the_shape_is_the_fleets)."""
    pcie_gen = 4
    vm = gpu_replay.one_gpu_vm(tmp_path, pcie_gen)
    first = gpu_replay.inventory_run(tmp_path, "std", ROOT / "thresholds.yaml", "h100-sxm-80gb", vm)
    assert first.results["verdict"] == "reject", first.output[-3000:]
    failed = {t["nodeid"].split("::")[-1]: t["message"] for t in first.results["tests"] if t["outcome"] == "failed"}
    assert "(NVML reports no NVLink on this GPU), but the profile expects 18 active links" \
        in failed["test_nvlinks_active"]
    assert "test_pcie_link" in failed  # generation 4 where the shipped profile expects 5
    # Calibrate takes complete runs only: the recorded inventory checks, with the rest of a node run skipped. (pytest
    # names the tests of one file given outside its rootdir "::NAME": named here as the suite names them.)
    std = json.loads((tmp_path / "std" / "results.json").read_text())
    for test in std["tests"]:
        test["nodeid"] = "acceptance/test_gpu_inventory.py" + test["nodeid"][test["nodeid"].index("::"):]
    std["selection"]["suite"] = "acceptance"
    done = complete(std)
    (tmp_path / "std-complete.json").write_text(json.dumps(done))
    site_file = tmp_path / "site.yaml"
    assert calibrate.main([str(tmp_path / "std-complete.json"), "--extends", "h100-sxm-80gb", "--min-samples", "1",
                           "-o", str(site_file)]) == 0
    prof = yaml.safe_load(site_file.read_text())["profiles"]["h100-sxm-80gb-site"]
    assert prof["settings"] == {"gpus_per_node": 1, "nvlinks_per_gpu": 0, "pcie_generation": pcie_gen,
                                "pcie_width": 16, "mig_mode": "disabled"}
    # The same checks again pass every one; one file of the suite is a partial run, never an accept.
    again = gpu_replay.inventory_run(tmp_path, "again", site_file, "h100-sxm-80gb-site", vm)
    assert {t["outcome"] for t in again.results["tests"]} <= {"passed", "skipped"}, again.output[-3000:]
    assert again.results["verdict"] == "partial" and again.results["error"] is None
    rejudge = subprocess.run([sys.executable, "-m", "clustergate", "render", str(tmp_path / "again" / "results.json"),
                              "--thresholds", str(site_file), "--profile", "h100-sxm-80gb-site", "-o",
                              str(tmp_path / "rejudged.html"), "--json-out", str(tmp_path / "rejudged.json")],
                             cwd=ROOT, capture_output=True, text=True, timeout=120)
    rejudged = json.loads((tmp_path / "rejudged.json").read_text())
    assert rejudge.returncode == 1 and rejudged["verdict"] == "partial", rejudge.stdout + rejudge.stderr
    assert {t["outcome"] for t in rejudged["tests"]} <= {"passed", "skipped"}


# ---- it writes only what it can stand behind -------------------------------------------------------------------

def _cpu_run(path: Path) -> Path:
    data = json.loads(path.read_text())
    for node in data["nodes"]:
        node["gpus"] = []
    path.write_text(json.dumps(data))
    return path


def test_cpu_runs_calibrate_no_gpu_profile(tmp_path: Path, base: Path, capsys: pytest.CaptureFixture[str]) -> None:
    runs = [_cpu_run(p) for p in three_runs(tmp_path)]
    assert cli(base, tmp_path / "site.yaml", *runs) == 2
    err = capsys.readouterr().err
    assert "the runs are CPU runs (no GPU), but profile 'h200' is for GPUs (['H200'], 8 a node)" in err
    assert "--extends cpu" in err and not (tmp_path / "site.yaml").exists()


def test_a_partial_run_is_not_calibrated_from(tmp_path: Path, base: Path, capsys: pytest.CaptureFixture[str]) -> None:
    runs = three_runs(tmp_path)
    data = json.loads(runs[1].read_text())
    data["tests"] = [t for t in data["tests"] if not t["nodeid"].endswith("test_hbm_bandwidth")]
    runs[1].write_text(json.dumps(data))
    assert cli(base, tmp_path / "site.yaml", *runs) == 2
    err = capsys.readouterr().err
    total = len(shipped().of_run("node"))  # the suite's own count: tests added elsewhere change it
    assert f"{runs[1]}: a partial run (1 of the {total} tests of a complete node run did not run: test_hbm_bandwidth)" \
        in err
    assert not (tmp_path / "site.yaml").exists()


def test_runs_of_different_levels_are_refused(tmp_path: Path, base: Path, capsys: pytest.CaptureFixture[str]) -> None:
    runs = [*three_runs(tmp_path)[:2], run_file(tmp_path, "quick", level="quick")]
    assert cli(base, tmp_path / "site.yaml", *runs) == 2
    assert "the runs have different levels (a figure at quick is not one at standard)" in capsys.readouterr().err


def test_a_profile_that_would_fail_the_healthy_runs_is_not_written(tmp_path: Path, base: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """Every GPU at 690 TFLOPS bf16: uniform (no outlier), healthy, and below the spec minimum 700 the new profile
    keeps: written, it would reject the machines it was calibrated on."""
    runs = three_runs(tmp_path, bf16=[690.0, 691.0, 689.5, 690.5])
    assert cli(base, tmp_path / "site.yaml", *runs) == 2
    err = capsys.readouterr().err
    assert err.startswith("clustergate calibrate: nothing written: the new profile would fail parts of the runs it "
                          "was calibrated from that calibration kept as healthy: ")
    assert f"{runs[0]}: matmul_bf16_tflops=690 at a gpu 0 serial SNa0 fails the new profile (>= 700" in err
    assert "--override-spec" in err and not (tmp_path / "site.yaml").exists()
    assert "--fraction" not in err and "healthy nodes" not in err  # the spread is not what fails them
    # Calibrated, the spec minimum still holds as the floor: the nodes below it are refused, --allow-looser offered.
    assert cli(base, tmp_path / "site.yaml", *runs, extra=("--override-spec",)) == 2
    err = capsys.readouterr().err
    assert err.endswith("to write it, give --allow-looser to calibrate matmul_bf16_tflops below the shipped bound "
                        "these nodes miss (marked as looser than shipped in the file, and by list, run, merge and "
                        "sign-off)\n") and not (tmp_path / "site.yaml").exists()
    assert cli(base, tmp_path / "site.yaml", *runs, extra=("--override-spec", "--allow-looser")) == 0  # it passes
    assert "# LOOSER THAN SHIPPED: min 621 below min 700 of shipped h200" in (tmp_path / "site.yaml").read_text()


# ---- CPU runs: the dry run's calibration, as a CPU's figures spread -------------------------------------------

CPU_SPREAD = ({}, {"sendrecv_bw_gbps": 0.31, "d2h_bandwidth_gbps": 0.44}, {"allreduce_latency_us": 1.6})
"""Three CPU runs as three standard runs of 2 ranks measured on a shared 2-core machine spread (README's command 1
on the same machine, one after the other): one run's whole-job send/recv at 0.31 of the others', its host copies at
0.44, another's latency at 1.6 times."""


def _cpu_runs(tmp: Path, run: Path) -> list[Path]:
    """The shared real CPU run (README's command 1) as three runs of three hosts, their figures spread as a CPU's do,
    each judged again by the run's own judge under the shipped cpu profile."""
    cpu = load(shipped_thresholds()).profile("cpu")
    paths = []
    for i, factors in enumerate(CPU_SPREAD):
        results = as_node(recorded(run), f"cg-{i + 1}", "calibration")
        for test in results["tests"]:
            for metric in test["metrics"]:
                factor = factors.get(metric["name"], 1.0)
                metric["value"] *= factor
                for part in metric["per_rank"]:
                    part["value"] *= factor
        judged = rejudge(results, cpu)
        del judged["rejudged"]
        paths.append(tmp / f"cg-{i + 1}.json")
        paths[-1].write_text(json.dumps(judged))
    return paths


def test_cpu_runs_calibrate_the_cpu_profile_for_thresholds_alone(tmp_path: Path, node_run: Path,  # noqa: F811
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """README's calibrate command with --extends cpu writes at the CPU default; the file's cpu_profile is the new
    profile, so --thresholds alone chooses it on a machine without a GPU, and the last line says so."""
    runs = _cpu_runs(tmp_path, node_run)
    out = tmp_path / "site-thresholds.yaml"
    assert calibrate.main([*map(str, runs), "--extends", "cpu", "-o", str(out)]) == 0, capsys.readouterr().err
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].endswith(f"-> profile 'cpu-site' in {out} (minimum = {calibrate.CPU_FRACTION} x median)")
    assert printed[-1] == f"use it: --thresholds {out} on every phase"
    written = load(out)
    assert written.cpu_profile == "cpu-site"
    assert choose_profile(written, None, NvidiaDevices((), None, (), (), (), None)).name == "cpu-site"
    assert written.profile("cpu-site").metrics["sendrecv_bw_gbps"].get("min") is not None


def test_only_the_remedies_that_apply_are_offered(tmp_path: Path, node_run: Path,  # noqa: F811
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """The same CPU runs at the GPU default, 0.9: a spread too wide for it, nothing else. The error offers a lower
    --fraction with one it tried that passes every run (and it does), neither --override-spec (no spec criterion
    fails them) nor runs of healthy nodes (they are)."""
    runs = _cpu_runs(tmp_path, node_run)
    out = tmp_path / "site.yaml"
    assert calibrate.main([*map(str, runs), "--extends", "cpu", "-o", str(out), "--fraction", "0.9"]) == 2
    err = capsys.readouterr().err
    assert "nothing written" in err and not out.exists()
    fixes = err.split("; to write it, give ", 1)[1]
    assert fixes.startswith("a lower --fraction than 0.9 (the kept figures of ") and "d2h_bandwidth_gbps" in fixes
    assert "--override-spec" not in fixes and "healthy nodes" not in fixes
    said = re.search(r"--fraction (\S+) passes every run", fixes)
    assert said is not None, fixes
    assert calibrate.main([*map(str, runs), "--extends", "cpu", "-o", str(out), "--fraction", said[1]]) == 0


@pytest.mark.parametrize("extra, said", [(("--fraction", "1.5"), "--fraction 1.5 must lie in (0, 1)"),
                                         (("--fraction", "nan"), "--fraction nan must lie in (0, 1)"),
                                         (("--min-samples", "0"), "--min-samples 0 must be at least 1")])
def test_a_fraction_or_sample_count_out_of_range_is_named(tmp_path: Path, base: Path, extra: tuple[str, ...],
                                                          said: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli(base, tmp_path / "site.yaml", *three_runs(tmp_path), extra=extra) == 2
    assert capsys.readouterr().err == f"clustergate calibrate: {said}\n"
