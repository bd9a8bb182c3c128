"""The GPU session's helpers on CPU: the session profile, mamf-finder's arguments, the peers' outputs read
back, and the closing table.

The peer outputs below follow the formats the peers print (mamf-finder's results file: its per-shape
rows and 'median: X TFLOPS @ MxNxK' summary, and v4's rows; nccl-tests' data lines), written from
their source, not captured from a run; the numbers are the H200 figures of docs/reference-figures.md.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import session_tools  # noqa: E402

from clustergate.criteria.thresholds import load  # noqa: E402
from workloads.gpu import matmul  # noqa: E402

from torchrun_job import job_env  # noqa: E402

# mamf-finder v3's rows end with the best so far in all three statistics, cut here to the median.
MAMF_V3 = """
Warming up the accelerator for 30 secs ... accelerator warmup finished
     1 |  690.2(mean)  695.0(median)  741.3(max) @ 4096x4096x4096        | best: 695.0(median)
     2 |  719.8(mean)  727.1(median)  769.0(max) @ 4096x4096x8192        | best: 727.1(median)
     3 |  701.0(mean)  703.9(median)  730.5(max) @ 8192x8192x8192        | best: 727.1(median)

Tried 3 shapes => the best outcomes were:
mean:   719.8 TFLOPS @ 4096x4096x8192 (MxNxK)
median: 727.1 TFLOPS @ 4096x4096x8192 (MxNxK)
max:    769.0 TFLOPS @ 4096x4096x8192 (MxNxK)
"""
MAMF_V4_ROWS = """
     1  4096x4096x4096       690.2  695.0  741.3  690.2   688  1605
     2  4096x4096x8192       719.8  727.1  769.0  719.8   699  1515
"""
NCCL_TESTS = """
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
           8             2     float     sum      -1    18.31    0.00    0.00      0    17.95    0.00    0.00      0
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 0.000434
"""


def test_mamf_runs_the_suites_own_shapes() -> None:
    args = session_tools.mamf_args("standard").split()
    values: dict[str, list[int]] = {}
    key = ""
    for a in args:
        if a.startswith("--"):
            key = a[2:]
            values[key] = []
        else:
            values[key].append(int(a))
    shapes = [(m, n, k) for m in values["m"] for n in values["n"] for k in values["k"]]
    assert shapes == list(matmul.GPU_SHAPES["standard"])  # the same order too: mamf-finder nests m, n, k


def test_mamf_results_read_back_in_both_formats() -> None:
    v3 = session_tools.parse_mamf(MAMF_V3)
    assert (v3["best"], v3["best_shape"], v3["kind"]) == (727.1, "4096x4096x8192", "best median")
    assert v3["shapes"] == {"4096x4096x4096": 695.0, "4096x4096x8192": 727.1, "8192x8192x8192": 703.9}
    cut = session_tools.parse_mamf(MAMF_V3.split("Tried")[0])  # a run stopped by the session's time limit
    assert cut["best"] == 727.1 and "cut short" in cut["kind"]
    v4 = session_tools.parse_mamf(MAMF_V4_ROWS)
    assert v4["shapes"] == {"4096x4096x4096": 695.0, "4096x4096x8192": 727.1}
    assert session_tools.parse_mamf("Traceback: CUDA error")["shapes"] == {}


def test_nccl_tests_lines_read_back() -> None:
    assert session_tools.parse_nccl_tests(NCCL_TESTS) == [
        {"bytes": 8, "time_us": 18.31, "busbw_gbps": 0.0, "inplace_time_us": 17.95, "inplace_busbw_gbps": 0.0}]


@pytest.mark.parametrize(("name", "gpus", "profile", "shipped"), [
    ("NVIDIA H100 80GB HBM3", 1, "h100-sxm-80gb-1gpu", True), ("NVIDIA H200", 2, "h200-2gpu", True),
    ("NVIDIA H200", 3, "h200-3gpu", False)])
def test_the_session_profile_is_the_shipped_one_for_the_node_shape(tmp_path: Path, name: str, gpus: int,
                                                                   profile: str, shipped: bool) -> None:
    """The profile the run itself chooses for the node's shape; a shape the file has none for gets one made."""
    chosen, text = session_tools.session_profile(ROOT / "thresholds.yaml", gpus, name)
    assert (text == (ROOT / "thresholds.yaml").read_text()) == shipped
    (tmp_path / "t.yaml").write_text(text)
    th = load(tmp_path / "t.yaml")
    p = th.select(name, gpus=gpus)
    assert chosen == profile == p.name and p.settings["gpus_per_node"] == gpus
    assert p.criterion("gpu_count").get("min") == p.criterion("gpu_count").get("max") == gpus
    assert p.criterion("matmul_bf16_tflops").get("min") == 700 and p.setting("peak_bf16_tflops") == 989


def test_the_closing_table_puts_the_suite_beside_the_peers(tmp_path: Path) -> None:
    s = tmp_path / "session"
    for d in ("suite", "mamf", "nccl-tests", "diag"):
        (s / d).mkdir(parents=True)
    per_rank = [{"shapes": [{"shape": [4096, 4096, 8192], "tflops": 720.0}, {"shape": [4096, 4096, 4096],
                                                                             "tflops": 690.0}]}]
    results = {"verdict": "accept", "profile": "h200-2gpu", "warnings": [{"metric": "x"}], "tests": [
        {"nodeid": "acceptance/test_gpu_compute.py::test_matmul_tflops[bf16]", "outcome": "passed",
         "metrics": [{"name": "matmul_bf16_tflops", "value": 720.0, "per_rank": [{"value": 720.0}, {"value": 722.0}]}],
         "details": {"per_rank": per_rank}},
        {"nodeid": "acceptance/test_interconnect.py::test_allreduce_latency[node]", "outcome": "passed",
         "metrics": [{"name": "intranode_allreduce_latency_us", "value": 7.5, "per_rank": [{"value": 7.5}]}],
         "details": {"curves": {"node 0": [{"bytes": 64, "timing": "CUDA graph", "host_time_us": 40.0},
                                           {"bytes": 8, "timing": "CUDA graph", "host_time_us": 36.6}]}}},
        {"nodeid": "acceptance/test_interconnect.py::test_allreduce_latency[world]", "outcome": "passed",
         "metrics": [{"name": "allreduce_latency_us", "value": 21.0, "per_rank": [{"value": 21.0}]}],
         "details": {"curves": {"world": [{"bytes": 8, "timing": "host clock", "host_time_us": 21.0}]}}},
        {"nodeid": "acceptance/test_gpu_compute.py::test_power_under_load", "outcome": "failed",
         "metrics": [{"name": "sustained_power_w", "value": 690.0, "per_rank": [{"value": 690.0}]}]}]}
    (s / "suite" / "results.json").write_text(json.dumps(results))
    (s / "mamf" / "bf16-gpu0.txt").write_text(MAMF_V3)
    (s / "nccl-tests" / "all_reduce_8B.out").write_text(NCCL_TESTS)
    (s / "nccl-tests" / "all_reduce_8B_graph.out").write_text(NCCL_TESTS.replace("18.31", "6.00"))
    (s / "diag" / "gpt_batch32.out").write_text("train_mfu = 0.4412 fraction (...)\n")
    text, summary = session_tools.table(s)
    lines = text.splitlines()
    assert lines[0] == "verdict accept (profile h200-2gpu), 1 warning(s), failed: test_power_under_load"
    bf16 = next(line for line in lines if line.startswith("matmul bf16"))
    assert "720.0-722.0" in bf16 and "727.1" in bf16 and bf16.endswith(f"{721.0 / 727.1:.3f}")
    assert any(line.strip().startswith("bf16 4096x4096x8192") and "720.0" in line and "727.1" in line for line in lines)
    # A CUDA-graph figure beside nccl-tests -G, its host clock beside plain nccl-tests; a host-clock one beside
    # plain nccl-tests.
    node = lines.index(next(line for line in lines if line.startswith("intranode_allreduce_latency_us")))
    assert "nccl-tests -G" in lines[node] and "7.5" in lines[node] and lines[node].endswith(f"{7.5 / 6.0:.2f}x")
    assert "36.6" in lines[node + 1] and "18.3" in lines[node + 1] and lines[node + 1].endswith(f"{36.6 / 18.31:.2f}x")
    world = next(line for line in lines if line.startswith("allreduce_latency_us"))
    assert "host clock" in world and "21.0" in world and world.endswith(f"{21.0 / 18.31:.2f}x")
    assert any(line.startswith("GPT MFU at batch 32") and "0.4412" in line for line in lines)
    assert summary["matmul_fp16"]["mamf"] == [] and summary["failed"] == ["test_power_under_load"]


@pytest.mark.skipif(shutil.which("tar") is None or shutil.which("timeout") is None, reason="needs tar and timeout")
def test_the_session_script_skips_what_does_not_fit_and_still_leaves_its_tarball_and_table(tmp_path: Path) -> None:
    """A budget too small for any step (10 s: under the 15 s a step needs, however fast the machine starts):
    every step says it was skipped, the tarball and the table still come."""
    env = job_env({"OUT": str(tmp_path), "SESSION_BUDGET_S": "10", "WHEELS": str(tmp_path / "none")})
    # Bound: the script's own start (python for the GPU count and the profile) takes seconds; 120 s for a busy machine.
    proc = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_session.sh")], env=env, capture_output=True,
                          text=True, timeout=120)
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr[-2000:]
    assert "SKIPPED suite/run" in out and "SKIPPED diag/matmul_bf16" in out, out
    assert "SKIPPED mamf-finder: no GPU" in out and "verdict no results.json" in out, out
    assert out.rstrip().splitlines()[-1].startswith("GPT MFU"), out  # the table comes last
    with tarfile.open(tmp_path / "session.tgz") as tar:
        names = tar.getnames()
    assert {"session/session.log", "session/table.txt", "session/environment.txt", "session/summary.json"} <= set(names)


@pytest.mark.skipif(shutil.which("timeout") is None, reason="needs timeout")
def test_the_session_installs_missing_wheels_into_a_private_directory(tmp_path: Path) -> None:
    """Wheels the device lacks go to a new directory of the session's own (mktemp -d under $TMPDIR), never to a
    fixed /tmp path whose contents another user could have put there first; it is removed at the end."""
    bin_dir, wheels, tmp = tmp_path / "bin", tmp_path / "wheels", tmp_path / "tmp"
    for d in (bin_dir, wheels, tmp):
        d.mkdir()
    (wheels / "pytest_html-4.0-py3-none-any.whl").write_text("")
    calls = tmp_path / "pip.log"
    # python3 as the session sees it: the report plugins missing, pip recorded, everything else the real one.
    (bin_dir / "python3").write_text(f"""#!/bin/bash
case "$*" in
  *"import pytest_html, pytest_metadata, jsonschema_rs"*) exit 1 ;;
  "-m pip install"*) for a in "$@"; do [ "$prev" = --target ] && ls -ld "$a" >> '{calls}'; prev=$a; done
                     echo "$*" >> '{calls}'; exit 0 ;;
esac
exec '{sys.executable}' "$@"
""")
    (bin_dir / "python3").chmod(0o755)
    env = job_env({"OUT": str(tmp_path / "out"), "SESSION_BUDGET_S": "10", "WHEELS": str(wheels), "TMPDIR": str(tmp)})
    env["PATH"] = f"{bin_dir}:{env['PATH']}"
    proc = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_session.sh")], env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]
    listing, pip = calls.read_text().splitlines()
    target = pip.split("--target ")[1].split()[0]
    assert target.startswith(f"{tmp}/gpu-session-site.") and "/tmp/site" not in pip, pip
    assert listing.startswith("drwx------ ") and listing.endswith(target), listing  # 0700, made by mktemp -d
    assert not Path(target).exists()  # removed when the session ends
