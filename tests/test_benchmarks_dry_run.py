"""Every benchmark script runs, on CPU, so none can rot between GPU sessions.

The scripts in benchmarks/ are run by hand or by gpu_session.sh on a lent GPU machine, where a crash costs
the session (latency_diag.py once called a function the latency workload no longer had). Each one has a dry
run here: the GPU diagnostics under torchrun on 2 CPU ranks over gloo (their CPU modes, tiny sizes), the
plugin benchmark with a handful of tests, the session helpers through their command line. A script added to
benchmarks/ without a dry run fails ``test_every_benchmark_script_has_a_dry_run``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "benchmarks"
sys.path.insert(0, str(ROOT / "tests"))

from torchrun_job import job_env  # noqa: E402

# Hang guards, not speed bounds: each dry run takes 10-30 s on CI's 2 busy cores.
TIMEOUT_S = 300


def torchrun(script: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
           str(BENCH / script), *args]
    return subprocess.run(cmd, cwd=cwd, env=job_env(), capture_output=True, text=True, timeout=TIMEOUT_S)


def script(name: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(BENCH / name), *args], cwd=cwd, env=job_env(), capture_output=True,
                          text=True, timeout=TIMEOUT_S)


def ok(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-4000:]
    return proc.stdout


def dry_latency_diag(tmp: Path) -> None:
    out = ok(torchrun("latency_diag.py", "--dry-run", "--out", str(tmp / "latency.json"), cwd=tmp))
    data = json.loads((tmp / "latency.json").read_text())
    rows = data["ranks"][0]["rows"]
    assert {r["comm"] for r in rows} >= {"default", "new_group", "suite-node", "suite-world", "bare NCCL (ctypes)"}
    assert all(isinstance(r["sync_host_us"], float) and isinstance(r["async_host_us"], float)
               for r in rows if "error" not in r)
    assert "suite run 3 (node)" in out and "written:" in out


def dry_matmul_diag(tmp: Path) -> None:
    # The quick level, as gpt_diag's dry run: the standard level's third shape adds seconds, not a path.
    out = ok(torchrun("matmul_diag.py", "--dtype", "bf16", "--level", "quick", "--out", str(tmp / "matmul.json"),
                      cwd=tmp))
    data = json.loads((tmp / "matmul.json").read_text())
    variants = [r["variant"] for r in data["ranks"][0]["rows"]]
    assert variants == ["mamf", "settled", "mamf", "sustained"] and "written:" in out
    assert data["level"] == "quick"


def dry_gpt_diag(tmp: Path) -> None:
    out = ok(torchrun("gpt_diag.py", "--level", "quick", "--out", str(tmp / "gpt.json"), cwd=tmp))
    rows = json.loads((tmp / "gpt.json").read_text())["ranks"][0]["rows"]
    assert [r["variant"] for r in rows] == ["suite", "minimal", "minimal_noclip", "minimal_ddp"], rows
    assert all(r["tokens_per_s"] > 0 for r in rows) and "kinds_ms_per_step" in rows[1]["profile"]
    assert "written:" in out


def dry_plugin_overhead(tmp: Path) -> None:
    out = ok(script("plugin_overhead.py", "--ranks", "2", "--tests", "3", cwd=tmp))
    row = out.strip().splitlines()[-1].split()
    assert row[0] == "2" and len(row) == 5 and all(float(x) > 0 for x in row[1:]), out


FINDER = '''
import argparse, pathlib
p = argparse.ArgumentParser()
for a in ("--m", "--n", "--k"):
    p.add_argument(a, nargs="+")
p.add_argument("--dtype")
p.add_argument("--output_file")
a = p.parse_args()
pathlib.Path(a.output_file).write_text("median: 727.1 TFLOPS @ 4096x4096x8192 (MxNxK)\\n")
'''


def dry_session_tools(tmp: Path) -> None:
    profile = ok(script("session_tools.py", "profile", "--gpus", "1", "--gpu-name", "NVIDIA H100 80GB HBM3", "-o",
                        str(tmp / "t.yaml"), cwd=tmp)).strip()
    assert profile == "h100-sxm-80gb-1gpu"
    peak = ok(script("session_tools.py", "setting", "peak_bf16_tflops", "--thresholds", str(tmp / "t.yaml"),
                     "--profile", profile, cwd=tmp)).strip()
    assert float(peak) == 989
    assert "--m 4096 8192" in ok(script("session_tools.py", "mamf-args", "standard", cwd=tmp))
    finder = tmp / "mamf-finder.py"
    finder.write_text(FINDER)
    session = tmp / "session"
    # --out names a folder that does not exist yet (a new session's): it is made.
    ok(script("session_tools.py", "mamf", "--finder", str(finder), "--dtype", "bfloat16", "--gpus", "1", "--out",
              str(session / "mamf"), cwd=tmp))
    assert "727.1" in (session / "mamf" / "bf16-gpu0.txt").read_text()
    table = ok(script("session_tools.py", "table", str(session), cwd=tmp))
    assert "727.1" in table and (session / "summary.json").exists()
    results = tmp / "results.json"
    results.write_text(json.dumps({"started": "2026-11-25T12:00:10+00:00", "duration_s": 20.0, "verdict": "accept",
                                   "tests": [{"nodeid": "a.py::test_slow", "duration_s": 12.5, "outcome": "passed"},
                                             {"nodeid": "a.py::test_fast", "duration_s": 1.0, "outcome": "passed"}]}))
    t0 = 1795608000.0  # 2026-11-25T12:00:00Z: 10 s to start, 20 s of session, 5 s to exit
    timing = ok(script("session_tools.py", "timing", str(results), "--t0", str(t0), "--t1", str(t0 + 35), cwd=tmp))
    assert timing.startswith("wall 35.0 s = start 10.0 + session 20.0 + end 5.0")
    assert "12.5 s  passed   test_slow" in timing


def dry_gpu_contender(tmp: Path) -> None:
    out = ok(script("gpu_contender.py", "--seconds", "0.5", "--devices", "cpu", cwd=tmp))
    assert "bf16 256^3 matmuls on cpu" in out and "products, done" in out


def dry_health_time(tmp: Path) -> None:
    out = ok(script("health_time.py", "--fake-gpus", "8", "--repeats", "2", "--out", str(tmp / "h.json"), cwd=tmp))
    figures = json.loads((tmp / "h.json").read_text())
    assert [(r["gpus"], r["exit"], r["status"], r["profile"]) for r in figures["runs"]] == \
        [(8, 0, "healthy", "h100-sxm-80gb")] * 2, out
    assert all(r["wall_s"] > r["command_s"] > 0 for r in figures["runs"]) and figures["imports_s"] > 0
    assert "made-up node of 8 GPUs" in out and "wall per check: median" in out
    cpu = ok(script("health_time.py", "--profile", "cpu", "--repeats", "1", "--limit", "60", cwd=tmp))
    assert "profile cpu, 0 GPUs, could not run (exit 4)" in cpu  # nothing to check on a CPU machine: never healthy


DRY_RUNS = {"gpu_contender.py": dry_gpu_contender, "gpt_diag.py": dry_gpt_diag, "health_time.py": dry_health_time,
            "latency_diag.py": dry_latency_diag, "matmul_diag.py": dry_matmul_diag,
            "plugin_overhead.py": dry_plugin_overhead, "session_tools.py": dry_session_tools}


def test_every_benchmark_script_has_a_dry_run() -> None:
    scripts = sorted(p.name for p in BENCH.glob("*.py"))
    assert scripts == sorted(DRY_RUNS), f"benchmarks without a dry run here: {sorted(set(scripts) - set(DRY_RUNS))}"


@pytest.mark.parametrize("name", sorted(DRY_RUNS))
def test_benchmark_dry_run(tmp_path: Path, name: str) -> None:
    DRY_RUNS[name](tmp_path)
