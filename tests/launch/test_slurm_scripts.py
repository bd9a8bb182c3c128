"""The Slurm scripts' own logic, without a cluster: what signoff.sbatch hands to srun and to the report
commands in each phase, how launch/first_failure.py names the node that failed first, and the drain
reason launch/health_reason.py takes from results.json. (tests/test_slurm_*.py with the `slurm`
marker run the same scripts on a real cluster.)
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from torchrun_job import ROOT

sys.path.insert(0, str(ROOT / "launch"))
import first_failure  # noqa: E402
import health_reason  # noqa: E402

SIGNOFF = ROOT / "launch" / "slurm" / "signoff.sbatch"


def _exe(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


def _signoff(tmp_path: Path, *, accepted: list[str], until: str = "",
             args: tuple[str, ...] | list[str] = ()) -> tuple[subprocess.CompletedProcess[str], str]:
    """Run signoff.sbatch with srun and the report commands replaced by recorders; the merge accepts
    ``accepted``. Returns the process and the recorded calls (one line each)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(parents=True)
    calls = tmp_path / "calls.log"
    # srun: records its options and the environment node.sh would get; each node phase task writes a
    # report directory, as node.sh's preflight does.
    _exe(bin_dir / "srun", f"""#!/usr/bin/env bash
r=$CLUSTERGATE_REPORT_DIR
echo "srun $* | NNODES=$CLUSTERGATE_NNODES ENDPOINT=$CLUSTERGATE_RDZV_ENDPOINT REPORTS=$r" \
    "RUN=${{CLUSTERGATE_RUN_ID:-}}" >> '{calls}'
case $r in *'{{node}}') for n in gpu1 gpu2 gpu3; do mkdir -p "${{r%\\{{node\\}}}}$n"; done;; esac
""")
    _exe(bin_dir / "python", f"""#!/usr/bin/env bash
echo "python $*" >> '{calls}'
if [ "$3" = merge ]; then
  while [ $# -gt 0 ]; do [ "$1" = -o ] && out=$2; shift; done
  printf '%s\\n' {' '.join(accepted)} > "$out/accepted-hosts.txt"; echo gpu3 > "$out/excluded-hosts.txt"
  echo 'gpu[1-2]' > "$out/accepted-hostlist.txt"; exit 1
fi
[ "$3" = signoff ] && exit 0
exit 0
""")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "CLUSTERGATE_"))}
    env |= {"PATH": f"{bin_dir}{os.pathsep}{env['PATH']}", "SLURM_JOB_ID": "77", "SLURM_JOB_NUM_NODES": "3",
            "SLURM_JOB_NODELIST": "gpu[1-3]", "SLURM_CPUS_ON_NODE": "64", "SLURM_SUBMIT_DIR": str(ROOT),
            "CLUSTERGATE_GPUS_PER_NODE": "8", "CLUSTERGATE_REPORT_DIR": str(tmp_path / "r"),
            "CLUSTERGATE_PYTHON": str(bin_dir / "python"), "CLUSTERGATE_SIGNOFF_UNTIL": until}
    proc = subprocess.run(["bash", str(SIGNOFF), "acceptance", "--level", "quick", *args], env=env,
                          capture_output=True, text=True, timeout=60)
    return proc, calls.read_text() if calls.exists() else ""


def test_signoff_runs_the_four_phases_in_order(tmp_path: Path) -> None:
    proc, calls = _signoff(tmp_path, accepted=["gpu1", "gpu2"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run = tmp_path / "r" / "signoff-77"
    node, merge, fabric, signoff = calls.splitlines()
    assert node.startswith("srun --nodes=3 --ntasks=3 --ntasks-per-node=1 --cpu-bind=none --cpus-per-task=64 "
                           "--kill-on-bad-exit=0 --time=01:00:00 bash ")
    assert node.endswith(f"node.sh acceptance --level quick -m not multinode | NNODES=1 ENDPOINT= "
                         f"REPORTS={run}/nodes/{{node}} RUN=signoff-77")
    assert merge == (f"python -m clustergate merge {run}/nodes/gpu1 {run}/nodes/gpu2 {run}/nodes/gpu3 "
                     f"-o {run}/ --expect-hosts gpu[1-3] --level quick")  # the level the job ran: merge holds to it
    assert fabric.startswith("srun --nodes=2 --ntasks=2 ") and "--nodelist=gpu[1-2] --kill-on-bad-exit=1" in fabric
    # Every phase's run records the cluster run it is a part of: merge and sign-off take only this run's parts.
    assert fabric.endswith(f"-m multinode | NNODES=2 ENDPOINT=gpu1:29500 REPORTS={run}/fabric RUN=signoff-77")
    assert signoff == f"python -m clustergate signoff {run}"
    assert "2 of 3 nodes accepted (gpu1,gpu2); excluded: gpu3" in proc.stdout


@pytest.mark.parametrize("given", [["--thresholds", "site/t.yaml"], ["--thresholds=site/t.yaml"]])
def test_signoff_gives_merge_and_signoff_the_runs_thresholds(tmp_path: Path, given: list[str]) -> None:
    proc, calls = _signoff(tmp_path, accepted=["gpu1", "gpu2"], args=given)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    node, merge, fabric, signoff = calls.splitlines()
    assert f"node.sh acceptance --level quick {' '.join(given)} -m not multinode" in node
    assert merge.endswith("--expect-hosts gpu[1-3] --thresholds site/t.yaml --level quick")
    assert signoff.endswith("signoff-77 --thresholds site/t.yaml")


def test_signoff_skips_the_fabric_under_two_nodes_and_stops_where_asked(tmp_path: Path) -> None:
    proc, calls = _signoff(tmp_path / "one", accepted=["gpu1"])
    assert proc.returncode == 0
    assert "fabric phase skipped: 1 node(s) accepted in the node phase, the inter-node tests need 2 or more" \
        in proc.stdout
    assert [c.split()[0] for c in calls.splitlines()] == ["srun", "python", "python"]
    proc, calls = _signoff(tmp_path / "until", accepted=["gpu1", "gpu2"], until="node")
    assert proc.returncode == 0 and len(calls.splitlines()) == 1 and "stopping after the node phase" in proc.stdout
    proc, _ = _signoff(tmp_path / "bad", accepted=[], until="fabrik")
    assert proc.returncode == 2 and "CLUSTERGATE_SIGNOFF_UNTIL is 'fabrik'" in proc.stderr


@pytest.mark.parametrize("narrowing", [("-k", "matmul"), ("-kmatmul",), ("--deselect", "acceptance/test_world.py"),
                                       ("acceptance/test_gpu_compute.py",), ("acceptance::test_world",), ("--lf",)])
def test_signoff_refuses_arguments_that_narrow_the_runs(tmp_path: Path, narrowing: tuple[str, ...]) -> None:
    """A sign-off signs only what was tested: an argument that narrows the runs would make every node run partial,
    so the job refuses it before any step, naming it."""
    proc, calls = _signoff(tmp_path, accepted=["gpu1", "gpu2"], args=narrowing)
    assert proc.returncode == 2 and calls == "", proc.stdout + proc.stderr
    assert proc.stderr.startswith(f"clustergate: pytest argument '{narrowing[0]}' narrows the suite: "), proc.stderr
    assert "launch/slurm/clustergate.sbatch" in proc.stderr and len(proc.stderr.splitlines()) == 1


def _exits(report: Path, *records: tuple[str, str, int, float]) -> None:
    (report / "node-exits").mkdir(parents=True)
    for node, stage, status, t in records:
        (report / "node-exits" / f"{node}.json").write_text(json.dumps(
            {"node": node, "node_index": node[-1], "stage": stage, "status": status, "time": t}))


def test_first_failure_names_the_earliest_node_and_marks_the_report(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    t = time.time()
    _exits(tmp_path, ("gpu7", "torchrun", 1, t + 0.4), ("gpu3", "torchrun", 1, t))
    (tmp_path / "node-exits" / "torn.json").write_text('{"node": "gpu9", "ti')  # a node that died mid-write
    results = {"schema": 1, "verdict": "accept", "profile": "cpu", "sign_off": True, "level": "quick",
               "started": "2026-01-01T00:00:00+00:00", "duration_s": 9.0, "world_size": 2, "error": None,
               "nodes": [{"host": f"gpu{i}", "node_rank": i, "ranks": [i], "gpus": []} for i in (3, 7)],
               "environment": {"python": "3"},
               "tests": [{"nodeid": "acceptance/test_world.py::test_allreduce_is_exact", "outcome": "passed",
                          "duration_s": 0.1, "failed_ranks": [], "message": "", "details": {}, "metrics": []}]}
    (tmp_path / "results.json").write_text(json.dumps(results))  # a leader killed mid-run left this
    (tmp_path / "progress.jsonl").write_text('{"event": "session_start"}\n')
    assert first_failure.main([str(tmp_path), "--annotate"]) == 0
    out = capsys.readouterr().out
    assert "clustergate: node gpu3 (node index 3) failed first: its torchrun exited 1 at " in out
    assert "(then gpu7 (exit 1, +0.4 s))" in out
    written = json.loads((tmp_path / "results.json").read_text())
    assert written["verdict"] == "reject" and written["error"].startswith("node gpu3 (node index 3) failed first")
    assert "node gpu3 (node index 3) failed first" in (tmp_path / "report.html").read_text()


def test_first_failure_leaves_a_finished_run_alone(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _exits(tmp_path, ("gpu1", "torchrun", 1, time.time()), ("gpu2", "torchrun", 1, time.time()))
    results = {"verdict": "reject", "error": None, "tests": [{"nodeid": "a::t", "outcome": "failed"}]}
    (tmp_path / "results.json").write_text(json.dumps(results))
    (tmp_path / "progress.jsonl").write_text('{"event": "session_start"}\n{"event": "session_end"}\n')
    assert first_failure.main([str(tmp_path), "--annotate"]) == 0
    assert capsys.readouterr().out == ""
    assert json.loads((tmp_path / "results.json").read_text()) == results
    assert first_failure.main([str(tmp_path / "absent")]) == 2


def test_health_reason_names_the_failed_test_and_figure(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    results = {"verdict": "reject", "error": None, "tests": [
        {"nodeid": "acceptance/test_world.py::test_world_matches_profile", "outcome": "passed", "message": ""},
        {"nodeid": "acceptance/test_gpu_compute.py::test_matmul_tflops[bf16]", "outcome": "failed",
         "message": "[call] 1 metric check failed:\n  matmul_bf16_tflops=512.3 TFLOPS, expected >= 700 "
                    "[h100-sxm-80gb, rank 5 gpu-017 gpu 5 serial 1650]"},
        {"nodeid": "acceptance/test_gpu_compute.py::test_hbm_bandwidth", "outcome": "failed", "message": "x"},
        {"nodeid": "acceptance/test_node.py::test_nodes_built_alike", "outcome": "error", "message": "y"}]}
    assert health_reason.reason(results) == (
        "clustergate: reject: test_matmul_tflops[bf16], test_hbm_bandwidth (+1 more): matmul_bf16_tflops=512.3 "
        "TFLOPS, expected >= 700 [h100-sxm-80gb, rank 5 gpu-017 gpu 5 serial 1650]")
    assert health_reason.reason({"verdict": "accept", "tests": []}) == ""
    # A narrowed check that passed all it ran is healthy; a partial record that carries a failure is not.
    clean = {"problems": []}
    assert health_reason.reason({"verdict": "partial", "reason": "ran less than a complete run: (-k x)",
                                 "attestation": clean, "tests": [{"outcome": "passed"}]}) == ""
    # ... unless it ran other code or plugins than the suite's, or does not say which it ran.
    plugin = "plugin 'skipper' (/x/skipper.py) is not one of the suite's"
    assert health_reason.reason({"verdict": "partial", "attestation": {"problems": [plugin]},
                                 "tests": [{"outcome": "passed"}]}) == f"clustergate: partial: {plugin}"
    assert health_reason.reason({"verdict": "partial", "tests": [{"outcome": "passed"}]}) == (
        "clustergate: partial: the run does not say which code and plugins it ran (no attestation)")
    assert health_reason.reason({"verdict": "partial", "tests": [
        {"nodeid": "a.py::test_x", "outcome": "failed", "message": "x=1, expected >= 2"}]}) == (
        "clustergate: partial: test_x: x=1, expected >= 2")
    assert health_reason.reason({"verdict": "reject", "error": "test_x did not finish within 10 s on rank 0\n  more",
                                 "tests": []}) == "clustergate: reject: test_x did not finish within 10 s on rank 0"
    (tmp_path / "results.json").write_text(json.dumps(results))
    assert health_reason.main([str(tmp_path), "--max-chars", "60"]) == 1
    line = capsys.readouterr().out.strip()
    assert len(line) == 60 and line.endswith("...")
    assert health_reason.main([str(tmp_path / "none")]) == 1
    assert "clustergate: no results (" in capsys.readouterr().out


def test_health_reason_from_the_health_tier(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    first = "gpu-017 gpu 3 serial 1652923017303: ecc_mode = disabled (expected enabled): ECC is disabled"
    assert health_reason.health_reason({"status": "healthy", "failures": []}) == ""
    assert health_reason.health_reason({"status": "not healthy", "failures": [first, "gpu-017: gpu_count = 7"]}) == \
        f"clustergate: health: 2 failures: {first}"
    assert health_reason.health_reason({"status": "could not run", "error": "gpu-017: nvidia-ml-py is not installed"}) \
        == "clustergate: health could not run: gpu-017: nvidia-ml-py is not installed"
    (tmp_path / "health.json").write_text(json.dumps({"status": "not healthy", "failures": [first]}))
    (tmp_path / "results.json").write_text(json.dumps({"verdict": "accept", "tests": []}))  # health.json decides
    assert health_reason.main([str(tmp_path)]) == 1
    assert capsys.readouterr().out.strip() == f"clustergate: health: 1 failure: {first}"
    (tmp_path / "health.json").write_text("{")
    assert health_reason.main([str(tmp_path)]) == 1
    assert "clustergate: health: no verdict (" in capsys.readouterr().out
