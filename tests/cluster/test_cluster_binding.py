"""One cluster run binds its parts: the run id, the times, the GPUs, the node files' digests.

Black-box through the commands a user runs (``clustergate merge|signoff``) on node and fabric
results of the shape a real run writes (tests/helpers/cluster_runs.py): a node file of another run, one from outside
the run's window or from the future, one node's file copied as another's (its GPUs' serials on two hosts), a
node file changed after the merge, a fabric run of another run, from before the merge, or on fewer hosts than
the merge accepted: none of them reaches an accepted list.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from cluster_runs import fabric_results, node_results, write_fabric, write_node

from torchrun_job import ROOT, clustergate_args, job_env

RUN = "run-0412"


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    # A hang guard only: each command reads a few files and draws one page.
    return subprocess.run(clustergate_args(*args), cwd=ROOT, env=job_env(), text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=180)


def _nodes(tmp_path: Path, changes: dict[str, dict[str, Any]] | None = None) -> Path:
    """REPORTS/run-0412/nodes/gpu1..gpu3, each a healthy complete node run of run-0412 (``changes`` per host
    update its results); returns the run directory."""
    run = tmp_path / RUN
    for i, host in enumerate(["gpu1", "gpu2", "gpu3"]):
        write_node(run / "nodes", host, {**node_results(host, i + 1), **(changes or {}).get(host, {})})
    return run


def merge(run: Path, *extra: str) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    proc = cli("merge", *sorted(str(p) for p in (run / "nodes").iterdir()), "-o", str(run), *extra)
    assert "Traceback" not in proc.stdout, proc.stdout
    return proc, json.loads((run / "results.json").read_text()) if (run / "results.json").exists() else {}


def excluded(cluster: dict[str, Any]) -> dict[str, str]:
    return {e["host"]: "; ".join(e["reasons"]) for e in cluster["excluded"]}


def test_the_healthy_run_is_accepted_and_its_parts_recorded(tmp_path: Path) -> None:
    run = _nodes(tmp_path)
    proc, cluster = merge(run)
    assert proc.returncode == 0, proc.stdout
    assert cluster["run_id"] == RUN and cluster["level"] == "standard"
    assert cluster["accepted"] == ["gpu1", "gpu2", "gpu3"]
    for node in cluster["nodes"]:
        raw = (run / "nodes" / node["host"] / "results.json").read_bytes()
        assert node["digest"] == "sha256:" + hashlib.sha256(raw).hexdigest() and node["run_id"] == RUN
    assert cluster["window"]["median_start"] == "2026-01-01T00:00:00+00:00"


def test_a_node_file_of_another_run_is_not_this_runs(tmp_path: Path) -> None:
    run = _nodes(tmp_path, {"gpu2": {"run_id": "run-0301"}, "gpu3": {"run_id": None}})
    proc, cluster = merge(run)
    assert proc.returncode == 1 and cluster["accepted"] == ["gpu1"], proc.stdout
    assert "belongs to run 'run-0301', not to this run 'run-0412'" in excluded(cluster)["gpu2"]
    assert "belongs to no run (CLUSTERGATE_RUN_ID was not set)" in excluded(cluster)["gpu3"]
    assert {n["host"]: n["verdict"] for n in cluster["nodes"]}["gpu2"] == "unbound"
    # Their figures are not the fleet's: each metric counts gpu1's parts alone (8 GPUs, or the node's one figure).
    assert cluster["fleet"] and all(fm["count"] == (8 if fm["scope"] == "gpu" else 1) for fm in cluster["fleet"])
    proc, cluster = merge(run, "--run-id", "run-0301")  # the id given, not the directory's
    assert cluster["accepted"] == ["gpu2"] and cluster["run_id"] == "run-0301"


def test_a_node_file_from_outside_the_runs_window_is_not_this_runs(tmp_path: Path) -> None:
    future = (datetime.now(timezone.utc) + timedelta(days=2)).isoformat(timespec="seconds")
    run = _nodes(tmp_path, {"gpu2": {"started": "2025-12-29T00:00:00+00:00"}, "gpu3": {"started": future}})
    proc, cluster = merge(run, "--window", "48")
    assert proc.returncode == 1 and cluster["accepted"] == ["gpu1"], proc.stdout
    assert "72.0 h from the node phase's median start" in excluded(cluster)["gpu2"]
    assert "after this merge" in excluded(cluster)["gpu3"]
    assert cluster["window"]["hours"] == 48


def test_one_nodes_file_copied_as_anothers_excludes_both(tmp_path: Path) -> None:
    """gpu3's directory holds gpu2's run with the host renamed: the same GPU serials and UUIDs on two hosts."""
    run = _nodes(tmp_path)
    copied = json.loads(json.dumps(node_results("gpu2", 2)).replace('"gpu2"', '"gpu3"'))
    write_node(run / "nodes", "gpu3", copied)
    proc, cluster = merge(run)
    assert proc.returncode == 1 and cluster["accepted"] == ["gpu1"], proc.stdout
    assert "also appears on gpu3" in excluded(cluster)["gpu2"] and "also appears on gpu2" in excluded(cluster)["gpu3"]


def test_a_node_run_below_the_level_the_site_requires_ran_less(tmp_path: Path) -> None:
    run = _nodes(tmp_path, {"gpu2": node_results("gpu2", 2, level="quick")})
    proc, cluster = merge(run)
    assert proc.returncode == 1 and "gpu2" not in cluster["accepted"], proc.stdout
    assert ("it ran at level quick, the site requires standard or more (level quick leaves out "
            "test_local_scratch_fio, test_shared_dir_fio, test_lora_finetune_learns, test_fsdp_full_finetune, "
            "test_zero3_finetune)") in excluded(cluster)["gpu2"]
    assert {n["host"]: n["verdict"] for n in cluster["nodes"]}["gpu2"] == "partial"
    proc, cluster = merge(run, "--level", "quick")
    assert proc.returncode == 0 and cluster["level"] == "quick", proc.stdout


def _merged(tmp_path: Path) -> Path:
    run = _nodes(tmp_path)
    proc, _ = merge(run)
    assert proc.returncode == 0, proc.stdout
    return run


def signoff(run: Path) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    proc = cli("signoff", str(run))
    assert "Traceback" not in proc.stdout, proc.stdout
    return proc, json.loads((run / "signoff.json").read_text())


def test_a_fabric_run_of_this_run_after_the_merge_on_exactly_its_hosts_is_signed_off(tmp_path: Path) -> None:
    run = _merged(tmp_path)
    write_fabric(run, fabric_results(["gpu1", "gpu2", "gpu3"], RUN))
    proc, out = signoff(run)
    assert proc.returncode == 0 and out["verdict"] == "accept" and out["run_id"] == RUN, out["reasons"]


def test_a_fabric_run_of_another_run_or_from_before_the_merge_is_not_signed_off(tmp_path: Path) -> None:
    run = _merged(tmp_path)
    write_fabric(run, fabric_results(["gpu1", "gpu2", "gpu3"], "run-0301"))
    proc, out = signoff(run)
    assert proc.returncode == 1 and any("belongs to run 'run-0301', not to this run 'run-0412'" in r
                                        for r in out["reasons"]), out["reasons"]
    earlier = fabric_results(["gpu1", "gpu2", "gpu3"], RUN)
    earlier["started"] = "2026-01-01T00:00:00+00:00"  # the fabric run of an earlier node phase
    write_fabric(run, earlier)
    proc, out = signoff(run)
    assert proc.returncode == 1 and any("before the merge" in r for r in out["reasons"]), out["reasons"]


def test_a_fabric_run_on_fewer_hosts_than_the_merge_accepted_is_not_signed_off(tmp_path: Path) -> None:
    run = _merged(tmp_path)
    write_fabric(run, fabric_results(["gpu1", "gpu2"], RUN))
    proc, out = signoff(run)
    assert proc.returncode == 1 and out["accepted"] == ["gpu1", "gpu2"], out
    assert any("did not cover every host the node phase accepted (gpu3 never joined it)" in r for r in out["reasons"])


def test_a_node_file_changed_after_the_merge_is_not_signed_off(tmp_path: Path) -> None:
    """The file still accepts and still belongs to the run: only its digest tells it is not what merge read."""
    run = _merged(tmp_path)
    write_fabric(run, fabric_results(["gpu1", "gpu2", "gpu3"], RUN))
    replaced = node_results("gpu2", 9)  # another healthy run of gpu2, put in place after the merge
    write_node(run / "nodes", "gpu2", {**replaced, "run_id": RUN})
    proc, out = signoff(run)
    assert proc.returncode == 1 and "gpu2" not in out["accepted"], out
    assert any("is not the file the merge read" in r for e in out["excluded"] for r in e["reasons"]), out["excluded"]
